"""The MCP endpoint at /mcp, driven by the official MCP client over a real HTTP server (TD-7, TD-9)."""

from __future__ import annotations

import json

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from rest_framework.authtoken.models import Token

from tests.support.mcp_servers import fixtures as live
from toolcatalog.builtins import BUILTINS
from toolcatalog.mcp_server import SEARCH_TOOL, mcp_tool_list, rank_tools

pytestmark = pytest.mark.django_db(transaction=True)

# The live ASGI server (uvicorn in a thread) and the workspace root it uses.
server_url = live.server_url
workspaces = live.workspaces


@pytest.fixture
def alice_token(alice) -> str:
    return Token.objects.create(user=alice).key


@pytest.fixture
def bob_token(bob) -> str:
    return Token.objects.create(user=bob).key


def _json_rpc_headers(token: str) -> dict[str, str]:
    """What an MCP client sends with a raw JSON-RPC POST."""
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }


def _session(url: str, authorization: str):
    """Run `steps(client)` against the endpoint with one MCP client session."""

    def run(steps):
        async def main():
            http = httpx2.AsyncClient(headers={"Authorization": authorization}, timeout=30)
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                return await steps(client)

        return anyio.run(main)

    return run


@pytest.mark.req("TD-9")
def test_tools_list_returns_every_tool_with_its_full_schema(server_url, alice_token):
    listed = _session(server_url, f"Bearer {alice_token}")(lambda client: client.list_tools())
    names = [tool.name for tool in listed.tools]
    assert names == [*sorted(BUILTINS), SEARCH_TOOL]
    assert names == [record["name"] for record in mcp_tool_list()]
    for tool in listed.tools:
        if tool.name in BUILTINS:
            assert tool.input_schema == BUILTINS[tool.name].input_schema
            assert tool.description == BUILTINS[tool.name].description
    bash = next(tool for tool in listed.tools if tool.name == "bash")
    assert bash.meta["controlcenter/requires_approval"] is True


@pytest.mark.req("RN-3")
def test_the_endpoint_refuses_missing_wrong_and_malformed_tokens(server_url, alice_token):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    for authorization in [None, "Bearer not-a-token", "Basic YWxpY2U6cHc=", "Bearer"]:
        sent = {**headers, **({"Authorization": authorization} if authorization else {})}
        response = httpx.post(server_url, json=body, headers=sent, timeout=10)
        assert response.status_code == 401, authorization
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert "token" in response.json()["error"]["message"].lower()
    # Both DRF spellings of the header are accepted.
    listed = _session(server_url, f"Token {alice_token}")(lambda client: client.list_tools())
    assert SEARCH_TOOL in [tool.name for tool in listed.tools]


@pytest.mark.req("RN-3")
def test_an_inactive_users_token_is_refused(server_url, alice, alice_token):
    alice.is_active = False
    alice.save()
    response = httpx.post(
        server_url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Authorization": f"Bearer {alice_token}", "Accept": "application/json, text/event-stream"},
        timeout=10,
    )
    assert response.status_code == 401


@pytest.mark.req("TD-7")
def test_search_tool_bm25_ranks_and_only_describes_matches(server_url, alice_token):
    async def steps(client):
        found = await client.call_tool(SEARCH_TOOL, {"query": "run a shell command", "limit": 3})
        nothing = await client.call_tool(SEARCH_TOOL, {"query": "zyxxy quorble"})
        bad = await client.call_tool(SEARCH_TOOL, {"query": "  "})
        misspelt = await client.call_tool(SEARCH_TOOL, {"query": "run a shell command", "limt": 1})
        return found, nothing, bad, misspelt

    found, nothing, bad, misspelt = _session(server_url, f"Bearer {alice_token}")(steps)
    assert found.is_error is False
    matches = found.structured_content["matches"]
    assert matches[0]["name"] == "bash"
    assert len(matches) <= 3
    # Described, not loaded: no schema comes back, only what each tool is.
    assert all(set(match) == {"name", "group", "description"} for match in matches)
    assert nothing.structured_content["matches"] == []
    assert "Rephrase" in nothing.structured_content["message"]
    assert "tools/list" in nothing.structured_content["message"]
    assert bad.is_error is True
    assert misspelt.is_error is True and "Unknown argument limt" in misspelt.content[0].text


@pytest.mark.req("TD-7", "SB-5")
def test_an_over_long_search_query_is_refused_and_never_holds_the_server(server_url, alice_token):
    # Under the request-size limit; before the limit on queries, ranking it held the whole web
    # process (every other request waiting) far past this test's timeout.
    huge = "x" * 1_000_000

    async def steps(client):
        refused = await client.call_tool(SEARCH_TOOL, {"query": huge})
        still = await client.call_tool(SEARCH_TOOL, {"query": "run a shell command"})
        return refused, still

    refused, still = _session(server_url, f"Bearer {alice_token}")(steps)
    assert refused.is_error is True
    message = refused.content[0].text
    assert "1,000,000 characters" in message and "at most 1,000" in message and len(message) < 500
    assert still.structured_content["matches"][0]["name"] == "bash"


@pytest.mark.req("TD-7")
def test_rank_tools_puts_the_closest_description_first():
    records = mcp_tool_list()
    assert rank_tools("replace a string in a file")[0]["name"] == "edit_file"
    assert rank_tools("remember a fact for later conversations", records)[0]["name"] == "save_memory"
    assert rank_tools("replace a string in a file", records)[0]["name"] == "edit_file"
    assert rank_tools("fetch a web page by URL", records)[0]["name"] == "fetch_url"


@pytest.mark.req("RN-5")
def test_tools_call_runs_builtins_in_the_callers_own_mcp_workspace(
    server_url, alice, alice_token, bob_token, workspaces
):
    async def alice_steps(client):
        written = await client.call_tool("write_file", {"path": "notes/plan.md", "content": "step one\n"})
        read = await client.call_tool("read_file", {"path": "notes/plan.md"})
        escape = await client.call_tool("read_file", {"path": "../mcp-user-0/x"})
        todo = await client.call_tool("todo_add", {"items": [{"content": "Review the plan"}]})
        return written, read, escape, todo

    written, read, escape, todo = _session(server_url, f"Bearer {alice_token}")(alice_steps)
    assert written.is_error is False
    assert read.structured_content["content"] == "     1\tstep one"
    assert (workspaces / f"mcp-user-{alice.pk}" / "notes" / "plan.md").read_text() == "step one\n"
    assert escape.is_error is True and "outside the workspace" in escape.structured_content["error"]
    assert todo.structured_content["count"] == 1

    async def bob_steps(client):
        return await client.call_tool("read_file", {"path": "notes/plan.md"}), await client.call_tool("todo_list", {})

    bob_read, bob_todo = _session(server_url, f"Bearer {bob_token}")(bob_steps)
    assert bob_read.is_error is True and "does not exist" in bob_read.structured_content["error"]
    assert bob_todo.structured_content["count"] == 0


@pytest.mark.req("RN-4")
@pytest.mark.req("MC-5")
def test_tools_call_keeps_the_approval_rule_and_refuses_unknown_tools(server_url, alice_token, workspaces, settings):
    async def steps(client):
        shell = await client.call_tool("bash", {"command": "touch ran.txt"})
        # MC-5: an unknown tool is a protocol error (JSON-RPC), not a tool result.
        try:
            await client.call_tool("drop_database", {})
            unknown = None
        except MCPError as exc:
            unknown = exc
        invalid = await client.call_tool("write_file", {"path": "x.txt"})
        return shell, unknown, invalid

    shell, unknown, invalid = _session(server_url, f"Bearer {alice_token}")(steps)
    assert shell.is_error is True and shell.structured_content["approval_required"] is True
    assert "CC_TOOL_AUTO_APPROVE" in shell.structured_content["error"]
    assert not any(workspaces.rglob("ran.txt"))
    assert unknown is not None and unknown.code == -32602 and "Unknown tool: 'drop_database'" in unknown.message
    assert invalid.is_error is True and "content" in invalid.structured_content["error"]


@pytest.mark.req("RN-3")
def test_a_foreign_host_header_and_an_oversized_body_are_refused(server_url, alice_token):
    headers = _json_rpc_headers(alice_token)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    rebound = httpx.post(server_url, json=body, headers={**headers, "Host": "evil.example"}, timeout=10)
    assert rebound.status_code in (400, 421)
    huge = httpx.post(server_url, content=b"[" + b" " * (5 * 1024 * 1024) + b"]", headers=headers, timeout=30)
    assert huge.status_code == 413
    # A JSON-RPC error like the endpoint's others, not the REST API's shape.
    assert huge.json()["jsonrpc"] == "2.0" and huge.json()["error"]["code"] == -32600
    assert "CC_MAX_REQUEST_BYTES" in huge.json()["error"]["message"]


@pytest.mark.req("MC-5")
def test_a_batch_or_a_body_that_is_not_one_json_rpc_message_is_an_invalid_request(server_url, alice_token):
    headers = _json_rpc_headers(alice_token)
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for body, said in [
        ([listing, {**listing, "id": 2}], "Batches are not supported"),
        ([1, 2, 3], "Batches are not supported"),
        ("tools/list", "one JSON-RPC message, a JSON object"),
        ({**listing, "jsonrpc": "1.0"}, '"jsonrpc": "2.0"'),
        # QA: these got a kilobyte of pydantic text, or a 202 and no answer at all.
        ({"jsonrpc": "2.0", "id": 1}, 'needs a "method"'),
        ({**listing, "params": "x"}, '"params" are a JSON object'),
        ({**listing, "method": 7}, '"method" is a non-empty string'),
        ({**listing, "id": {"a": 1}}, '"id" is a string or an integer'),
        ({**listing, "id": 1.5}, '"id" is a string or an integer'),
        ({**listing, "id": None}, '"id" is a string or an integer'),
    ]:
        response = httpx.post(server_url, json=body, headers=headers, timeout=10)
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert error["code"] == -32600, body
        assert said in error["message"] and len(error["message"]) < 100, error
    unparsable = httpx.post(server_url, content=b"{not json", headers=headers, timeout=10)
    assert unparsable.json()["error"]["code"] == -32700
    # The body read for the check still reaches the SDK whole.
    listed = httpx.post(server_url, json=listing, headers=headers, timeout=10)
    assert listed.status_code == 200 and SEARCH_TOOL in listed.text
    # QA: the SDK answered these with a plain-text 400, which no JSON-RPC client parses.
    for content_type in ("text/plain", None):
        other = (
            {**headers, "Content-Type": content_type}
            if content_type
            else {k: v for k, v in headers.items() if k != "Content-Type"}
        )
        refused = httpx.post(server_url, content=json.dumps(listing).encode(), headers=other, timeout=10)
        assert refused.status_code == 415 and "Content-Type: application/json" in refused.json()["error"]["message"]


@pytest.mark.req("MC-5")
def test_a_tool_call_that_names_no_tool_or_sends_arguments_that_are_no_object_says_which(server_url, alice_token):
    # QA: the SDK answered each "Invalid request parameters", naming nothing.
    headers = _json_rpc_headers(alice_token)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    for params, said in [
        (None, '"params" with "name"'),
        ({"name": 5}, '"params" with "name"'),
        ({"name": ""}, '"params" with "name"'),
        ({"name": SEARCH_TOOL, "arguments": [1]}, '"arguments" are a JSON object'),
        ({"name": SEARCH_TOOL, "arguments": "q"}, '"arguments" are a JSON object'),
    ]:
        body = {**call, "params": params} if params is not None else call
        response = httpx.post(server_url, json=body, headers=headers, timeout=10)
        answer = response.json()
        assert answer["id"] == 7 and answer["error"]["code"] == -32602, answer
        assert said in answer["error"]["message"], answer
    found = httpx.post(
        server_url, json={**call, "params": {"name": SEARCH_TOOL, "arguments": {"query": "shell"}}}, headers=headers
    )
    assert found.status_code == 200 and "bash" in found.text
