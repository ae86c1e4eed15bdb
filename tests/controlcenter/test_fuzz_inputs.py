"""Hypothesis over every parser of untrusted input: each input is answered or refused clearly, never a crash,
and a refusal changes nothing stored (SP-6, SP-9, TD-1, TD-5, TD-9, CH-10).

The numbers of examples are recorded in docs/reliability.md; each test counts what it tried.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from rest_framework.authtoken.models import Token

from agents.models import Run
from conversations import commands
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest
from engine.scratchpad.references import UnresolvableReference, has_references, resolve
from scratchpad import services as scratchpad_services
from scratchpad.models import Chunk, Entry
from scratchpad.store import DjangoObservationStore
from tests.support.history import add_turn
from tests.support.mcp_servers import fixtures as live
from toolcatalog.builtins import BUILTINS
from toolcatalog.catalogfile import parse_catalog
from toolcatalog.models import Tool, ToolGroup
from toolcatalog.services import catalog_import

server_url = live.server_url
workspaces = live.workspaces

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)

# --- {{stepN.field}} (SP-9) ------------------------------------------------------

OBSERVATIONS = {
    1: {"ok": True, "content": "x" * 50, "metadata": {"path": "a.txt", "items": [{"url": "http://e"}, 2]}},
    2: {"ok": True, "content": b"\x00\x01binary"},
    3: ["plain", "list"],
}


def lookup(step: int) -> Any:
    if step not in OBSERVATIONS:
        raise KeyError(f"step {step} does not exist")
    return OBSERVATIONS[step]


path_parts = st.sampled_from(["content", "metadata", "path", "items", "0", "1", "-1", "url", "nope", "99"]) | st.text(
    alphabet=st.characters(blacklist_characters=".{} \t\n\r\x0b\x0c"), min_size=1, max_size=6
)
references = st.builds(
    lambda step, parts, pad: "{{" + pad + f"step{step}" + "".join("." + p for p in parts) + pad + "}}",
    st.integers(min_value=0, max_value=5),
    st.lists(path_parts, max_size=4),
    st.sampled_from(["", " "]),
)
texts_with_references = st.lists(references | st.text(max_size=12), min_size=1, max_size=5).map("".join)


@pytest.mark.req("SP-9")
@FUZZ
@given(arguments=st.dictionaries(st.text(max_size=8), texts_with_references | json_values, max_size=4))
def test_reference_resolver_resolves_or_names_the_bad_reference_never_crashes(arguments):
    try:
        resolved = resolve(arguments, lookup)
    except UnresolvableReference as exc:
        assert str(exc).startswith("{{"), exc  # names the reference it could not resolve
        return
    assert set(resolved) == set(arguments)
    # One pass: what a reference pulled in is never scanned again, and nothing is left unresolved
    # except text that came from the observations themselves (which holds no references here).
    assert not has_references(resolved)


@pytest.mark.req("SP-9")
@FUZZ
@given(text=st.text(max_size=60))
def test_reference_resolver_leaves_text_without_references_exactly_as_it_was(text):
    if has_references(text):
        return
    assert resolve({"a": text}, lookup) == {"a": text}


# --- scratchpad_read (SP-6) --------------------------------------------------------

read_arguments = st.fixed_dictionaries(
    {},
    optional={
        "scratchpad_id": st.sampled_from(["ENTRY", "0123456789abcdef", "", "../etc", "x" * 40]) | json_scalars,
        "mode": st.sampled_from(["full", "head", "tail", "range", "lines", "grep", "HEAD", ""]) | json_scalars,
        "n": st.integers(min_value=-5, max_value=50_000) | json_scalars,
        "start": st.integers(min_value=-5, max_value=30_000) | json_scalars,
        "end": st.integers(min_value=-5, max_value=30_000) | json_scalars,
        "pattern": st.sampled_from(["line", "(a+)+$", "[", "\\d+", "(?P<x", ""]) | st.text(max_size=8),
        "ignore_case": json_scalars,
        "context": st.integers(min_value=-2, max_value=20) | json_scalars,
        "max_matches": st.integers(min_value=-2, max_value=600) | json_scalars,
        "extra": json_scalars,
    },
)


def _read_in(modes: list[str], **optional: st.SearchStrategy) -> st.SearchStrategy:
    """Reads in one of `modes` with only the arguments those modes take (another mode's is refused)."""
    return st.fixed_dictionaries({"scratchpad_id": st.just("ENTRY"), "mode": st.sampled_from(modes)}, optional=optional)


well_formed_reads = st.one_of(
    _read_in(["full"]),
    _read_in(["head", "tail"], n=st.integers(min_value=1, max_value=5000)),
    _read_in(
        ["range", "lines"], start=st.integers(min_value=0, max_value=3000), end=st.integers(min_value=0, max_value=3000)
    ),
    _read_in(
        ["grep"],
        pattern=st.sampled_from(["line 1", "of the", "^line 2\\d$"]),
        context=st.integers(min_value=0, max_value=10),
    ),
)


@pytest.mark.req("SP-6")
@pytest.mark.django_db
def test_scratchpad_read_answers_or_refuses_every_argument_combination_and_changes_nothing():
    entry = scratchpad_services.put(turn_id="t1", content="".join(f"line {i} of the log\n" for i in range(3000)))
    binary = scratchpad_services.put(turn_id="t1", content=bytes(range(256)) * 40)
    store = DjangoObservationStore(turn_id="t1")
    before = (list(Entry.objects.values()), list(Chunk.objects.values_list("entry_id", "index", "data")))
    tried = {"ok": 0, "refused": 0}

    @FUZZ
    @given(
        arguments=read_arguments | well_formed_reads, target=st.sampled_from([entry.pk, binary.pk]), raw=st.booleans()
    )
    def check(arguments, target, raw):
        if arguments.get("scratchpad_id") == "ENTRY":
            arguments = {**arguments, "scratchpad_id": target}
        answer = store.read(arguments if not raw else json.loads(json.dumps(arguments)))
        assert isinstance(answer, dict) and isinstance(answer.get("ok"), bool)
        if answer["ok"]:
            tried["ok"] += 1
            assert len(json.dumps(answer)) < 200_000  # a read is capped, never the whole entry unasked
        else:
            tried["refused"] += 1
            assert isinstance(answer["error"], str) and answer["error"]

    check()
    assert tried["ok"] > 10 and tried["refused"] > 10, tried
    after = (list(Entry.objects.values()), list(Chunk.objects.values_list("entry_id", "index", "data")))
    assert after == before


# --- tool arguments against schemas (TD-5) -----------------------------------------


def _arguments_for(schema: dict[str, Any]):
    names = sorted((schema.get("properties") or {}).keys()) + ["unexpected"]
    return st.dictionaries(st.sampled_from(names), json_values, max_size=len(names))


@pytest.mark.req("TD-5")
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_tool_argument_validation_agrees_with_json_schema_and_refuses_clearly(name, tmp_path):
    tool = BUILTINS[name]
    # An argument the schema does not name is refused too (a misspelt one ran with the default).
    oracle = Draft202012Validator({**tool.input_schema, "additionalProperties": False})

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(arguments=_arguments_for(tool.input_schema) | json_values)
    def check(arguments):
        problem = tool.validation_error(arguments)
        if problem is None:
            assert isinstance(arguments, dict) and oracle.is_valid(arguments)
        else:
            assert not (isinstance(arguments, dict) and oracle.is_valid(arguments))
            assert name in problem
            # Refused arguments never run the tool: the workspace stays empty.
            observation = tool.call(arguments, tmp_path)
            assert observation == {"ok": False, "error": problem}
            assert list(tmp_path.iterdir()) == []

    check()


# --- catalog import (TD-1) ----------------------------------------------------------

tool_entries = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["read_file", "ok_tool", "Bad Name", "", "x" * 80]) | json_scalars,
        "group": st.sampled_from(["Files", "Nope"]) | json_scalars,
        "description": st.text(max_size=20) | json_scalars,
        "input_schema": st.sampled_from(
            [
                {"type": "object", "properties": {}},
                {"type": "array"},
                {"type": "object", "properties": {"a": {"type": "strng"}}},
                {"type": "object", "required": 5},
            ]
        )
        | json_values,
    },
    optional={"resident": json_scalars, "requires_approval": json_scalars, "surprise": json_scalars},
)
catalogs = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 2, "1"]), "groups": st.sampled_from([["Files"], [], ["Files", "Files"], "x"])},
    optional={"tools": st.lists(tool_entries, max_size=4) | json_scalars},
)

valid_tools = st.fixed_dictionaries(
    {
        "name": st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
        "group": st.just("Files"),
        "description": st.text(min_size=1, max_size=30).filter(str.strip),
        "input_schema": st.just({"type": "object", "properties": {"path": {"type": "string"}}}),
    },
    optional={"resident": st.booleans(), "requires_approval": st.booleans()},
)
valid_catalogs = st.fixed_dictionaries(
    {
        "version": st.just(1),
        "groups": st.just(["Files"]),
        "tools": st.lists(valid_tools, max_size=4, unique_by=lambda tool: tool["name"]),
    }
)


@pytest.mark.req("TD-1")
@pytest.mark.django_db
def test_catalog_import_takes_a_valid_file_whole_and_refuses_any_other_with_nothing_written():
    from toolcatalog.services import CatalogFileInvalid

    tried = {"imported": 0, "refused": 0}

    @FUZZ
    @given(document=catalogs | valid_catalogs | json_values, mangle=st.sampled_from(["", "cut", "garbage"]))
    def check(document, mangle):
        text = json.dumps(document)
        if mangle == "cut":
            text = text[: len(text) // 2]
        elif mangle == "garbage":
            text = text + "\x00}{"
        parsed = parse_catalog(text)
        assert all(isinstance(error, str) and error.startswith("line ") for error in parsed.errors)
        before = (list(Tool.objects.values()), list(ToolGroup.objects.values()))
        try:
            catalog_import(text=text)
        except CatalogFileInvalid:
            tried["refused"] += 1
            assert parsed.errors
            assert (list(Tool.objects.values()), list(ToolGroup.objects.values())) == before
        else:
            tried["imported"] += 1
            assert not parsed.errors
            assert Tool.objects.count() >= len(parsed.tools)

    check()
    assert tried["refused"] > 50 and tried["imported"] > 0


# --- MCP JSON-RPC (TD-9) --------------------------------------------------------------

rpc_methods = st.sampled_from(
    ["initialize", "tools/list", "tools/call", "ping", "resources/list", "nope", "", "notifications/initialized"]
)
rpc_messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", ""]) | json_scalars,
        "id": st.integers() | st.text(max_size=5) | json_scalars,
        "method": rpc_methods | json_scalars,
        "params": st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(["read_file", "list_dir", "search_tool_bm25", "bash", "nope"]) | json_scalars,
                "arguments": st.dictionaries(st.sampled_from(["path", "query", "command", "limit"]), json_values)
                | json_values,
                "protocolVersion": st.sampled_from(["2025-06-18", "1999"]) | json_scalars,
            },
        )
        | json_values,
    },
)

well_formed_rpc = st.fixed_dictionaries(
    {
        "jsonrpc": st.just("2.0"),
        "id": st.integers(min_value=1, max_value=10**6),
        "method": st.sampled_from(["tools/list", "tools/call", "ping", "nope"]),
        "params": st.fixed_dictionaries(
            {},
            optional={
                "name": st.sampled_from(["read_file", "list_dir", "search_tool_bm25", "bash", "nope"]),
                "arguments": st.dictionaries(st.sampled_from(["path", "query", "command", "limit"]), json_values),
            },
        ),
    }
)


@pytest.mark.req("TD-9")
@pytest.mark.django_db(transaction=True)
def test_malformed_json_rpc_to_the_mcp_endpoint_never_gets_a_server_error(server_url, alice):
    token = Token.objects.create(user=alice).key
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    statuses: dict[int, int] = {}
    with httpx.Client(headers=headers, timeout=20) as http:

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(
            body=rpc_messages | well_formed_rpc | st.lists(rpc_messages, max_size=3) | json_values,
            raw=st.sampled_from(["", "cut", "bytes"]),
        )
        def check(body, raw):
            content = json.dumps(body).encode()
            if raw == "cut":
                content = content[: max(1, len(content) // 2)]
            elif raw == "bytes":
                content = b"\xff\xfe" + content
            response = http.post(server_url, content=content)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (content, response.status_code, response.text[:300])

        check()
    assert sum(statuses.values()) >= 300
    assert any(code >= 400 for code in statuses) and any(code < 300 for code in statuses), statuses


# --- slash commands (CH-10) -----------------------------------------------------------

COMMAND_NAMES = [*commands.USAGE, "compat", "", "branchx", "REWIND", "Fork"]
command_words = (
    st.sampled_from(["1", "#7", "MSG", "#MSG", "0", "-3", "²", "١٢", "9" * 19, "9" * 40, "##", "#", "1.5"])
    | st.sampled_from(["before-refactor", "a", "../etc", "-x", "x" * 65, "a b", "ok.v2", "\x00", "é"])
    | st.text(max_size=12)
)
command_texts = st.builds(
    lambda lead, name, words, sep, tail: f"{lead}/{name}{sep}{sep.join(words)}{tail}",
    st.sampled_from(["", " ", "\n", "\t "]),
    st.sampled_from(COMMAND_NAMES) | st.text(max_size=10),
    st.lists(command_words, max_size=3),
    st.sampled_from([" ", "  ", "\t", "\u00a0", "\u2003"]),
    st.sampled_from(["", " ", "\n"]),
) | st.text(max_size=60).map(lambda text: "/" + text)


def _lists_valid_forms(message: str) -> bool:
    """A refusal names every command, or the usage line of the one that was misused."""
    return all(f"/{name}" in message for name in commands.USAGE) or any(
        f"Usage: {line}" in message for line in commands.USAGE.values()
    )


@pytest.mark.req("CH-10")
@FUZZ
@given(text=command_texts)
def test_slash_command_parser_returns_a_command_or_an_error_listing_the_valid_forms(text):
    try:
        command = commands.parse(text)
    except commands.CommandError as error:
        assert _lists_valid_forms(str(error)), (text, str(error))
        return
    assert command.name in commands.USAGE
    if command.name == "branch":
        assert isinstance(command.message_id, int) and 0 <= command.message_id < 2**63
    if command.label is not None:
        assert commands.LABEL_PATTERN.match(command.label)


HISTORY_TABLES = [Conversation, Message, Run, Checkpoint, RewindDigest, Compaction]


def _history_rows() -> dict[str, list[dict[str, Any]]]:
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in HISTORY_TABLES}


@pytest.mark.req("CH-10")
@pytest.mark.django_db
def test_any_slash_message_to_the_api_is_done_or_refused_clearly_and_a_refusal_stores_nothing(alice, alice_api):
    conversation = Conversation.objects.create(owner=alice, title="Fuzzed")
    for index in range(3):
        add_turn(conversation, f"question {index}", f"answer {index}")
    url = f"/api/conversations/{conversation.pk}/messages/"
    message_ids = list(conversation.messages.values_list("pk", flat=True))
    runs = Run.objects.count()
    tried = {"done": 0, "refused": 0}

    @FUZZ
    @given(text=command_texts, pick=st.sampled_from(message_ids))
    def check(text, pick):
        text = text.replace("MSG", str(pick))
        # Text whose first word is no command is a prompt (CH-10), proven in test_history_commands.
        assume(commands.is_command(text))
        before = _history_rows()
        response = alice_api.post(url, {"text": text}, format="json")
        # 400 for a malformed command; 404 or 409 for one naming a missing object or refused by
        # the conversation's state (UX-8).
        assert response.status_code in (200, 400, 404, 409), (text, response.status_code, response.content[:300])
        try:
            commands.parse(text)
            parse_error = None
        except commands.CommandError as error:
            parse_error = str(error)
        if response.status_code != 200:
            tried["refused"] += 1
            assert response.status_code == 400 or parse_error is None, (text, response.status_code)
            message = response.json()["error"]["message"]
            # A parse error reaches the client as it is; a well-formed command the service cannot do
            # (no checkpoint to rewind to, a message of another conversation) says why.
            if "\x00" in text:  # refused by the message serializer before any parsing
                assert message == "text: Null characters are not allowed.", (text, message)
            else:
                assert message == parse_error if parse_error else message, (text, message)
            assert _history_rows() == before, text
        else:
            tried["done"] += 1
            assert parse_error is None and "\x00" not in text, text
            assert response.json()["command"]["command"] in commands.USAGE
        assert Run.objects.count() == runs  # a slash message never starts a model run

    check()
    assert tried["done"] > 10 and tried["refused"] > 100, tried
