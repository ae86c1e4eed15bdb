"""Real tool-search queries from what runs recorded, as a query file `bench search` measures (TS-1)."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from agents.models import Run, RunEvent
from agents.resident import recorded_tool_queries
from engine.catalog.ranking import ToolIndex
from tests.support.catalog import CATALOG_PATH
from tests.support.factories import RunFactory
from toolcatalog.catalogfile import records_from_catalog
from toolcatalog.models import McpServer, RetrievalMiss, Tool, ToolActivation, ToolGroup
from toolcatalog.services import catalog_import


def _run(owner, *, days_ago: float = 1) -> Run:
    run = RunFactory(conversation__owner=owner, trigger__text="go", model="m")
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - dt.timedelta(days=days_ago))
    return run


def _at(row, minutes: int) -> None:
    type(row).objects.filter(pk=row.pk).update(created_at=timezone.now() - dt.timedelta(hours=1, minutes=-minutes))


def _called(run: Run, *names: str) -> None:
    start = RunEvent.objects.filter(run=run).count()
    RunEvent.objects.bulk_create(
        RunEvent(run=run, seq=start + i + 1, type="tool_call", payload={"name": name, "input": {}})
        for i, name in enumerate(names)
    )


def _history(owner) -> None:
    """Four runs in the window and one older; what each should yield is said beside it."""
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    # A miss, then a search that loads two tools, one of which the run calls: both queries, that tool.
    first = _run(owner)
    _at(RetrievalMiss.objects.create(run=first, query="ping the team"), 0)
    for name in ("send_message", "read_channel_history"):
        _at(ToolActivation.objects.create(run=first, tool_name=name, trigger="search", query="post to a channel"), 1)
    _called(first, "read_file", "send_message")
    # A search whose loads the run never calls: it says nothing.
    idle = _run(owner)
    ToolActivation.objects.create(run=idle, tool_name="web_search", trigger="search", query="look it up")
    _called(idle, "read_file")
    # A load before the miss is not its answer; the miss says nothing, the tool was called directly.
    late = _run(owner)
    _at(ToolActivation.objects.create(run=late, tool_name="git_status", trigger="direct"), 0)
    _at(RetrievalMiss.objects.create(run=late, query="repo state"), 1)
    _called(late, "git_status")
    # A tool no longer in the catalog, or an MCP server's (which `catalog export` leaves out), is
    # never an answer: the measured catalog could not rank it.
    gone = _run(owner)
    ToolActivation.objects.create(run=gone, tool_name="retired_tool", trigger="search", query="the old way")
    server = McpServer.objects.create(name="weather", transport="stdio", command="weather-server")
    Tool.objects.create(
        name="get_forecast", group=ToolGroup.objects.first(), description="Weather by city.",
        input_schema={"type": "object"}, source=Tool.Source.MCP, server=server,
    )  # fmt: skip
    ToolActivation.objects.create(run=gone, tool_name="weather__get_forecast", trigger="search", query="rain")
    _called(gone, "retired_tool", "weather__get_forecast")
    # A subagent's search is stored on its parent run and answered by the child's call; an empty
    # search says nothing.
    parent = _run(owner)
    _at(RetrievalMiss.objects.create(run=parent, query=""), 0)
    _at(ToolActivation.objects.create(run=parent, tool_name="create_ticket", trigger="search", query="file it"), 1)
    _called(parent, "read_file")
    RunEvent.objects.create(
        run=parent, seq=99, type="subagent_tool_call", payload={"subagent": {"index": 0}, "name": "create_ticket"}
    )
    # Outside the window.
    old = _run(owner, days_ago=40)
    bug = ToolActivation.objects.create(run=old, tool_name="create_ticket", trigger="search", query="file a bug")
    ToolActivation.objects.filter(pk=bug.pk).update(created_at=timezone.now() - dt.timedelta(days=40))
    _called(old, "create_ticket")


@pytest.mark.req("TS-1")
@pytest.mark.django_db
def test_recorded_searches_become_queries_answered_by_the_tools_their_runs_then_called(alice):
    _history(alice)
    queries = recorded_tool_queries(days=30)
    assert [(q["source"], q["query"], q["gold"]) for q in queries] == [
        ("miss", "ping the team", ["send_message"]),
        ("search", "post to a channel", ["send_message"]),
        ("search", "file it", ["create_ticket"]),
    ]
    first = Run.objects.get(retrieval_misses__query="ping the team").pk
    assert [q["run"] for q in queries[:2]] == [first, first]
    # Oldest first, by when it was recorded (its row is the newest of all).
    assert [q["query"] for q in recorded_tool_queries(days=60)][0] == "file a bug"


@pytest.mark.req("TS-1")
@pytest.mark.django_db
def test_the_command_writes_a_query_file_that_bench_search_measures(alice, tmp_path, capsys):
    _history(alice)
    queries_file, catalog_file = tmp_path / "recorded.jsonl", tmp_path / "catalog.json"
    said = io.StringIO()
    call_command("tool_queries", "--days", "30", "--output", str(queries_file), stdout=said)
    assert said.getvalue().strip() == f"{queries_file}: 3 queries (1 that found nothing first) from the last 30 days."
    lines = [json.loads(line) for line in queries_file.read_text(encoding="utf-8").splitlines()]
    assert [line["gold"] for line in lines] == [["send_message"], ["send_message"], ["create_ticket"]]
    call_command("tool_queries", "--days", "30")  # without --output: the same lines on standard output
    assert capsys.readouterr().out == queries_file.read_text(encoding="utf-8")
    call_command("catalog", "export", "--output", str(catalog_file))
    measured = io.StringIO()
    call_command(
        "bench", "search", "--catalog", str(catalog_file), "--queries", str(queries_file), "--ranker", "bm25",
        "--json", stdout=measured,
    )  # fmt: skip
    figures = json.loads(measured.getvalue())["rankers"]["bm25"]
    # The recorded queries, ranked over the exported catalog as the runtime ranks them.
    index = ToolIndex(records_from_catalog(json.loads(catalog_file.read_text(encoding="utf-8"))))
    found = [line["gold"][0] in {match.tool.name for match in index.search(line["query"], k=5)} for line in lines]
    assert figures["n_queries"] == 3
    assert figures["recall_at_5"] == round(sum(found) / 3, 4)


@pytest.mark.req("TS-1")
@pytest.mark.django_db
def test_the_command_refuses_bad_days_and_an_unwritable_file_clearly_and_changes_nothing(alice, tmp_path):
    _history(alice)
    stored = (RetrievalMiss.objects.count(), ToolActivation.objects.count(), RunEvent.objects.count())
    with pytest.raises(CommandError, match="must be at least 1, not 0"):
        call_command("tool_queries", "--days", "0")
    with pytest.raises(CommandError, match="is not a whole number"):
        call_command("tool_queries", "--days", "a week")
    with pytest.raises(CommandError, match=f"cannot write {tmp_path / 'missing' / 'q.jsonl'}: No such file"):
        call_command("tool_queries", "--output", str(tmp_path / "missing" / "q.jsonl"))
    assert (RetrievalMiss.objects.count(), ToolActivation.objects.count(), RunEvent.objects.count()) == stored
