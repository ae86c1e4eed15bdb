"""The console script's shape and the settings refusing a bad environment at start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import django
import pytest

from controlcenter.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = str(Path(sys.executable).parent / "controlcenter")


def test_serve_and_worker_accept_tool_deferral_on_or_off():
    parser = build_parser()
    assert parser.parse_args(["serve", "--tool-deferral=off"]).tool_deferral == "off"
    assert parser.parse_args(["worker", "--tool-deferral", "on"]).tool_deferral == "on"
    assert parser.parse_args(["serve"]).tool_deferral is None


def test_tool_deferral_refuses_other_values(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--tool-deferral=maybe"])
    assert "must be 'on' or 'off'" in capsys.readouterr().err


def test_manage_passthrough_runs_a_django_command_with_djangos_own_options():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def manage(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CONSOLE_SCRIPT, "manage", *argv], cwd=ROOT, env=env, capture_output=True, text=True)

    checked = manage("check", "--verbosity", "0", "--settings", "controlcenter.settings")
    assert checked.returncode == 0, checked.stderr
    version = manage("--version")
    assert (version.returncode, version.stdout.strip()) == (0, django.get_version())
    helped = manage("--help")
    assert helped.returncode == 0, helped.stderr
    # What the help says to type next works, and names the program as it is run.
    assert "Type 'controlcenter manage help <subcommand>'" in helped.stdout
    command_help = manage("help", "catalog")
    assert command_help.returncode == 0, command_help.stderr
    assert command_help.stdout.startswith("usage: controlcenter manage catalog")


def test_a_process_that_never_connects_to_an_mcp_server_or_serves_mcp_does_not_load_the_mcp_sdk():
    """Every worker and command loads the catalog's services at start, and every web process the ASGI
    app with /mcp; the MCP SDK costs 0.7 s of CPU to import as a client and 1.2 s as a server, so only
    the code that connects to a server, or a process's first /mcp request, loads it."""
    code = (
        "import sys, django; django.setup()\n"
        "from toolcatalog import services, toolbox\n"
        "from agents import tasks\n"
        "import controlcenter.asgi\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types', 'httpx2'}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "controlcenter.settings"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("CC_PROVIDER", "gemini", "CC_PROVIDER='gemini' is not one of"),
        ("CC_SERVER_TOOL_DEFERRAL", "nope", "must be 'on' or 'off'"),
        ("DATABASE_URL", "mysql://x/y", "scheme 'mysql'"),
        ("CC_MODELS", "offline-2=gemini", "CC_MODELS has 'offline-2=gemini'; write NAME or NAME=PROVIDER"),
        ("CC_MODELS", "=offline", "CC_MODELS has '=offline'"),
        ("CC_MODELS", "offline-1=openai", "CC_MODELS names 'offline-1' with two providers"),
        ("CC_MODELS", "a,,b", "has an empty item"),
        ("CC_TOOL_ACTION_LIMITS", "bash=\u00b2", "CC_TOOL_ACTION_LIMITS has 'bash=\u00b2'; write NAME=N"),
        ("CC_TOOL_ACTION_LIMITS", "bash=0", "write NAME=N with N at least 1"),
        ("CC_COMPACT_AT_PERCENT", "150", "CC_COMPACT_AT_PERCENT=150 is above the maximum of 99."),
        ("CC_COMPACT_TO_PERCENT", "90", "CC_COMPACT_TO_PERCENT=90 must be below CC_COMPACT_AT_PERCENT=80."),
        ("CC_LOCAL_MODEL_PORT", "70000", "CC_LOCAL_MODEL_PORT=70000 is above the maximum of 65535."),
    ],
)
def test_a_bad_environment_stops_the_process_with_a_clear_message(variable, value, message, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CC_VAR_DIR": str(tmp_path), variable: value}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode != 0
    # The message alone, not after a traceback through Django's settings import.
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert message in result.stderr


def test_processes_starting_together_on_a_fresh_install_share_one_whole_secret_key(tmp_path):
    # CI's fresh clone: mypy's parallel workers each load the settings, and one read the generated
    # key file after another process had created it but before it was written ("The SECRET_KEY
    # setting must not be empty"). Eight processes released at the same instant; without the fix
    # one in three such starts failed here.
    start = time.time() + 3
    code = (
        f"import time\nwhile time.time() < {start}: pass\nfrom django.conf import settings\nprint(settings.SECRET_KEY)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "SECRET_KEY_FILE")}
    env.update(PYTHONPATH=str(ROOT), CC_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="controlcenter.settings")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(8)
    ]
    answers = [process.communicate(timeout=60) for process in processes]
    keys = {out.strip() for out, _ in answers}
    assert len(keys) == 1 and len(next(iter(keys))) > 50, [err[-300:] for _, err in answers]
    assert not list(tmp_path.glob(".secret_key.*"))  # each process's draft is gone


def test_a_compaction_trigger_set_alone_brings_its_target_below_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CC_VAR_DIR": str(tmp_path), "CC_COMPACT_AT_PERCENT": "40"}
    env.pop("CC_COMPACT_TO_PERCENT", None)
    code = "from django.conf import settings; print(settings.CC_COMPACT_AT_PERCENT, settings.CC_COMPACT_TO_PERCENT)"
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    # The default's proportion (80 -> 50): 40 -> 25, where a fixed 50 refused the trigger alone.
    assert result.stdout.strip().splitlines()[-1] == "40 25", result.stderr


def test_the_console_script_stops_on_a_bad_environment_with_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CC_VAR_DIR": str(tmp_path), "CC_RUN_MAX_ACTIONS": "abc"}
    for command in (["manage", "check"], ["serve", "--port", "1"], ["worker"]):
        result = subprocess.run([CONSOLE_SCRIPT, *command], cwd=ROOT, env=env, capture_output=True, text=True)
        assert (result.returncode, result.stderr) == (
            1,
            "controlcenter: CC_RUN_MAX_ACTIONS='abc' is not an integer.\n",
        ), command


def test_only_one_of_database_and_redis_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(PYTHONPATH=str(ROOT), CC_VAR_DIR=str(tmp_path), DATABASE_URL="postgres://u@h/db")
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "Set both DATABASE_URL and REDIS_URL" in result.stderr


def test_anthropic_provider_without_a_key_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env.update(PYTHONPATH=str(ROOT), CC_VAR_DIR=str(tmp_path), CC_PROVIDER="anthropic")
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "needs ANTHROPIC_API_KEY" in result.stderr


def test_models_offered_name_their_providers_and_each_provider_needs_its_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "CC_MODEL", "CC_PROVIDER"))}
    env.update(PYTHONPATH=str(ROOT), CC_VAR_DIR=str(tmp_path), CC_MODELS="offline-2, claude-sonnet-4-5=anthropic")
    show = "from django.conf import settings; print(settings.CC_MODELS)"
    command = [sys.executable, "manage.py", "shell", "-c", show]
    refused = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert refused.returncode != 0
    assert "Provider anthropic (CC_PROVIDER or CC_MODELS) needs ANTHROPIC_API_KEY" in refused.stderr
    env.update(ANTHROPIC_API_KEY="sk-test", ANTHROPIC_BASE_URL="http://127.0.0.1:8765")
    offered = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert offered.returncode == 0, offered.stderr
    assert offered.stdout.strip().splitlines()[-1] == (
        "{'offline-1': 'offline', 'offline-2': 'offline', 'claude-sonnet-4-5': 'anthropic'}"
    )


@pytest.mark.req("RN-1")
def test_several_web_processes_are_refused_in_embedded_mode(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PYTHONPATH=str(ROOT), CC_VAR_DIR=str(tmp_path), CC_WEB_WORKERS="2")
    result = subprocess.run(
        [sys.executable, "-m", "controlcenter.cli", "serve", "--port", "1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "CC_WEB_WORKERS above 1 needs services mode" in result.stderr
    assert build_parser().parse_args(["serve", "--workers", "3"]).workers == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", "--concurrency", "0"], "argument --concurrency: must be at least 1, not 0"),
        (["worker", "--concurrency", "-2"], "argument --concurrency: must be at least 1, not -2"),
        (["worker", "--concurrency", "four"], "argument --concurrency: 'four' is not a whole number"),
        (["serve", "--workers", "0"], "argument --workers: must be at least 1, not 0"),
        (["serve", "--port", "99999"], "argument --port: must be at most 65535, not 99999"),
        (["serve", "--port", "-1"], "argument --port: must be at least 1, not -1"),
        (["local-model", "--port", "0"], "argument --port: must be at least 1, not 0"),
    ],
)
def test_a_count_below_one_or_a_port_out_of_range_is_refused_by_the_command_line(argv, message, capsys):
    """Celery took `--concurrency 0` for one thread per CPU, silently; uvicorn took port 99999 as 34463."""
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(argv)
    assert refused.value.code == 2
    assert message in capsys.readouterr().err
