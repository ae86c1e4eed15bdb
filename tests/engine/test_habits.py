"""AR-3: `make lint`, `make test` and the pre-commit hooks run the same checks, mypy over every package.

Read from the Makefile (`make -n` prints the recipes without running them) and the config files, so
the test costs milliseconds; running the checks themselves is `make lint`'s job.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "agents", "conversations", "scratchpad", "toolcatalog", "controlcenter", "bench", "tests")
CHECKS = {
    ".venv/bin/ruff check .",
    ".venv/bin/ruff format --check .",
    ".venv/bin/lint-imports",
    # No arguments: mypy checks the packages [tool.mypy] lists.
    ".venv/bin/mypy",
}


def _dry_run(target: str) -> list[str]:
    printed = subprocess.run(
        ["make", "-n", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [line.strip() for line in printed.stdout.splitlines()]


@pytest.mark.req("AR-3")
def test_make_lint_runs_every_check_and_make_test_runs_lint_first():
    assert set(_dry_run("lint")) >= CHECKS
    test = _dry_run("test")
    pytest_line = next(i for i, line in enumerate(test) if "-m pytest" in line)
    assert set(test[:pytest_line]) >= CHECKS


@pytest.mark.req("AR-3")
def test_mypy_covers_every_package_strictly_on_the_engine_only():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name not in ("tests", "bench")}
    assert "engine" in packages and "agents" in packages
    assert set(config["packages"]) == packages
    assert "mypy_django_plugin.main" in config["plugins"]
    # `strict = true` in an override would make every module strict (python/mypy#11401).
    assert "strict" not in config
    (engine,) = config["overrides"]
    assert set(engine["module"]) == {"engine", "engine.*"} and "strict" not in engine
    assert engine["disallow_untyped_defs"] and engine["disallow_any_generics"] and engine["warn_return_any"]


@pytest.mark.req("AR-3")
def test_the_pre_commit_hooks_run_the_same_checks():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    # A hook is given the changed files where make lint passes ".".
    commands = {hook["entry"].replace(" --force-exclude", "") for hook in hooks}
    assert {check.removesuffix(" .") for check in CHECKS} <= commands
    # Given files, mypy would check only those, not the packages [tool.mypy] lists.
    (mypy,) = [hook for hook in hooks if hook["entry"] == ".venv/bin/mypy"]
    assert mypy["pass_filenames"] is False


# A path into tests/ as the docs and comments cite it: a module, optionally with `::test_name`.
TEST_PATH = re.compile(r"(?<![\w/.])tests/(?:[a-z_]+/)*test_[a-z0-9_]+\.py(?:::[A-Za-z0-9_]+)?")


@pytest.mark.req("AR-4")
def test_every_test_the_docs_and_the_code_cite_exists():
    """The tests moved into folders by feature once and left 36 citations pointing nowhere."""
    cited: dict[str, set[str]] = {}
    sources = [*ROOT.glob("docs/*.md"), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    sources += [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    for source in sources:
        for found in TEST_PATH.findall(source.read_text(encoding="utf-8")):
            cited.setdefault(found, set()).add(str(source.relative_to(ROOT)))
    assert len(cited) > 40  # the pattern sees the citations the docs are full of
    missing = {}
    for citation, where in cited.items():
        module, _, name = citation.partition("::")
        path = ROOT / module
        if not path.is_file() or (name and not re.search(rf"\bdef {name}\(", path.read_text(encoding="utf-8"))):
            missing[citation] = sorted(where)
    assert not missing, missing
