"""File tools in the workspace: read, write, edit, list, search, glob (RN-5)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolcatalog import quota
from toolcatalog.builtins import BUILTINS, WorkspaceToolBox
from toolcatalog.tools.base import ToolContext, ToolFailure
from toolcatalog.tools.search import MAX_MATCH_LINES


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "secret.txt").write_text("top secret\n")
    return secret


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def box(workspace: Path) -> WorkspaceToolBox:
    return WorkspaceToolBox(workspace)


def _escape_calls(kind: str, outside: Path) -> list[tuple[str, dict]]:
    """One call per tool that takes a path, pointed out of the workspace the way `kind` says."""
    target = {"dotdot": "../outside/secret.txt", "absolute": str(outside / "secret.txt"), "symlink": "link/secret.txt"}[
        kind
    ]
    directory = {"dotdot": "../outside", "absolute": str(outside), "symlink": "link"}[kind]
    return [
        ("read_file", {"path": target}),
        ("write_file", {"path": target, "content": "pwned"}),
        ("write_file", {"path": target, "content": "pwned", "mode": "append"}),
        ("edit_file", {"path": target, "old_string": "top", "new_string": "pwned"}),
        ("list_dir", {"path": directory}),
        ("search_files", {"pattern": "secret", "path": directory}),
        ("glob", {"pattern": "*.txt", "path": directory}),
        ("submit_report", {"title": "t", "summary": "s", "status": "complete", "artifacts": [target]}),
    ]


@pytest.mark.req("RN-5")
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_no_file_tool_reaches_outside_the_workspace(kind, box, workspace, outside):
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    for name, arguments in _escape_calls(kind, outside):
        observation = box.execute(name, arguments)
        assert observation["ok"] is False, (name, arguments, observation)
        assert "workspace" in observation["error"] or "absolute" in observation["error"], observation
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.req("RN-5")
def test_a_symlinked_file_pointing_out_is_refused_and_listed_as_a_symlink(box, workspace, outside):
    (workspace / "escape.txt").symlink_to(outside / "secret.txt")
    assert box.execute("read_file", {"path": "escape.txt"})["ok"] is False
    listing = box.execute("list_dir", {})
    assert listing["entries"] == [
        {"name": "escape.txt", "type": "symlink", "size": None, "modified": listing["entries"][0]["modified"]}
    ]
    # Neither a content search nor a glob follows it out.
    assert box.execute("search_files", {"pattern": "secret"})["total_matches"] == 0
    assert box.execute("glob", {"pattern": "**/*"})["paths"] == []


@pytest.mark.req("RN-5")
def test_glob_pattern_cannot_climb_or_be_absolute(box, outside):
    assert "climbs out" in box.execute("glob", {"pattern": "../outside/*.txt"})["error"]
    assert "absolute" in box.execute("glob", {"pattern": f"{outside}/*.txt"})["error"]


@pytest.mark.req("RN-5")
def test_read_file_numbers_lines_and_pages_with_offset_and_limit(box, workspace):
    (workspace / "notes.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    page = box.execute("read_file", {"path": "notes.txt", "offset": 4, "limit": 3})
    assert page["ok"] is True
    assert page["content"].splitlines() == ["     4\tline 4", "     5\tline 5", "     6\tline 6"]
    assert page["total_lines"] == 10
    assert page["next_offset"] == 7
    last = box.execute("read_file", {"path": "notes.txt", "offset": 9})
    assert last["lines_returned"] == 2
    assert "next_offset" not in last


@pytest.mark.req("RN-5")
def test_read_file_refuses_binary_files_and_offsets_past_the_end(box, workspace):
    (workspace / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    refused = box.execute("read_file", {"path": "image.png"})
    assert refused["ok"] is False
    assert "binary" in refused["error"]
    assert "image/png" in refused["error"]
    assert "11 bytes" in refused["error"]
    (workspace / "short.txt").write_text("one\n")
    assert "past the end" in box.execute("read_file", {"path": "short.txt", "offset": 5})["error"]
    assert "does not exist" in box.execute("read_file", {"path": "missing.txt"})["error"]


@pytest.mark.req("RN-5")
def test_bad_arguments_are_refused_with_the_field_named(box):
    observation = box.execute("read_file", {"path": "x.txt", "offset": 0})
    assert observation["ok"] is False
    assert "offset" in observation["error"]
    assert "path" in box.execute("write_file", {"content": "x"})["error"]
    assert "mode" in box.execute("write_file", {"path": "x", "content": "x", "mode": "clobber"})["error"]
    assert "no tool named" in box.execute("rm_rf", {})["error"]


@pytest.mark.req("RN-5")
def test_write_file_overwrites_creates_only_and_appends(box, workspace):
    created = box.execute("write_file", {"path": "deep/dir/a.txt", "content": "one\n"})
    assert created["ok"] is True and created["created"] is True
    assert box.execute("write_file", {"path": "deep/dir/a.txt", "content": "two\n", "mode": "append"})["ok"]
    assert (workspace / "deep/dir/a.txt").read_text() == "one\ntwo\n"
    refused = box.execute("write_file", {"path": "deep/dir/a.txt", "content": "three\n", "mode": "create_only"})
    assert refused["ok"] is False
    assert "already exists" in refused["error"]
    assert (workspace / "deep/dir/a.txt").read_text() == "one\ntwo\n"
    assert box.execute("write_file", {"path": "deep/dir/a.txt", "content": "three\n"})["created"] is False
    assert (workspace / "deep/dir/a.txt").read_text() == "three\n"
    assert "not a regular file" in box.execute("write_file", {"path": "deep", "content": "x"})["error"]


@pytest.mark.req("RN-5")
def test_edit_file_replaces_a_unique_exact_string_and_shows_a_diff(box, workspace):
    (workspace / "app.py").write_text("def f():\n    return 1\n")
    edited = box.execute("edit_file", {"path": "app.py", "old_string": "return 1", "new_string": "return 2"})
    assert edited["ok"] is True
    assert edited["replacements"] == 1
    assert "-    return 1" in edited["diff"] and "+    return 2" in edited["diff"]
    assert (workspace / "app.py").read_text() == "def f():\n    return 2\n"


@pytest.mark.req("RN-5")
def test_edit_file_refuses_ambiguous_missing_and_no_op_edits_and_leaves_the_file(box, workspace):
    original = "x = 1\nx = 1\n"
    (workspace / "dup.py").write_text(original)
    ambiguous = box.execute("edit_file", {"path": "dup.py", "old_string": "x = 1", "new_string": "x = 2"})
    assert ambiguous["ok"] is False and "occurs 2 times" in ambiguous["error"]
    missing = box.execute("edit_file", {"path": "dup.py", "old_string": "  x = 1", "new_string": "x = 2"})
    assert missing["ok"] is False and "not found" in missing["error"]
    same = box.execute("edit_file", {"path": "dup.py", "old_string": "x = 1", "new_string": "x = 1"})
    assert same["ok"] is False and "identical" in same["error"]
    assert (workspace / "dup.py").read_text() == original
    everywhere = box.execute(
        "edit_file", {"path": "dup.py", "old_string": "x = 1", "new_string": "x = 2", "replace_all": True}
    )
    assert everywhere["replacements"] == 2
    assert (workspace / "dup.py").read_text() == "x = 2\nx = 2\n"


@pytest.mark.req("RN-5")
def test_list_dir_keeps_the_entries_shape_descends_and_skips_vcs_folders(box, workspace):
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("print(1)\n")
    (workspace / ".git").mkdir()
    (workspace / "README.md").write_text("hi\n")
    (workspace / "junk.log").write_text("x")
    flat = box.execute("list_dir", {"path": ".", "ignore": ["*.log"]})
    assert [(e["name"], e["type"], e["size"]) for e in flat["entries"]] == [
        ("README.md", "file", 3),
        ("src", "dir", None),
    ]
    assert flat["skipped"] == [".git"]
    deep = box.execute("list_dir", {"depth": 2})
    src = next(e for e in deep["entries"] if e["name"] == "src")
    assert [(e["name"], e["size"]) for e in src["entries"]] == [("main.py", 9)]
    assert "not a directory" in box.execute("list_dir", {"path": "README.md"})["error"]


@pytest.mark.req("RN-5")
def test_search_files_finds_lines_files_and_counts_with_context(box, workspace):
    (workspace / "a.py").write_text("import os\nTODO: one\nx = 1\n")
    (workspace / "b.md").write_text("TODO: two\n")
    (workspace / "blob.bin").write_bytes(b"TODO\x00\x01")
    lines = box.execute("search_files", {"pattern": r"TODO:\s+\w+", "context_lines": 1})
    assert [(m["path"], m["line"]) for m in lines["matches"]] == [("a.py", 2), ("b.md", 1)]
    assert lines["matches"][0]["before"] == ["import os"] and lines["matches"][0]["after"] == ["x = 1"]
    assert box.execute("search_files", {"pattern": "TODO", "include": "*.py", "output": "files"})["files"] == ["a.py"]
    assert box.execute("search_files", {"pattern": "TODO", "output": "count"})["counts"] == {"a.py": 1, "b.md": 1}
    invalid = box.execute("search_files", {"pattern": "("})
    assert invalid["ok"] is False and "regular expression" in invalid["error"]
    expanding = box.execute("search_files", {"pattern": "(?:TODO{1000}){1000}"})
    assert expanding["ok"] is False and "would write out up to 1,00" in expanding["error"]


@pytest.mark.req("RN-5")
def test_search_files_says_how_many_matches_it_did_not_list(box, workspace):
    (workspace / "many.txt").write_text("hit\n" * (MAX_MATCH_LINES + 7))
    found = box.execute("search_files", {"pattern": "hit"})
    assert len(found["matches"]) == MAX_MATCH_LINES
    assert found["total_matches"] == MAX_MATCH_LINES + 7
    assert found["matches_omitted"] == 7


@pytest.mark.req("RN-5")
def test_glob_matches_names_newest_first(box, workspace):
    (workspace / "docs").mkdir()
    for index, name in enumerate(["docs/old.md", "docs/new.md", "top.md", "code.py"]):
        path = workspace / name
        path.write_text(name)
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    found = box.execute("glob", {"pattern": "**/*.md"})
    assert found["paths"] == ["top.md", "docs/new.md", "docs/old.md"]
    assert box.execute("glob", {"pattern": "*.md", "path": "docs"})["paths"] == ["docs/new.md", "docs/old.md"]


@pytest.mark.req("RN-5")
def test_every_builtin_uses_the_reference_catalog_definition():
    import json

    reference = {
        tool["name"]: tool
        for tool in json.loads((Path(__file__).parents[2] / "toolcatalog/tools/definitions.json").read_text())["tools"]
    }
    assert set(BUILTINS) == set(reference)
    for name, tool in BUILTINS.items():
        assert tool.definition() == {
            "name": name,
            "description": reference[name]["description"],
            "input_schema": reference[name]["input_schema"],
        }
    assert BUILTINS["bash"].requires_approval is True
    assert BUILTINS["bash"].catalog_record()["requires_approval"] is True


@pytest.mark.req("RN-5")
def test_walking_the_workspace_never_descends_a_symlinked_directory_that_points_out(box, workspace, outside):
    (workspace / "src").mkdir()
    (workspace / "src" / "own.txt").write_text("secret of our own\n")
    (workspace / "src" / "deep").symlink_to(outside, target_is_directory=True)
    listing = box.execute("list_dir", {"depth": 5})
    src = next(entry for entry in listing["entries"] if entry["name"] == "src")
    assert [(entry["name"], entry["type"]) for entry in src["entries"]] == [("deep", "symlink"), ("own.txt", "file")]
    assert "entries" not in src["entries"][0]
    found = box.execute("search_files", {"pattern": "secret"})
    assert found["total_matches"] == 1 and "top secret" not in str(found)
    assert box.execute("glob", {"pattern": "**/*.txt"})["paths"] == ["src/own.txt"]
    assert box.execute("read_file", {"path": "src/deep/secret.txt"})["ok"] is False


@pytest.mark.req("RN-5")
def test_writing_through_a_dangling_symlink_cannot_create_a_file_outside(box, workspace, outside):
    (workspace / "dangling").symlink_to(outside / "created-by-model.txt")
    refused = box.execute("write_file", {"path": "dangling", "content": "x"})
    assert refused["ok"] is False and "outside the workspace" in refused["error"]
    assert not (outside / "created-by-model.txt").exists()


@pytest.mark.req("RN-5")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    relative=st.lists(
        st.sampled_from(["a", "b", ".", "..", "/", "\\", "~", "$HOME", " ", "\x00", "link"]), max_size=12
    ).map("".join)
)
def test_any_path_string_resolves_inside_the_workspace_or_is_refused(relative, workspace, outside):
    link = workspace / "link"
    if not link.is_symlink():
        link.symlink_to(outside, target_is_directory=True)
    context = ToolContext(workspace)
    try:
        with context.located(relative) as located:
            resolved = (workspace.resolve() / located.relative).resolve()
    except ToolFailure:
        return
    assert resolved == workspace.resolve() or workspace.resolve() in resolved.parents


@pytest.mark.req("RN-5")
@pytest.mark.req("SB-1")
def test_a_link_swapped_in_while_the_tools_run_never_takes_a_read_or_a_write_outside(box, workspace, outside):
    # QA, as a user of a root worker: a sandboxed loop swapping directory `d` between a real one and
    # a link out made read_file return the server's SECRET_KEY (2 of 45 calls) and write_file create
    # a root-owned file outside (1 of 30). The check and the open were two lookups of one name.
    (workspace / "d").mkdir()
    (workspace / "d" / "secret.txt").write_text("harmless\n")
    # Another process, as the sandboxed command is: `d` is a real folder, then a link out, then
    # the folder again. A tool that made `d` while it was missing has its folder removed.
    swapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, shutil, sys\n"
            "os.chdir(sys.argv[1])\n"
            "def attempt(step):\n"
            "    try:\n"
            "        step()\n"
            "    except OSError:\n"
            "        shutil.rmtree('d', ignore_errors=True)\n"
            "while True:\n"
            "    attempt(lambda: os.rename('d', 'd_away'))\n"
            "    attempt(lambda: os.symlink(sys.argv[2], 'd'))\n"
            "    attempt(lambda: os.unlink('d'))\n"
            "    attempt(lambda: os.rename('d_away', 'd'))\n",
            str(workspace),
            str(outside),
        ]
    )
    outputs = []
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            outputs.append(box.execute("read_file", {"path": "d/secret.txt"}))
            outputs.append(box.execute("write_file", {"path": "d/pwned.txt", "content": "pwned"}))
            outputs.append(box.execute("search_files", {"pattern": "secret", "path": "d"}))
            outputs.append(box.execute("list_dir", {"path": "d"}))
    finally:
        swapper.kill()
        swapper.wait()
    assert not [output for output in outputs if "top secret" in str(output)]
    assert sorted(path.name for path in outside.iterdir()) == ["secret.txt"]
    # The swap did happen under the calls: some of them met the link and were refused.
    assert any(not output["ok"] for output in outputs) and any(output["ok"] for output in outputs)


@pytest.mark.req("RN-5")
def test_a_relative_link_that_stays_inside_is_followed(box, workspace):
    (workspace / "docs").mkdir()
    (workspace / "docs" / "notes.txt").write_text("inside\n")
    (workspace / "alias.txt").symlink_to("docs/notes.txt")
    (workspace / "docs" / "up").symlink_to("..")
    read = box.execute("read_file", {"path": "alias.txt"})
    assert read["ok"] and read["content"] == "     1\tinside" and read["path"] == "docs/notes.txt"
    assert box.execute("read_file", {"path": "docs/up/docs/notes.txt"})["content"] == "     1\tinside"
    written = box.execute("write_file", {"path": "docs/up/new/file.txt", "content": "made"})
    assert written["ok"] and (workspace / "new" / "file.txt").read_text() == "made"


@pytest.mark.req("SB-3")
def test_a_tree_deeper_than_path_max_is_measured_and_leaves_the_tools_working(box, workspace):
    # QA: 20 nested folders of 250 characters (5,000 > PATH_MAX) failed every later bash and
    # write_file of the user, in all her conversations: "File name too long" from the quota walk.
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(20):
        os.mkdir("d" * 250, dir_fd=fd)
        inner = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    deep = os.open("deep.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
    os.write(deep, b"x" * 100_000)
    os.close(deep)
    os.close(fd)
    assert quota.tree_bytes(workspace) >= 100_000
    assert box.execute("write_file", {"path": "top.txt", "content": "still works"})["ok"]
    assert box.execute("glob", {"pattern": "**/deep.txt"})["count"] == 1
    assert box.execute("search_files", {"pattern": "works"})["total_matches"] == 1
    assert box.execute("list_dir", {"path": ".", "depth": 3})["ok"]


@pytest.mark.req("SB-4")
def test_read_file_cuts_a_huge_line_and_counts_the_lines_past_the_page_without_keeping_them(box, workspace):
    (workspace / "minified.js").write_text("a" * 3_000_000 + "\nshort\n" + "tail\n" * 50_000)
    read = box.execute("read_file", {"path": "minified.js", "limit": 2})
    assert read["total_lines"] == 50_002 and read["next_offset"] == 3
    first, second = read["content"].split("\n")
    assert first == "     1\t" + "a" * 2000 + " [... 2998000 more bytes on this line]"
    assert second == "     2\tshort"


@pytest.mark.req("SB-4")
def test_a_fifo_is_refused_without_holding_the_call(box, workspace):
    os.mkfifo(workspace / "pipe")
    for name, arguments in [
        ("read_file", {"path": "pipe"}),
        ("write_file", {"path": "pipe", "content": "x"}),
        ("edit_file", {"path": "pipe", "old_string": "a", "new_string": "b"}),
    ]:
        refused = box.execute(name, arguments)
        assert refused["ok"] is False and "not a regular file" in refused["error"], (name, refused)
