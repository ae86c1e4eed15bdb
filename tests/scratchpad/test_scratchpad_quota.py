"""The per-user scratchpad quota (CC_SCRATCHPAD_QUOTA_MB): a user at it gets the summary and a note,
nothing is stored, her expired entries are collected first, and nobody else is affected."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from engine.loop import run_turn
from scratchpad import services
from scratchpad.models import Chunk, Entry
from scratchpad.store import DjangoObservationStore, turn_toolbox
from tests.support.factories import UserFactory
from tests.support.scratchpad import ScriptedProvider, last_results, make_run, say, server_log, tool_use, tools_in

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def _fill(run, size, *, now=T0, ttl_seconds=None):
    """An entry of `size` bytes in the run's conversation, as an earlier offload would have left it."""
    return services.put(
        turn_id=f"earlier-{run.pk}",
        content="f" * size,
        run_id=run.pk,
        conversation_id=run.conversation_id,
        ttl_seconds=ttl_seconds,
        now=now,
    )


def _rows():
    return Entry.objects.count(), Chunk.objects.count()


def _offload(run, observation, *, now=T0, step=1):
    store = DjangoObservationStore(
        turn_id=str(run.pk), run_id=run.pk, conversation_id=run.conversation_id, clock=lambda: now
    )
    return store.offload(step=step, tool="read_file", observation=observation)


def _big(text):
    return {"ok": True, "path": "big.log", "encoding": "utf-8", "content": text}


@pytest.mark.req("SP-1")
@pytest.mark.req("SB-3")
def test_a_user_at_her_quota_gets_the_summary_and_a_note_and_the_turn_goes_on(alice, settings, tmp_path):
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    run = make_run(alice)
    _fill(run, MB - 50_000, now=datetime.now(UTC))
    log = server_log(2_000)  # about 160 KB: more than the 50 KB left
    (tmp_path / "big.log").write_text(log)
    before = _rows()
    seen = {}

    def answer(request):
        seen["shown"] = last_results(request)[0]
        return say("the log is too large to keep; here is what its head and tail say")

    provider = ScriptedProvider([[tool_use("t1", "read_file", path="big.log")], answer])
    toolbox = turn_toolbox(inner=tools_in(tmp_path), run_id=run.pk, conversation_id=run.conversation_id)
    outcome = run_turn(
        provider=provider,
        model="m",
        system=[],
        history=[{"role": "user", "content": [{"type": "text", "text": "read big.log"}]}],
        toolbox=toolbox,
        emit=lambda kind, payload: None,
        max_parallel_tools=1,
    )

    assert _rows() == before  # nothing stored, not even a row without chunks
    shown = seen["shown"]
    assert set(shown) == {"ok", "size_bytes", "kind", "summary", "metadata", "_note"}
    assert shown["ok"] is True and shown["kind"] == "text" and shown["size_bytes"] == len(log.encode())
    assert shown["metadata"] == {"path": "big.log", "bytes": len(log.encode()), "encoding": "utf-8"}
    chars = settings.SCRATCHPAD_SUMMARY_CHARS
    assert shown["summary"].startswith(log[:chars]) and shown["summary"].endswith(log[-chars:])
    assert f"[... {len(log) - 2 * chars} characters omitted ...]" in shown["summary"]
    note = shown["_note"]
    assert "was NOT saved: this user's scratchpad is full" in note
    assert "It holds 975.2 KB of the 1.0 MB quota per user (CC_SCRATCHPAD_QUOTA_MB)" in note
    assert "deletes conversations they no longer need" in note and "entries expire (the next one at" in note
    # The turn went on to the model's answer; scratchpad_read is not offered for an entry that is not there.
    assert outcome.messages[-1]["content"][0]["text"].startswith("the log is too large")
    assert "scratchpad_read" not in {tool["name"] for tool in provider.requests[1].tools}


@pytest.mark.req("SP-1")
@pytest.mark.req("SB-3")
def test_a_reference_to_an_observation_that_was_not_stored_is_a_clear_error(alice, settings, tmp_path):
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    run = make_run(alice)
    _fill(run, MB, now=datetime.now(UTC))
    (tmp_path / "big.log").write_text(server_log(2_000))
    seen = {}

    def copy(request):
        return [tool_use("t2", "write_file", path="copy.log", content="{{step1.content}}")]

    def answer(request):
        seen["write"] = last_results(request)[0]
        return say("could not copy it")

    provider = ScriptedProvider([[tool_use("t1", "read_file", path="big.log")], copy, answer])
    toolbox = turn_toolbox(inner=tools_in(tmp_path), run_id=run.pk, conversation_id=run.conversation_id)
    run_turn(
        provider=provider,
        model="m",
        system=[],
        history=[{"role": "user", "content": [{"type": "text", "text": "copy big.log"}]}],
        toolbox=toolbox,
        emit=lambda kind, payload: None,
        max_parallel_tools=1,
    )

    assert seen["write"]["ok"] is False
    assert seen["write"]["error"].startswith("write_file was not run: {{step1.content}}:")
    assert not (tmp_path / "copy.log").exists()  # never a file holding only the summary


@pytest.mark.req("SP-10")
@pytest.mark.req("SB-3")
def test_her_expired_entries_are_collected_first_and_then_the_entry_fits(alice, bob, settings):
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    run, bobs = make_run(alice), make_run(bob)
    expired = [_fill(run, 300_000, now=T0 - timedelta(hours=2)) for _ in range(3)]
    live = _fill(run, 200_000)
    bobs_expired = _fill(bobs, 300_000, now=T0 - timedelta(hours=2))
    text = server_log(6_000)  # about 480 KB: fits only once the 900 KB that expired are gone

    shown = _offload(run, _big(text))

    assert "scratchpad_id" in shown and "NOT saved" not in shown["_note"]
    entry = Entry.objects.get(pk=shown["scratchpad_id"])
    assert services.full_content(entry) == text
    assert not Entry.objects.filter(pk__in=[e.pk for e in expired]).exists()
    assert not Chunk.objects.filter(entry_id__in=[e.pk for e in expired]).exists()
    # Another user's entries are never collected by her put, expired or not.
    assert set(Entry.objects.values_list("pk", flat=True)) == {entry.pk, live.pk, bobs_expired.pk}


@pytest.mark.req("SB-3")
def test_live_entries_are_never_collected_to_make_room(alice, settings):
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    run = make_run(alice)
    expired = _fill(run, 100_000, now=T0 - timedelta(hours=2))
    pinned = services.pin(entry=_fill(run, 900_000), ttl_seconds=7200, now=T0)
    before = _rows()

    shown = _offload(run, _big(server_log(3_000)))  # about 240 KB; the 100 KB that expired are not enough

    assert "scratchpad_id" not in shown and "It holds 878.9 KB of the 1.0 MB quota" in shown["_note"]
    assert f"the next one at {pinned.expires_at:%Y-%m-%d %H:%M} UTC" in shown["_note"]
    # Her expired entry was collected on the way; the live one stays and nothing new was stored.
    assert _rows() == (before[0] - 1, before[1] - expired.chunk_count)
    assert Entry.objects.filter(pk=pinned.pk).exists()


@pytest.mark.req("SB-3")
@pytest.mark.django_db(transaction=True)
def test_another_user_stores_normally_while_one_is_full_and_one_users_parallel_puts_cannot_overshoot(settings):
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    alices, bobs = make_run(alice), make_run(bob)
    now = datetime.now(UTC)
    text = server_log(8_000)  # about 640 KB: one fits in 1 MB, two do not
    barrier = threading.Barrier(4)
    shown: dict[str, list[dict]] = {"alice": [], "bob": []}
    errors: list[BaseException] = []

    def offload(name, run, step):
        try:
            barrier.wait()
            shown[name].append(_offload(run, _big(text), now=now, step=step))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=offload, args=(name, run, step))
        for name, run in (("alice", alices), ("bob", bobs))
        for step in (1, 2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    # Each of them: exactly one of two parallel puts fits, the other gets the note; neither one's
    # usage passes the quota, and neither one's full scratchpad stops the other's put.
    for name, user in (("alice", alice), ("bob", bob)):
        stored = [item for item in shown[name] if "scratchpad_id" in item]
        refused = [item for item in shown[name] if "scratchpad_id" not in item]
        assert len(stored) == len(refused) == 1, name
        assert "scratchpad is full" in refused[0]["_note"]
        assert Entry.objects.filter(conversation__owner=user).count() == 1
        assert sum(Entry.objects.filter(conversation__owner=user).values_list("size_bytes", flat=True)) <= MB


@pytest.mark.req("SB-3")
def test_a_user_below_the_quota_offloads_as_before(alice, bob, settings):
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    _fill(make_run(bob), MB)  # bob is full; alice is not
    run = make_run(alice)
    text = server_log(6_000)

    shown = _offload(run, _big(text))

    assert set(shown) == {"ok", "scratchpad_id", "size_bytes", "kind", "summary", "metadata", "_note"}
    assert services.full_content(Entry.objects.get(pk=shown["scratchpad_id"])) == text


@pytest.mark.req("SB-3")
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "CC_SCRATCHPAD_QUOTA_MB=0 is below the minimum of 1."),
        ("-5", "CC_SCRATCHPAD_QUOTA_MB=-5 is below the minimum of 1."),
        ("1GB", "CC_SCRATCHPAD_QUOTA_MB='1GB' is not an integer."),
    ],
)
def test_a_bad_quota_setting_stops_the_process_with_a_clear_message(value, message, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CC_VAR_DIR": str(tmp_path), "CC_SCRATCHPAD_QUOTA_MB": value}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode != 0
    # The message alone, not after a traceback through Django's settings import.
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert message in result.stderr


@pytest.mark.req("SB-3")
@pytest.mark.req("TD-14")
def test_a_child_answer_too_large_for_the_parent_is_cut_to_its_summary_when_her_scratchpad_is_full(alice, settings):
    from agents.models import Run, Subagent
    from agents.subagents import fanout_observation

    settings.SCRATCHPAD_THRESHOLD_BYTES = 4096
    settings.CC_SCRATCHPAD_QUOTA_MB = 1
    run = make_run(alice)
    _fill(run, MB - 2000, now=datetime.now(UTC))  # live: nothing to collect
    before = _rows()
    answer = "A" * 3000 + "B" * 3000
    child = Subagent(parent=run, fanout_id="q" * 32, index=0, count=1, shape="worker", profile="worker", task="t",
                     status=Run.Status.SUCCEEDED, answer=answer)  # fmt: skip
    (item,) = fanout_observation(parent=run, shape="worker", children=[child], waited_out=False)["results"]
    # Nothing stored, no id to read; the parent still has the answer's two ends and is told why.
    assert _rows() == before and "scratchpad_id" not in item and "text" not in item
    assert item["summary"].startswith("AAAA") and item["summary"].rstrip().endswith("BBBB")
    assert "was NOT saved: this user's scratchpad is full" in item["_note"]
    assert "quota per user (CC_SCRATCHPAD_QUOTA_MB)" in item["_note"]
