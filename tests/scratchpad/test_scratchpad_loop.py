"""The scratchpad inside the agent loop: offload, references, tool offering, the guard."""

from __future__ import annotations

import json

import pytest

from agents import lifecycle
from agents.models import Run
from conversations.models import Message
from engine.actions import ApprovalNeeded, result_text
from engine.loop import PausedTurn, run_turn
from engine.toolbox import ToolBoxLayer
from scratchpad import services
from scratchpad.models import Entry
from scratchpad.store import turn_toolbox
from tests.support.scratchpad import (
    ScriptedProvider,
    last_results,
    make_run,
    say,
    server_log,
    tool_use,
    tools_in,
)

pytestmark = pytest.mark.django_db

USER = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]


def _turn(provider, run, root, **kwargs):
    # Parallel tool calls run on threads with their own database connections, which cannot
    # see this test's uncommitted transaction; these tests are about the scratchpad, so one thread.
    kwargs.setdefault("max_parallel_tools", 1)
    toolbox = turn_toolbox(inner=tools_in(root), run_id=run.pk, conversation_id=run.conversation_id)
    events = []
    outcome = run_turn(
        provider=provider,
        model="m",
        system=[],
        history=USER,
        toolbox=toolbox,
        emit=lambda kind, payload: events.append((kind, payload)),
        **kwargs,
    )
    return outcome, events


def _tool_names(request):
    return {tool["name"] for tool in request.tools}


@pytest.mark.req("SP-1")
@pytest.mark.req("SP-3")
@pytest.mark.req("SP-6")
@pytest.mark.req("SP-7")
def test_800kb_log_history_holds_summary_and_id_and_tail_returns_the_errors(alice, tmp_path):
    log = server_log(10_000, errors_at_end=3)
    assert len(log.encode()) > 800_000
    (tmp_path / "big_log.txt").write_text(log)
    run = make_run(alice)
    seen = {}

    def read_tail(request):
        seen["synthetic"] = last_results(request)[0]
        return [tool_use("t2", "scratchpad_read", scratchpad_id=seen["synthetic"]["scratchpad_id"], mode="tail", n=400)]

    def answer(request):
        seen["tail"] = last_results(request)[0]
        return say("three connection errors at the end")

    provider = ScriptedProvider([[tool_use("t1", "read_file", path="big_log.txt")], read_tail, answer])
    outcome, _ = _turn(provider, run, tmp_path)

    synthetic = seen["synthetic"]
    assert set(synthetic) == {"ok", "scratchpad_id", "size_bytes", "kind", "summary", "metadata", "_note"}
    assert synthetic["kind"] == "text" and synthetic["size_bytes"] == len(log.encode())
    assert synthetic["metadata"] == {"path": "big_log.txt", "bytes": len(log.encode()), "encoding": "utf-8"}
    assert f"[... {len(log) - 1000} characters omitted ...]" in synthetic["summary"]
    assert "scratchpad_read" in synthetic["_note"]
    # The history holds the small synthetic observation, never the 800 KB.
    history_bytes = len(json.dumps(outcome.messages))
    assert history_bytes < 8_000
    # SP-7: not offered before the first offload, offered after it.
    assert "scratchpad_read" not in _tool_names(provider.requests[0])
    assert "scratchpad_read" in _tool_names(provider.requests[1])
    tail = seen["tail"]
    assert tail["ok"] is True
    assert tail["content"].count("ERROR [db.pool] connection refused") == 3
    assert tail["content"] == log[-400:]


@pytest.mark.req("SP-9")
def test_14kb_json_written_through_step_reference_lands_byte_identical(alice, tmp_path):
    body = json.dumps(
        {
            "headers": {"Accept": "*/*", "X-Note": "caffè ☕ naïve"},
            "items": [{"id": i, "name": f"item {i} è"} for i in range(420)],
        },
        ensure_ascii=False,
        indent=2,
    )
    assert 14_000 <= len(body.encode()) <= 40_000
    served = tmp_path / "_served"
    served.mkdir()
    (served / "get").write_bytes(body.encode())
    run = make_run(alice)
    seen = {}

    def write(request):
        seen["synthetic"] = last_results(request)[0]
        return [tool_use("t2", "write_file", path="out.txt", content="{{step1.content}}")]

    def done(request):
        seen["write"] = last_results(request)[0]
        return say("saved")

    provider = ScriptedProvider([[tool_use("t1", "fetch", url="https://example.test/get")], write, done])
    _turn(provider, run, tmp_path)

    assert "scratchpad_id" in seen["synthetic"]
    assert "{{step1.content}}" in seen["synthetic"]["_note"]
    assert seen["write"] == {"ok": True, "path": "out.txt", "bytes": len(body.encode())}
    assert (tmp_path / "out.txt").read_bytes() == body.encode()


@pytest.mark.req("SP-9")
def test_dotted_reference_reads_the_stored_metadata_not_the_summary(alice, tmp_path):
    (tmp_path / "big.txt").write_text("x" * 10_000)
    run = make_run(alice)
    provider = ScriptedProvider(
        [
            [tool_use("t1", "read_file", path="big.txt")],
            [tool_use("t2", "write_file", path="copy-name.txt", content="from {{step1.path}}, {{step1.bytes}} bytes")],
            say("ok"),
        ]
    )
    _turn(provider, run, tmp_path)
    assert (tmp_path / "copy-name.txt").read_text() == "from big.txt, 10000 bytes"


@pytest.mark.req("SP-9")
@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("{{step7.content}}", "step 7 does not exist"),
        ("{{step1.body}}", "step1 has no field 'body'"),
        ("{{step1.content.0}}", "step1.content is a str"),
    ],
)
def test_unresolvable_reference_is_an_error_and_the_tool_does_not_run(alice, tmp_path, reference, expected):
    (tmp_path / "big.txt").write_text("y" * 9_000)
    run = make_run(alice)
    seen = {}

    def done(request):
        seen["result"] = last_results(request)[0]
        return say("failed")

    provider = ScriptedProvider(
        [
            [tool_use("t1", "read_file", path="big.txt")],
            [tool_use("t2", "write_file", path="out.txt", content=reference)],
            done,
        ]
    )
    _turn(provider, run, tmp_path)
    assert seen["result"]["ok"] is False
    assert "write_file was not run" in seen["result"]["error"]
    assert expected in seen["result"]["error"]
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.req("SP-1")
def test_small_observation_goes_into_history_whole(alice, tmp_path):
    (tmp_path / "small.txt").write_text("tiny file\n")
    run = make_run(alice)
    provider = ScriptedProvider([[tool_use("t1", "read_file", path="small.txt")], say("done")])
    outcome, _ = _turn(provider, run, tmp_path)
    result = json.loads(result_text(outcome.messages[1]["content"][0]))
    assert result == {"ok": True, "path": "small.txt", "bytes": 10, "encoding": "utf-8", "content": "tiny file\n"}
    assert not Entry.objects.exists()
    assert "scratchpad_read" not in _tool_names(provider.requests[1])


@pytest.mark.req("SP-1")
def test_threshold_is_the_configured_setting(alice, tmp_path, settings):
    settings.SCRATCHPAD_THRESHOLD_BYTES = 200
    (tmp_path / "medium.txt").write_text("z" * 300)
    run = make_run(alice)
    provider = ScriptedProvider([[tool_use("t1", "read_file", path="medium.txt")], say("done")])
    outcome, _ = _turn(provider, run, tmp_path)
    result = json.loads(result_text(outcome.messages[1]["content"][0]))
    assert "scratchpad_id" in result
    entry = Entry.objects.get()
    assert services.full_observation(entry)["content"] == "z" * 300


@pytest.mark.req("SP-8")
def test_duplicate_call_is_refused_but_scratchpad_read_may_repeat(alice, tmp_path):
    (tmp_path / "big.txt").write_text("line\n" * 3000)
    run = make_run(alice)
    seen = {}

    def read_twice(request):
        entry_id = last_results(request)[0]["scratchpad_id"]
        read = {"scratchpad_id": entry_id, "mode": "head", "n": 10}
        return [tool_use("t2", "scratchpad_read", **read), tool_use("t3", "scratchpad_read", **read)]

    def list_twice(request):
        seen["reads"] = last_results(request)
        return [tool_use("t4", "list_dir", path="."), tool_use("t5", "list_dir", path=".")]

    def done(request):
        seen["lists"] = last_results(request)
        return say("done")

    provider = ScriptedProvider([[tool_use("t1", "read_file", path="big.txt")], read_twice, list_twice, done])
    _turn(provider, run, tmp_path)
    assert [result["content"] for result in seen["reads"]] == ["line\nline\n", "line\nline\n"]
    first, second = seen["lists"]
    assert first["ok"] is True
    assert second["ok"] is False and "already called with exactly these arguments at step 4" in second["error"]


@pytest.mark.req("SP-9")
def test_step_numbers_count_every_tool_call_including_refused_ones(alice, tmp_path):
    (tmp_path / "a.txt").write_text("A" * 6000)
    run = make_run(alice)
    provider = ScriptedProvider(
        [
            [tool_use("t1", "list_dir", path="."), tool_use("t2", "list_dir", path=".")],
            [tool_use("t3", "read_file", path="a.txt")],
            [tool_use("t4", "write_file", path="b.txt", content="{{step3.content}}")],
            say("done"),
        ]
    )
    _, events = _turn(provider, run, tmp_path)
    assert (tmp_path / "b.txt").read_text() == "A" * 6000
    assert [payload["tool_step"] for kind, payload in events if kind == "tool_result"] == [1, 2, 3, 4]
    assert Entry.objects.get().step_num == 3


@pytest.mark.req("SP-10")
@pytest.mark.req("SP-1")
def test_run_execute_collects_expired_entries_and_offloads_a_large_listing(alice, tmp_path, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.CC_WORKSPACE_ROOT = tmp_path
    old = make_run(alice, status=Run.Status.SUCCEEDED)
    stale = services.put(turn_id=str(old.pk), content="old", now=timezone.now() - timedelta(hours=2))
    run = make_run(alice, text="list the files in the workspace", status=Run.Status.QUEUED)
    workspace = tmp_path / f"conversation-{run.conversation_id}"
    workspace.mkdir()
    for i in range(120):
        (workspace / f"report-{i:04d}-with-a-rather-long-descriptive-name.txt").write_text("x")

    lifecycle.run_execute(run_id=run.pk, worker="test")

    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert not Entry.objects.filter(pk=stale.pk).exists()
    entry = Entry.objects.get(turn_id=str(run.pk))
    assert entry.executor_name == "list_dir" and entry.conversation_id == run.conversation_id
    results = [
        json.loads(result_text(block))
        for message in Message.objects.filter(conversation=run.conversation, role="user")
        for block in message.content
        if block.get("type") == "tool_result"
    ]
    assert results[0]["scratchpad_id"] == entry.pk
    listing = services.full_observation(entry)
    assert len(listing["entries"]) == 120


@pytest.mark.req("SP-11")
@pytest.mark.req("SP-7")
def test_a_later_turn_neither_sees_nor_reads_an_earlier_turns_entry(alice, tmp_path):
    from tests.support.scratchpad import next_run

    (tmp_path / "big.txt").write_text("secret line\n" * 1000)
    first = make_run(alice)
    earlier = {}

    def remember(request):
        earlier["id"] = last_results(request)[0]["scratchpad_id"]
        return say("stored")

    _turn(ScriptedProvider([[tool_use("t1", "read_file", path="big.txt")], remember]), first, tmp_path)
    second = next_run(first)
    seen = {}

    def done(request):
        seen["result"] = last_results(request)[0]
        return say("done")

    provider = ScriptedProvider([[tool_use("t1", "scratchpad_read", scratchpad_id=earlier["id"], mode="full")], done])
    _turn(provider, second, tmp_path)
    assert "scratchpad_read" not in _tool_names(provider.requests[0])
    assert seen["result"]["ok"] is False
    assert seen["result"]["error"] == (
        f"There is no scratchpad entry {earlier['id']!r} in this turn (unknown, expired, or from another turn)."
    )
    # Pinned to the conversation, the same entry becomes readable (and offered) in a later turn.
    services.pin(entry=Entry.objects.get(pk=earlier["id"]))
    third = next_run(first)
    provider = ScriptedProvider([[tool_use("t1", "scratchpad_read", scratchpad_id=earlier["id"], n=11)], done])
    _turn(provider, third, tmp_path)
    assert "scratchpad_read" in _tool_names(provider.requests[0])
    assert seen["result"]["content"] == "secret line"


@pytest.mark.req("SP-9")
@pytest.mark.req("SP-10")
def test_reference_to_an_expired_step_is_an_error_and_the_tool_does_not_run(alice, tmp_path):
    from datetime import UTC, datetime, timedelta

    (tmp_path / "big.txt").write_text("q" * 8000)
    run = make_run(alice)
    clock = {"now": datetime(2026, 12, 2, 10, 0, tzinfo=UTC)}
    seen = {}

    def later(request):
        clock["now"] += timedelta(hours=1, seconds=1)
        return [tool_use("t2", "write_file", path="out.txt", content="{{step1.content}}")]

    def done(request):
        seen["result"] = last_results(request)[0]
        return say("done")

    toolbox = turn_toolbox(
        inner=tools_in(tmp_path), run_id=run.pk, conversation_id=run.conversation_id, clock=lambda: clock["now"]
    )
    provider = ScriptedProvider([[tool_use("t1", "read_file", path="big.txt")], later, done])
    run_turn(provider=provider, model="m", system=[], history=USER, toolbox=toolbox, emit=lambda *_: None)
    assert seen["result"]["ok"] is False
    assert "has expired from the scratchpad" in seen["result"]["error"]
    assert not (tmp_path / "out.txt").exists()
    # Expired, the entry is no longer offered either.
    assert "scratchpad_read" not in _tool_names(provider.requests[2])


@pytest.mark.req("TD-11")
@pytest.mark.req("SP-3")
def test_a_deferred_tool_whose_first_output_is_offloaded_is_still_loaded_by_its_result(alice, tmp_path):
    from dataclasses import replace

    from engine.catalog.ranking import ToolIndex
    from engine.catalog.surface import ModeSpec, build_surface
    from engine.catalog.toolbox import CatalogToolBox
    from tests.support.catalog import reference_records
    from toolcatalog.toolbox import builtin_executor

    (tmp_path / "big.txt").write_text("line of the log\n" * 2000)
    records = [replace(r, resident=False) if r.name == "read_file" else r for r in reference_records()]
    index = ToolIndex(records)
    surface = build_surface(records, ModeSpec(), deferral=True)
    catalog = CatalogToolBox(surface=surface, index=lambda: index, executor=builtin_executor(tmp_path))
    run = make_run(alice)
    toolbox = turn_toolbox(inner=catalog, run_id=run.pk, conversation_id=run.conversation_id)
    provider = ScriptedProvider([[tool_use("t1", "read_file", path="big.txt")], say("read")])
    run_turn(provider=provider, model="m", system=[], history=USER, toolbox=toolbox, emit=lambda *_: None)
    result = provider.requests[1].messages[-1]["content"][0]
    synthetic = json.loads(result_text(result))
    assert "scratchpad_id" in synthetic and "_loads_tools" not in synthetic
    assert result["content"][1:] == [{"type": "tool_reference", "tool_name": "read_file"}]
    loaded = [tool for tool in provider.requests[1].tools if tool.get("defer_loading")]
    assert [tool["name"] for tool in loaded] == ["read_file"]
    # The stored observation is the tool's own, without the runtime's reserved key.
    stored = Entry.objects.get(turn_id=str(run.pk))
    assert stored.executor_name == "read_file"
    assert "_loads_tools" not in json.dumps(services.full_observation(stored))


class _WritesNeedApproval(ToolBoxLayer):
    def requires_approval(self, name: str) -> bool:
        return name == "write_file"


@pytest.mark.req("SB-5")
@pytest.mark.req("SP-9")
def test_references_resolve_after_an_approval_pause_and_the_pause_shows_the_resolved_arguments(alice, tmp_path):
    log = server_log(10_000, errors_at_end=1)
    (tmp_path / "big.txt").write_text(log)
    (tmp_path / "small.txt").write_text("hello")
    run = make_run(alice)
    asked = {"content": "{{step1.content}}|{{step2.content}}", "path": "out.txt"}
    provider = ScriptedProvider(
        [
            [tool_use("t1", "read_file", path="small.txt")],
            [tool_use("t2", "read_file", path="big.txt")],  # offloaded to the scratchpad
            [tool_use("t3", "write_file", **asked)],
            say("written"),
        ]
    )

    def toolbox():  # a new one, as a worker resuming the run builds it
        return _WritesNeedApproval(
            turn_toolbox(inner=tools_in(tmp_path), run_id=run.pk, conversation_id=run.conversation_id)
        )

    def turn(**kwargs):
        return run_turn(
            provider=provider, model="m", system=[], history=USER, toolbox=toolbox(), emit=lambda *a: None,
            max_parallel_tools=1, **kwargs,
        )  # fmt: skip

    with pytest.raises(ApprovalNeeded) as paused:
        turn()
    [pending] = paused.value.pending
    assert pending["input"] == asked
    assert pending["resolved_input"] == {"content": f"hello|{log}", "path": "out.txt"}
    assert not (tmp_path / "out.txt").exists()

    pause = paused.value
    resume = PausedTurn(messages=pause.messages, step=pause.step, previous_end=pause.previous_end, counts=pause.counts)
    outcome = turn(resume=resume, decisions={"t3": "approved"})
    assert json.loads(result_text(outcome.messages[-2]["content"][0]))["ok"] is True, outcome.messages[-2]
    assert (tmp_path / "out.txt").read_text() == f"hello|{log}"
