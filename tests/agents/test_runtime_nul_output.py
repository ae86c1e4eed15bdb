"""A NUL in a tool's output (`find -print0`, `cat` of a binary) through a real run and PostgreSQL."""

from __future__ import annotations

import base64
import json
import os

import pytest

from agents.lifecycle import run_execute
from agents.models import Run, RunEvent
from conversations.models import Message
from engine.emulator import Emulator, ScriptedPolicy
from engine.emulator.server import EmulatorServer
from scratchpad import services
from scratchpad.models import Entry
from tests.support.factories import MessageFactory, RunFactory
from toolcatalog.workspace import workspace_root


def make_run(owner) -> Run:
    trigger = MessageFactory(conversation__owner=owner, text="go", as_tip=True)
    return RunFactory(
        conversation=trigger.conversation, trigger=trigger, provider="anthropic", model="claude-sonnet-4-5"
    )


SHELL = {"type": "tool_use", "name": "bash", "input": {"command": "printf 'left\\0right'"}}
READ = {"type": "tool_use", "name": "read_file", "input": {"path": "records.txt"}}


def _scripted_run(settings, tmp_path, owner, script: list, before=lambda run: None) -> Run:
    """A run of `owner` answered step by step by `script` through the emulator, run to its end and
    succeeded; `before(run)` prepares its workspace."""
    with EmulatorServer(Emulator(policy=ScriptedPolicy(script))) as server:
        settings.ANTHROPIC_API_KEY = "test-key"
        settings.ANTHROPIC_BASE_URL = server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
        run = make_run(owner)
        before(run)
        run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    return run


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("SP-1")
@pytest.mark.req("SP-3")
def test_a_nul_a_tool_prints_is_shown_as_a_symbol_and_the_run_goes_on(settings, tmp_path, alice):
    scripted, requests = ScriptedPolicy([[SHELL], [READ], "Done."]), []
    emulator = Emulator(policy=lambda payload: requests.append(payload) or scripted(payload))
    with EmulatorServer(emulator) as server:
        settings.ANTHROPIC_API_KEY = "test-key"
        settings.ANTHROPIC_BASE_URL = server.base_url
        settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.CC_TOOL_AUTO_APPROVE = ["bash"]
        run = make_run(alice)
        # Text past the binary sniff, large enough to be offloaded to the scratchpad.
        (workspace_root(run.conversation_id) / "records.txt").write_text(("a" * 99 + "\n") * 90 + "first\x00second\n")
        run_execute(run_id=run.pk, worker="test")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED, run.error
    results = [
        block
        for message in Message.objects.filter(conversation=run.conversation, role="user").order_by("id")
        for block in message.content
        if block.get("type") == "tool_result"
    ]
    shell, read = results
    assert "is_error" not in shell and json.loads(shell["content"])["stdout"] == "left\u2400right"
    offloaded = json.loads(read["content"])
    assert "is_error" not in read and offloaded["scratchpad_id"]
    entry = Entry.objects.get(pk=offloaded["scratchpad_id"])
    found = services.read(entry_id=entry.pk, turn_id=entry.turn_id, arguments={"mode": "grep", "pattern": "second"})
    assert "first\u2400second" in json.dumps(found, ensure_ascii=False)
    # The event log holds the same outputs, and the model's next request carried them.
    outputs = [event.payload["output"] for event in RunEvent.objects.filter(run=run, type="tool_result")]
    assert outputs[0]["stdout"] == "left\u2400right"
    assert "left\u2400right" in json.dumps(requests[-1]["messages"], ensure_ascii=False)


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("SP-3")
def test_a_nul_the_model_writes_in_a_call_or_its_answer_is_shown_as_a_symbol_and_the_run_goes_on(
    settings, tmp_path, alice
):
    call = {"type": "tool_use", "name": "read_file", "input": {"path": "x\x00y"}}
    run = _scripted_run(settings, tmp_path, alice, [[call], "Do\x00ne."])
    assistant = [
        m.content for m in Message.objects.filter(conversation=run.conversation, role="assistant").order_by("id")
    ]
    assert assistant[0][0]["input"] == {"path": "x\u2400y"} and assistant[-1] == [
        {"type": "text", "text": "Do\u2400ne."}
    ]
    (call_event,) = RunEvent.objects.filter(run=run, type="tool_call")
    assert call_event.payload["input"] == {"path": "x\u2400y"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("SP-3")
@pytest.mark.req("SB-5")
def test_a_file_name_that_is_not_utf8_and_a_lone_surrogate_the_model_writes_are_shown_and_the_run_goes_on(
    settings, tmp_path, alice
):
    # QA: list_dir, glob and search_files over such a name, or a call holding "\udcff", ended the
    # run `failed` with PostgreSQL's "Unicode low surrogate must follow a high surrogate".
    listing = {"type": "tool_use", "name": "list_dir", "input": {"path": "."}}
    call = {"type": "tool_use", "name": "read_file", "input": {"path": "odd\udcffname\ud800"}}

    def odd_name(run: Run) -> None:
        (workspace_root(run.conversation_id) / os.fsdecode(b"bad\xffname")).write_text("x")

    run = _scripted_run(settings, tmp_path, alice, [[listing], [call], "Listed."], before=odd_name)
    (listed, _) = [event.payload["output"] for event in RunEvent.objects.filter(run=run, type="tool_result")]
    assert [entry["name"] for entry in listed["entries"]] == ["bad\\xffname"]
    (_, call_event) = RunEvent.objects.filter(run=run, type="tool_call").order_by("id")
    assert call_event.payload["input"] == {"path": "odd\\xffname\ufffd"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("SP-2")
@pytest.mark.req("SP-5")
def test_command_output_that_is_not_utf8_is_kept_as_its_exact_bytes_and_summarised_as_binary(settings, tmp_path, alice):
    # QA: `cat` of 1 MB of random bytes was stored as a text entry, every undecodable byte
    # replaced by U+FFFD, so neither the entry nor a {{step1.stdout}} reference held the output.
    dump = {"type": "tool_use", "name": "bash", "input": {"command": "head -c 300000 /dev/urandom > r.bin; cat r.bin"}}
    small = {"type": "tool_use", "name": "bash", "input": {"command": "printf 'ok\\377\\376!'"}}
    settings.CC_TOOL_AUTO_APPROVE = ["bash"]
    run = _scripted_run(settings, tmp_path, alice, [[dump], [small], "Done."])
    offloaded, inline = [event.payload["output"] for event in RunEvent.objects.filter(run=run, type="tool_result")]
    entry = Entry.objects.get(pk=offloaded["scratchpad_id"])
    written = (workspace_root(run.conversation_id) / "r.bin").read_bytes()
    assert entry.kind == "binary" and entry.size_bytes == len(written) == 300_000
    found = services.read(entry_id=entry.pk, turn_id=entry.turn_id, arguments={"mode": "head", "n": 1000})
    assert base64.b64decode(found["content_base64"]) == written[:1000]
    assert "[BINARY: 300000 bytes, sha256=" in json.dumps(offloaded)
    # Small enough to stay in the history: each byte that is not UTF-8 is shown as \xNN.
    assert inline["stdout"] == "ok\\xff\\xfe!"
