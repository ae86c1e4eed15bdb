"""`manage.py bench` as an operator runs it: options refused by name before anything starts, help
that exits 0, and benches that write doing so in a scratch database of their own."""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from controlcenter.management.commands.bench import _available
from controlcenter.processes import services_env
from tests.support.catalog import CATALOG_PATH
from toolcatalog.models import Tool

ROOT = Path(__file__).resolve().parents[2]


def _manage_bench(*argv: str, database: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "bench", *argv],
        cwd=ROOT, env=services_env(database), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["mcp", "--repeat", "0"], "bench mcp: argument --repeat: must be at least 1, not 0"),
        (["tools", "--files", "-1"], "bench tools: argument --files: must be at least 0, not -1"),
        (["turn", "--turns", "0"], "bench turn: argument --turns: must be at least 1, not 0"),
        (["tree", "--messages", "0"], "bench tree: argument --messages: must be at least 1, not 0"),
        (["tree", "--messages", "5", "--depth", "10"], "bench tree: argument --depth: must be at most --messages (5)"),
        (["scratchpad", "--size-mb", "0"], "bench scratchpad: argument --size-mb: must be at least 1, not 0"),
        (["search", "--k", "0"], "bench search: argument --k: must be at least 1, not 0"),
        (["search", "--limit", "-1"], "bench search: argument --limit: must be at least 0, not -1"),
        # QA: ignored without --catalog, and a traceback for a file of another shape.
        (["search", "--queries", str(ROOT / "pyproject.toml")], "bench search: --queries needs --catalog"),
        (
            [
                "search",
                "--catalog",
                str(ROOT / "tests/data/toolcatalog.json"),
                "--queries",
                str(ROOT / "bench/search_data/toolret-apigen.split.json"),
            ],
            "toolret-apigen.split.json: a JSON list of queries was expected",
        ),  # fmt: skip
        (["compaction", "--windows", "abc"], "bench compaction: argument --windows: 'abc' is not a whole number"),
        (["compaction", "--turns", "0"], "bench compaction: argument --turns: must be at least 1, not 0"),
        (["small_window", "--window", "10"], "bench small_window: argument --window: must be at least 1024, not 10"),
        (["search_tune", "--grid", "[1]"], "bench search_tune: argument --grid: write a JSON object of non-empty"),
        (["search_tune", "--grid", '{"ranking.NOPE": [1]}'], "'ranking.NOPE' names no constant of ranking, semantic"),
        (["deferral", "--catalog", str(ROOT / "pyproject.toml")], "pyproject.toml is not a tool catalog: line 1"),
        (["cache", "--timeout", "0"], "bench cache: argument --timeout: must be above 0, not 0"),
        (["load", "--phases", "runs,nap"], "bench load: argument --phases: nap is not one of runs, api, watch"),
    ],
)
def test_a_bad_bench_option_is_refused_by_name_before_anything_is_written(argv, message, db):
    users, tools = get_user_model().objects.count(), Tool.objects.count()
    with pytest.raises(CommandError) as refused:
        call_command("bench", *argv, stdout=io.StringIO())
    assert message in str(refused.value)
    # small_window imported the reference catalog before it looked at --window.
    assert (get_user_model().objects.count(), Tool.objects.count()) == (users, tools)


@pytest.mark.parametrize("name", _available())
def test_every_bench_offered_runs_and_prints_its_help_and_exits_zero(name, capsys):
    # A helper module offered as a bench (bench/session.py was) ended in an AttributeError.
    assert callable(getattr(importlib.import_module(f"bench.{name}"), "run", None))
    with pytest.raises(SystemExit) as exited:
        call_command("bench", name, "--help")
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: bench {name}")


@pytest.mark.django_db(transaction=True)
def test_the_command_line_refuses_a_bad_option_in_one_line_and_a_writing_bench_leaves_the_database_as_it_was():
    database = connection.settings_dict["NAME"]
    helped = _manage_bench("tree", "--help", database=database)
    assert (helped.returncode, helped.stderr) == (0, "")
    refused = _manage_bench("tree", "--messages", "0", database=database)
    assert refused.returncode == 1
    assert refused.stderr == "CommandError: bench tree: argument --messages: must be at least 1, not 0\n"

    ran = _manage_bench("compaction", "--turns", "1", "--windows", "8000", "--json", database=database)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads(ran.stdout.splitlines()[-1])["window_8000"]["failed_runs"] == 0
    # Its user, conversation and runs went into the scratch database, and that is gone.
    assert not get_user_model().objects.filter(username__startswith="bench-").exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [f"{database}%bench"])
        assert cursor.fetchall() == []


@pytest.mark.req("TD-3")
def test_bench_deferral_counts_the_ratio_with_a_real_tokenizer_too_and_it_agrees_with_the_estimate():
    """The estimate is four characters a token; a real BPE tokenizer (SmolLM2's, from the [local]
    extra the suite installs) must find the same ratio within a point, and within TD-3's 22 %."""
    out = io.StringIO()
    call_command("bench", "deferral", "--catalog", str(CATALOG_PATH), "--json", stdout=out)
    figures = json.loads(out.getvalue())
    real = figures["real_tokenizer"]
    assert real["tokenizer"].startswith("SmolLM2")
    assert real["full_tool_tokens"] > real["deferred_tool_tokens"] > real["index_tokens"] > 0
    assert real["ratio"] == round(real["deferred_tool_tokens"] / real["full_tool_tokens"], 4)
    assert abs(real["ratio"] - figures["ratio"]) <= 0.01
    assert real["ratio"] <= 0.22
