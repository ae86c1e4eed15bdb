"""Security: every endpoint needs credentials, forms need CSRF, and alice never reaches bob's objects (RN-3)."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.core import serializers
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from agents.models import ModelRequest, Run, RunEvent
from controlcenter.routing import websocket_urlpatterns
from conversations.models import Conversation, Message
from scratchpad import services as scratchpad_services
from scratchpad.models import Chunk, Entry
from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.mcp_server import mcp_execute
from toolcatalog.models import Memory, TodoItem
from toolcatalog.workspace import mcp_workspace_root, workspace_root

pytestmark = pytest.mark.django_db

# Public on purpose: the OpenAPI description of the API and its viewer hold no user data.
PUBLIC_API = {"api/schema/", "api/docs/"}
# Pages anyone may open: signing in, the health probe (no user data), static files.
PUBLIC_PAGES = {"login/", "logout/", "healthz", "favicon.ico"}  # the icon is a static file: public
METHODS = ["get", "post", "put", "patch", "delete"]


def _walk(patterns, prefix: str = "") -> list[str]:
    routes = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            routes += _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            routes.append(prefix + str(pattern.pattern))
    return routes


def _concrete(route: str) -> str:
    """A real path for a route: every converter gets a value that would match an object."""
    route = re.sub(r"<(?:int|id):[^>]+>", "1", route)
    route = re.sub(r"<(?:str|slug|path):[^>]+>", "0123456789abcdef", route)
    route = re.sub(r"<[^>]+>", "1", route)
    return "/" + route.lstrip("^").rstrip("$").replace("\\Z", "")


def _all_routes() -> list[str]:
    return _walk(get_resolver().url_patterns)


def _api_routes() -> list[str]:
    return [r for r in _all_routes() if r.startswith("api/") and r not in PUBLIC_API]


def test_the_walk_finds_every_api_route():
    # If the walk broke, the tests below would pass vacuously.
    routes = _api_routes()
    assert len(routes) >= 14
    assert {
        "api/conversations/",
        "api/runs/<id:run_id>/events/",
        "api/scratchpad/entries/<str:entry_id>/read/",
    } <= set(routes)


@pytest.mark.req("RN-3")
@pytest.mark.parametrize("route", _api_routes())
def test_every_api_route_refuses_a_request_without_credentials(route, alice):
    anonymous = APIClient()
    for method in METHODS:
        response = getattr(anonymous, method)(_concrete(route), {}, format="json")
        assert response.status_code in (401, 403), (method, route, response.status_code)
        assert "error" in response.json()


@pytest.mark.req("RN-3")
@pytest.mark.parametrize("route", _api_routes())
def test_every_api_route_refuses_a_wrong_token(route):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token 0000000000000000000000000000000000000000")
    assert client.get(_concrete(route)).status_code == 401


@pytest.mark.req("RN-3")
def test_every_page_sends_an_anonymous_visitor_to_sign_in():
    pages = [
        r for r in _all_routes() if not r.startswith("api/") and r not in PUBLIC_PAGES and not r.startswith("admin/")
    ]
    assert "" in pages and "conversations/<id:conversation_id>/" in pages
    client = Client()
    for route in pages:
        response = client.get(_concrete(route))
        assert response.status_code == 302 and "/login/" in response["Location"], route
    admin = client.get("/admin/")
    assert admin.status_code == 302 and "/admin/login/" in admin["Location"]


@pytest.mark.req("RN-3")
def test_html_forms_refuse_a_post_without_a_csrf_token(alice):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    refused = browser.post("/", {"title": "no token"})
    assert refused.status_code == 403
    assert not Conversation.objects.exists()
    signin = Client(enforce_csrf_checks=True).post("/login/", {"username": "alice", "password": "alice-password-1"})
    assert signin.status_code == 403
    # With the token the same form works, so the 403 above was the CSRF check.
    browser.get("/")
    accepted = browser.post("/", {"title": "with token", "csrfmiddlewaretoken": browser.cookies["csrftoken"].value})
    assert accepted.status_code == 302 and Conversation.objects.count() == 1


@pytest.mark.req("RN-3")
def test_session_authenticated_api_writes_need_the_csrf_token(alice):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    refused = browser.post("/api/conversations/", {"title": "x"}, content_type="application/json")
    assert refused.status_code == 403
    assert not Conversation.objects.exists()


@pytest.mark.req("RN-3")
@pytest.mark.django_db(transaction=True)
def test_websockets_refuse_anonymous_visitors_for_runs_and_conversations(alice):
    conversation = Conversation.objects.create(owner=alice, title="private")
    trigger = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "x"}])
    run = Run.objects.create(conversation=conversation, trigger=trigger, provider="offline", model="m")

    async def connect(path: str, user) -> tuple[bool, int | None]:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
        communicator.scope["user"] = user
        connected, code = await communicator.connect(timeout=10)
        await communicator.disconnect(timeout=10)
        return connected, code

    for path in (f"/ws/runs/{run.pk}/", f"/ws/conversations/{conversation.pk}/"):
        assert async_to_sync(connect)(path, AnonymousUser()) == (False, 4401)


# --- per-user isolation ----------------------------------------------------------


STORED = [Conversation, Message, Run, RunEvent, ModelRequest, Entry, Chunk, Memory, TodoItem, Token]


def _snapshot() -> str:
    return json.dumps(
        {model.__name__: json.loads(serializers.serialize("json", model.objects.order_by("pk"))) for model in STORED},
        sort_keys=True,
    )


@pytest.fixture
def bobs_world(bob, settings, tmp_path):
    """One of every object type bob owns."""
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    conversation = Conversation.objects.create(owner=bob, title="bob's secret plans")
    question = Message.objects.create(conversation=conversation, role="user", content=[{"type": "text", "text": "q"}])
    answer = Message.objects.create(
        conversation=conversation, parent=question, role="assistant", content=[{"type": "text", "text": "a"}]
    )
    conversation.tip = answer
    conversation.save()
    run = Run.objects.create(
        conversation=conversation, trigger=question, provider="offline", model="m", status=Run.Status.FAILED
    )
    RunEvent.objects.create(run=run, seq=1, type="run_started", payload={"worker": "w"})
    entry = scratchpad_services.put(
        turn_id=str(run.pk), run_id=run.pk, conversation_id=conversation.pk, content="bob secret " * 1000
    )
    bob_tools = WorkspaceToolBox(workspace_root(conversation.pk), conversation_id=conversation.pk, user_id=bob.pk)
    assert bob_tools.execute("save_memory", {"content": "bob's password hint is zebra"})["ok"]
    todo = bob_tools.execute("todo_add", {"items": [{"content": "bob todo"}]})
    (workspace_root(conversation.pk) / "bob.txt").write_text("bob file")
    assert mcp_execute(user_id=bob.pk, name="write_file", arguments={"path": "mine.txt", "content": "bob mcp"})["ok"]
    return {"conversation": conversation, "run": run, "entry": entry, "todo_id": todo["added"][0]}


@pytest.mark.req("RN-3")
def test_alice_gets_404_for_every_one_of_bobs_objects_and_nothing_stored_changes(alice, alice_api, bobs_world):
    conversation, run, entry = bobs_world["conversation"], bobs_world["run"], bobs_world["entry"]
    before = _snapshot()
    attempts = [
        ("get", f"/api/conversations/{conversation.pk}/", None),
        ("post", f"/api/conversations/{conversation.pk}/messages/", {"text": "hijack"}),
        ("get", f"/api/conversations/{conversation.pk}/context", None),
        ("get", f"/api/runs/{run.pk}/", None),
        ("post", f"/api/runs/{run.pk}/cancel/", None),
        ("post", f"/api/runs/{run.pk}/retry/", None),
        ("get", f"/api/runs/{run.pk}/events/", None),
        ("get", f"/api/runs/{run.pk}/events/?after=0", None),
        ("get", f"/api/scratchpad/runs/{run.pk}/entries/", None),
        ("get", f"/api/scratchpad/entries/{entry.pk}/", None),
        ("get", f"/api/scratchpad/entries/{entry.pk}/read/?mode=full", None),
        ("post", f"/api/scratchpad/entries/{entry.pk}/pin/", {"ttl_seconds": 60}),
    ]
    for method, path, body in attempts:
        response = getattr(alice_api, method)(path, body, format="json")
        assert response.status_code == 404, (method, path, response.status_code)
        assert "bob" not in response.content.decode().lower(), path
    listed = alice_api.get("/api/conversations/").json()
    assert listed == [] or all(item["id"] != conversation.pk for item in listed)
    assert _snapshot() == before


@pytest.mark.req("RN-3")
@pytest.mark.django_db(transaction=True)
def test_alice_cannot_watch_bobs_runs_or_conversations_over_websockets(alice, bobs_world):
    async def connect(path: str) -> tuple[bool, int | None]:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
        communicator.scope["user"] = alice
        connected, code = await communicator.connect(timeout=10)
        await communicator.disconnect(timeout=10)
        return connected, code

    assert async_to_sync(connect)(f"/ws/runs/{bobs_world['run'].pk}/") == (False, 4404)
    assert async_to_sync(connect)(f"/ws/conversations/{bobs_world['conversation'].pk}/") == (False, 4404)


@pytest.mark.req("RN-3")
@pytest.mark.req("RN-5")
def test_alices_tools_never_see_bobs_memories_todos_or_files(alice, bobs_world):
    before = _snapshot()
    mine = Conversation.objects.create(owner=alice, title="alice")
    alice_tools = WorkspaceToolBox(workspace_root(mine.pk), conversation_id=mine.pk, user_id=alice.pk)
    assert alice_tools.execute("search_memory", {"query": "password hint zebra"})["memories"] == []
    bob_id = bobs_world["conversation"].owner_id
    bob_tools = WorkspaceToolBox(
        workspace_root(bobs_world["conversation"].pk), conversation_id=bobs_world["conversation"].pk, user_id=bob_id
    )
    assert bob_tools.execute("search_memory", {"query": "password hint zebra"})["count"] == 1  # it is there
    update = alice_tools.execute("todo_update", {"id": bobs_world["todo_id"], "status": "completed"})
    assert update["ok"] is False
    assert "bob" not in json.dumps(alice_tools.execute("todo_list", {}))
    assert (
        alice_tools.execute("read_file", {"path": f"../conversation-{bobs_world['conversation'].pk}/bob.txt"})["ok"]
        is False
    )
    # MCP: alice's calls run in her own workspace; bob's file is neither listed nor readable.
    assert mcp_execute(user_id=alice.pk, name="read_file", arguments={"path": "mine.txt"})["ok"] is False
    escape = mcp_execute(user_id=alice.pk, name="read_file", arguments={"path": f"../mcp-user-{bob_id}/mine.txt"})
    assert escape["ok"] is False
    assert "mine.txt" not in json.dumps(mcp_execute(user_id=alice.pk, name="list_dir", arguments={"path": "."}))
    assert mcp_execute(user_id=alice.pk, name="search_memory", arguments={"query": "zebra"})["memories"] == []
    after = json.loads(_snapshot())
    # Only alice's own conversation row was added; bob's rows are exactly as they were.
    after["Conversation"] = [row for row in after["Conversation"] if row["pk"] != mine.pk]
    assert json.dumps(after, sort_keys=True) == before
    assert (mcp_workspace_root(bob_id) / "mine.txt").read_text() == "bob mcp"
