"""Reproducible installs (OP-5): uv.lock pins every package with hashes, and every install path uses it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv", path=str(ROOT / ".venv" / "bin")) or shutil.which("uv")


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _uv_check(folder: Path) -> subprocess.CompletedProcess[str]:
    assert UV is not None, "uv is not installed (make install puts it in .venv/bin)"
    # Offline: the check compares the lock with pyproject.toml; nothing needs the network.
    return subprocess.run([UV, "lock", "--check", "--offline"], cwd=folder, capture_output=True, text=True, timeout=60)


@pytest.mark.req("OP-5")
def test_the_lock_pins_every_package_with_hashes_and_fails_the_check_when_pyproject_changes(tmp_path):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    packages = {package["name"]: package for package in lock["package"]}
    direct = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    assert {_name(r) for r in direct} <= set(packages), "a dependency of pyproject.toml is not in uv.lock"
    for name, package in packages.items():
        if name == "controlcenter":
            continue
        assert re.fullmatch(r"\d[\w.+!-]*", package["version"]), name
        files = [*package.get("wheels", []), *([package["sdist"]] if "sdist" in package else [])]
        assert files and all(f["hash"].startswith("sha256:") for f in files), f"{name} is not pinned by hash"

    checked = _uv_check(ROOT)
    assert checked.returncode == 0, checked.stderr
    # The check CI runs (make lint -> lock-check) fails once pyproject.toml and the lock disagree.
    shutil.copy(ROOT / "uv.lock", tmp_path / "uv.lock")
    changed = (ROOT / "pyproject.toml").read_text().replace('  "whitenoise>=6.6",\n', "", 1)
    assert changed != (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(changed)
    stale = _uv_check(tmp_path)
    # uv tells a stale lock by resolving again. Offline, on a machine whose uv cache lacks some
    # platform's metadata (a fresh one), that resolution stops first ("No solution found"); the
    # check fails either way, which is what stops CI.
    assert stale.returncode != 0, stale.stderr
    assert "needs to be updated" in stale.stderr or "No solution found" in stale.stderr, stale.stderr


@pytest.mark.req("OP-5")
def test_make_ci_and_the_dockerfile_install_from_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert "uv sync --frozen" in makefile and "uv lock --check" in makefile and "uv lock --upgrade" in makefile
    assert re.search(r"^lint: .*lock-check", makefile, re.MULTILINE), "make test/lint must check the lock"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make install" in ci and "make test" in ci
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "uv export --frozen" in dockerfile and "--require-hashes" in dockerfile
