"""docs/requirements.md explains every requirement ID the repository cites (AR-4)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

FAMILIES = ("SP", "TD", "CH", "RN", "SB", "OP", "UX", "MC", "LM", "EM", "TS", "AR")
CITED_ID = re.compile(r"\b(?:" + "|".join(FAMILIES) + r")-[0-9]+\b")
# An entry is a list item opening with the bold ID; a mere mention in another entry does not count.
DOC_ENTRY = re.compile(r"^- \*\*([A-Z]+-[0-9]+)\*\*", re.MULTILINE)
REQ_MARK = re.compile(r"mark\.req\(([^)]*)\)")
QUOTED = re.compile(r"""["']([^"']*)["']""")
SCANNED_SUFFIXES = {".py", ".md", ".html", ".js"}
# Environments, runtime data and build output hold copies or third-party text, not our citations.
SKIPPED_DIRS = {".git", ".venv", "var", "node_modules", "build", "dist", "__pycache__"}


def _repo_root() -> Path:
    # Found by walking up, so the test keeps working when tests move into feature folders.
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file() and (parent / "docs").is_dir():
            return parent
    raise AssertionError("repository root (pyproject.toml beside docs/) not found above this test")


ROOT = _repo_root()
DOC = ROOT / "docs" / "requirements.md"


def _source_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts):
            continue
        if path.suffix in SCANNED_SUFFIXES and path.is_file() and path != DOC:
            files.append(path)
    return files


def _documented() -> set[str]:
    entries = DOC_ENTRY.findall(DOC.read_text(encoding="utf-8"))
    duplicates = sorted({e for e in entries if entries.count(e) > 1})
    assert not duplicates, f"docs/requirements.md has more than one entry for {duplicates}"
    return set(entries)


@pytest.mark.req("AR-4")
def test_every_cited_requirement_id_has_an_entry():
    documented = _documented()
    missing: dict[str, list[str]] = {}
    for path in _source_files():
        for req_id in set(CITED_ID.findall(path.read_text(encoding="utf-8", errors="replace"))):
            if req_id not in documented:
                missing.setdefault(req_id, []).append(str(path.relative_to(ROOT)))
    assert not missing, "requirement IDs cited but not explained in docs/requirements.md: " + "; ".join(
        f"{req_id} (in {', '.join(sorted(paths)[:3])})" for req_id, paths in sorted(missing.items())
    )


@pytest.mark.req("AR-4")
def test_every_req_marker_names_a_documented_requirement():
    documented = _documented()
    unknown: dict[str, set[str]] = {}
    for path in _source_files():
        if path.suffix != ".py":
            continue
        for arguments in REQ_MARK.findall(path.read_text(encoding="utf-8")):
            for req_id in QUOTED.findall(arguments):
                if req_id not in documented:
                    unknown.setdefault(req_id, set()).add(str(path.relative_to(ROOT)))
    assert not unknown, "pytest.mark.req names IDs that docs/requirements.md does not define: " + "; ".join(
        f"{req_id!r} (in {', '.join(sorted(paths))})" for req_id, paths in sorted(unknown.items())
    )


@pytest.mark.req("AR-4")
def test_the_checks_see_citations_and_markers():
    # Guards the two tests above against passing vacuously (a wrong root, a broken pattern).
    cited = set()
    marked = set()
    for path in _source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        cited.update(CITED_ID.findall(text))
        for arguments in REQ_MARK.findall(text):
            marked.update(QUOTED.findall(arguments))
    assert {"SP-1", "TD-11", "CH-5", "RN-4"} <= cited
    assert "AR-4" in marked and len(marked) > 20
    assert {"SP-12", "TD-15", "CH-14", "RN-5", "SB-6", "OP-6", "UX-8", "MC-5", "LM-3", "EM-5", "TS-4", "AR-4"} <= (
        _documented()
    )
