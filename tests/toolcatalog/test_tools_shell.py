"""bash: approval by default, runs in the workspace, timeout, output cap, clean environment (RN-5)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from toolcatalog.builtins import BUILTINS, WorkspaceToolBox


def _approve_all(name, arguments):
    return True


@pytest.fixture
def box(tmp_path: Path) -> WorkspaceToolBox:
    return WorkspaceToolBox(tmp_path, approve=_approve_all)


@pytest.mark.req("RN-5")
def test_bash_requires_approval_by_default_and_does_not_run_unapproved(tmp_path):
    assert BUILTINS["bash"].requires_approval is True
    refused = WorkspaceToolBox(tmp_path).execute("bash", {"command": "touch ran.txt"})
    assert refused == {
        "ok": False,
        "error": "bash requires approval and this call was not approved; it did not run.",
        "approval_required": True,
    }
    assert not (tmp_path / "ran.txt").exists()


@pytest.mark.req("RN-5")
def test_an_operator_can_auto_approve_bash_by_setting(tmp_path, settings):
    settings.CC_TOOL_AUTO_APPROVE = ["bash"]
    assert WorkspaceToolBox(tmp_path).execute("bash", {"command": "echo hi"})["stdout"] == "hi\n"


@pytest.mark.req("RN-5")
def test_bash_runs_in_the_workspace_and_reports_exit_code_and_streams(box, tmp_path):
    (tmp_path / "sub").mkdir()
    done = box.execute("bash", {"command": "pwd; echo oops >&2; touch made.txt"})
    assert done["ok"] is True and done["exit_code"] == 0
    # The workspace is mounted at a fixed path in the sandbox (SB-1).
    assert done["stdout"] == "/workspace\n"
    assert done["stderr"] == "oops\n"
    assert (tmp_path / "made.txt").exists()
    assert box.execute("bash", {"command": "pwd", "cwd": "sub"})["stdout"] == "/workspace/sub\n"
    failed = box.execute("bash", {"command": "exit 3"})
    assert failed["ok"] is False and failed["exit_code"] == 3 and "code 3" in failed["error"]


@pytest.mark.req("RN-5")
def test_bash_cwd_cannot_leave_the_workspace(box, tmp_path):
    for cwd in ["..", "/tmp", "../.."]:
        observation = box.execute("bash", {"command": "touch escaped.txt", "cwd": cwd})
        assert observation["ok"] is False
        assert "exit_code" not in observation
    assert not (tmp_path.parent / "escaped.txt").exists()


@pytest.mark.req("RN-5")
def test_bash_is_killed_at_its_timeout_with_its_children(box, tmp_path):
    started = time.monotonic()
    observation = box.execute(
        "bash", {"command": "echo started; (sleep 30; touch late.txt) & sleep 30", "timeout_seconds": 1}
    )
    assert time.monotonic() - started < 10
    assert observation["ok"] is False
    assert observation["timed_out"] is True
    assert "within 1 s" in observation["error"]
    assert observation["stdout"] == "started\n"
    time.sleep(0.2)
    assert not (tmp_path / "late.txt").exists()


@pytest.mark.req("RN-5")
def test_bash_output_above_the_cap_is_counted_not_kept(box, settings):
    settings.CC_BASH_OUTPUT_CAP_BYTES = 2048
    observation = box.execute("bash", {"command": "head -c 100000 /dev/zero | tr '\\0' x"})
    assert observation["ok"] is True
    assert observation["stdout"] == "x" * 2048
    assert observation["stdout_bytes_omitted"] == 100000 - 2048
    assert "omitted" in observation["_note"]


@pytest.mark.req("RN-5")
def test_bash_does_not_see_the_servers_secrets(box, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:password@db/cc")
    observation = box.execute("bash", {"command": "env"})
    assert "sk-should-not-leak" not in observation["stdout"]
    assert "password" not in observation["stdout"]
    assert "HOME=" in observation["stdout"]


@pytest.mark.req("RN-5")
def test_bash_refuses_an_empty_command_and_a_timeout_out_of_range(box):
    assert "empty" in box.execute("bash", {"command": "   "})["error"]
    assert "timeout_seconds" in box.execute("bash", {"command": "true", "timeout_seconds": 0})["error"]


@pytest.mark.req("RN-5")
@pytest.mark.req("SP-9")
def test_a_command_too_long_for_one_argument_is_refused_clearly_and_one_just_short_runs(box, tmp_path):
    # QA: `echo {{step1.text}}` with a 4.5 MB result reached the kernel, which refused it, and the
    # call failed as "bash failed unexpectedly: OSError: [Errno 7] Argument list too long".
    refused = box.execute("bash", {"command": "echo " + "x" * 200_000})
    assert refused["ok"] is False
    assert "command is 200,005 bytes; a command line takes at most 131,071" in refused["error"]
    assert "write_file" in refused["error"] and "unexpectedly" not in refused["error"]
    longest = "echo " + "x" * (131_071 - len("echo ") - len(" > long.txt")) + " > long.txt"
    assert box.execute("bash", {"command": longest})["ok"] is True
    assert len((tmp_path / "long.txt").read_text()) == 131_071 - len("echo ") - len(" > long.txt") + 1


@pytest.mark.req("RN-5")
def test_a_background_child_holding_the_pipes_does_not_hang_the_call(box, tmp_path):
    started = time.monotonic()
    observation = box.execute("bash", {"command": "echo hi; (sleep 30; touch late.txt) &"})
    assert time.monotonic() - started < 10
    assert observation["ok"] is True and observation["stdout"] == "hi\n"
    time.sleep(0.2)
    assert not (tmp_path / "late.txt").exists()


@pytest.mark.req("SP-2")
def test_text_output_cut_at_the_cap_inside_a_character_stays_text(box):
    # "é\n" is 3 bytes: the 1 MiB cap falls after the first byte of an "é". That partial character
    # is left out; it must not make the whole output look like bytes that are not UTF-8.
    done = box.execute("bash", {"command": "yes é | head -c 1500000"})
    stdout = done["stdout"]
    stdout.encode("utf-8")  # no lone surrogate anywhere
    assert stdout.endswith("é\n") and done["stdout_bytes_omitted"] > 0


@pytest.mark.req("RN-5")
@pytest.mark.req("TD-5")
def test_a_misspelt_argument_is_refused_with_the_names_the_tool_takes_and_nothing_runs(box, tmp_path):
    # `timeout` for `timeout_seconds` was dropped in silence: the command ran, killed at the default 30 s.
    refused = box.execute("bash", {"command": "touch ran.txt", "timeout": 600})
    assert refused["ok"] is False
    assert "'timeout' was unexpected" in refused["error"]
    assert "did you mean 'timeout_seconds' for 'timeout'?" in refused["error"]
    assert "It takes: command, " in refused["error"]
    assert not (tmp_path / "ran.txt").exists()
