"""Tree navigator, Context view and scratchpad viewer pages, and the one composed context (TD-15, CH-7..CH-10)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agents import chat, turns
from agents.models import Run
from conversations import selectors
from conversations.models import Checkpoint, Conversation, Message
from scratchpad.services import put_observation
from tests.support.catalog import CATALOG_PATH
from tests.support.history import add_turn
from toolcatalog.selectors import run_surface, surface_context
from toolcatalog.services import catalog_import

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def branched(alice) -> Conversation:
    """Two turns, then a second branch edited from the second prompt; the tip is on the new branch."""
    conversation = Conversation.objects.create(owner=alice, title="Tree")
    add_turn(conversation, "Plan the migration.", "Here is the plan.")
    second = add_turn(conversation, "List the files.", "Three files.", tools=[("list_dir", {"entries": ["a"]})])
    prompt = second[0]
    sibling = Message.objects.create(
        conversation=conversation, parent=prompt.parent, role="user", content=[{"type": "text", "text": "List all."}]
    )
    answer = Message.objects.create(
        conversation=conversation, parent=sibling, role="assistant", content=[{"type": "text", "text": "Four."}]
    )
    Conversation.objects.filter(pk=conversation.pk).update(tip=answer)
    conversation.refresh_from_db()
    return conversation


@pytest.mark.req("CH-7")
def test_tree_rows_indent_only_at_forks_and_mark_tip_path_and_what_can_be_done(branched):
    rows = selectors.tree_window(conversation=branched)["items"]
    assert not any(row["fold"] for row in rows)  # a small tree is drawn whole
    assert len(rows) == Message.objects.filter(conversation=branched).count() == 8
    by_id = {row["id"]: row for row in rows}
    assert [row["level"] for row in rows[:2]] == [0, 0]  # a chain does not indent
    fork_children = [row for row in rows if row["parent"] == rows[1]["id"]]
    assert len(fork_children) == 2 and all(row["level"] == 1 and row["branch_start"] for row in fork_children)
    tip = by_id[branched.tip_id]
    assert tip["tip"] and tip["on_path"] and sum(row["tip"] for row in rows) == 1
    assert sum(row["on_path"] for row in rows) == 4
    calls = [row for row in rows if "[tool call" in row["preview"]]
    assert calls and not any(row["branchable"] for row in calls)  # a tip there would orphan the call
    results = [row for row in rows if row["preview"] == "[tool result]"]
    assert results and not any(row["editable"] for row in results)  # only a person's prompts are editable
    assert by_id[rows[0]["id"]]["editable"] and by_id[rows[0]["id"]]["text"] == "Plan the migration."


@pytest.mark.req("CH-7")
@pytest.mark.req("CH-9")
def test_tree_page_draws_every_message_the_tip_and_checkpoints(alice, branched):
    Checkpoint.objects.create(conversation=branched, label="first", message_id=selectors.current_path(branched)[1].id)
    html = _client(alice).get(f"/conversations/{branched.pk}/tree/").content.decode()
    assert html.count('role="treeitem"') == 8
    assert f'id="m-{branched.tip_id}" role="treeitem" aria-level="2" aria-selected="true"' in html
    assert html.count('aria-selected="true"') == 1
    assert '<code class="chip">⚑ first</code>' in html
    assert 'class="secondary rewind" data-label="first"' in html  # on the path, behind the tip: rewindable
    assert 'id="fork"' in html and 'id="checkpoint-form"' in html
    assert 'id="tree-running"' not in html
    Run.objects.create(
        conversation=branched, trigger_id=branched.tip_id, provider="offline", model="m", status="running"
    )
    html = _client(alice).get(f"/conversations/{branched.pk}/tree/").content.decode()
    assert "A run is answering the prompt at the tip" in html  # why the tip will not move meanwhile


@pytest.mark.req("RN-3")
@pytest.mark.parametrize("page", ["tree", "context"])
def test_tree_and_context_pages_are_the_owners_only(alice, bob, branched, page):
    assert _client(alice).get(f"/conversations/{branched.pk}/{page}/").status_code == 200
    assert _client(bob).get(f"/conversations/{branched.pk}/{page}/").status_code == 404
    assert _client(alice).get(f"/conversations/999999/{page}/").status_code == 404
    assert Client().get(f"/conversations/{branched.pk}/{page}/").status_code == 302


@pytest.fixture
def catalog():
    catalog_import(text=CATALOG_PATH.read_text())


def _offloaded_turn(conversation: Conversation) -> tuple[Run, str]:
    """A finished run whose tool result was offloaded to the scratchpad, as the runtime writes it."""
    prompt = add_turn(conversation, "Read the log.", "Read.")[0]
    run = Run.objects.create(conversation=conversation, trigger=prompt, provider="offline", model="offline-1")
    entry, synthetic = put_observation(
        turn_id=str(run.pk),
        step_num=1,
        executor_name="read_file",
        observation={"ok": True, "path": "app.log", "content": "line\n" * 5000},
        threshold=4096,
        run_id=run.pk,
        conversation_id=conversation.pk,
    )
    add_turn(
        conversation, "Once more.", "Done.", tools=[("list_dir", {"entries": ["app.log"]}), ("read_file", synthetic)]
    )
    return run, entry.pk


@pytest.mark.req("TD-15")
@pytest.mark.req("CH-10")
def test_composed_context_counts_every_category_from_the_run_code_path(alice, branched, catalog):
    run, entry_id = _offloaded_turn(branched)
    view = turns.context_view(conversation=branched)
    by_name = {c["name"]: c["tokens"] for c in view["categories"]}
    assert list(by_name) == [
        "system", "resident_tools", "tool_prompt", "tool_index", "messages", "tool_results", "scratchpad",
        "images", "snapshots", "free",
    ]  # fmt: skip
    surface, _ = run_surface()
    tools = surface_context(surface)
    assert view["tools"] == tools  # the catalog's own figures, not a second estimate
    assert by_name["tool_index"] == tools["index"]["tokens"] > 0
    # The request's tool block is the resident set, the run's spawn_agents (TD-14) and
    # scratchpad_read while the turn has live entries (SP-7): the stack a run uses.
    assert view["extra_tools"] == ["spawn_agents", "scratchpad_read"]
    assert by_name["resident_tools"] > tools["resident_tokens"] > 0
    assert by_name["scratchpad"] > 0 and by_name["tool_results"] > 0  # the stub is not counted as a tool result
    assert by_name["scratchpad"] < 1000  # the summary, not the 25 KB it stands for
    assert view["used_tokens"] == sum(t for name, t in by_name.items() if name != "free")
    assert view["used_tokens"] + by_name["free"] == view["window_tokens"]
    assert view["turn"]["run"] == run.pk
    assert [e["id"] for e in view["scratchpad"]] == [entry_id]


@pytest.mark.req("TD-15")
def test_page_api_and_slash_command_show_the_same_context_figures(alice, alice_api, branched, catalog):
    _offloaded_turn(branched)
    api = alice_api.get(f"/api/conversations/{branched.pk}/context/").json()
    assert alice_api.get(f"/api/conversations/{branched.pk}/context").json() == api
    command = chat.message_send(conversation=branched, text="/context").command
    assert command.data == api
    html = _client(alice).get(f"/conversations/{branched.pk}/context/").content.decode()
    assert f'<strong id="used-tokens">{api["used_tokens"]:,}</strong>' in html
    for category in api["categories"]:
        assert f'<tr data-category="{category["name"]}"><td><span class="swatch seg-{category["name"]}"></span>' in html
        assert f'<td class="num">{category["tokens"]:,}</td>' in html
    assert html.count("<tr><td><code>") == len(api["tools"]["resident"]) + len(api["tools"]["deferred"])
    git_push = next(t for t in api["tools"]["deferred"] if t["name"] == "git_push")
    assert f'<tr><td><code>git_push</code></td><td>{git_push["group"]}</td><td class="num">' in html
    entry = api["scratchpad"][0]["id"]
    assert f'href="/scratchpad/{entry}/"' in html


@pytest.mark.req("SP-11")
@pytest.mark.req("RN-3")
def test_scratchpad_viewer_is_the_owners_only(alice, bob, branched):
    _, entry_id = _offloaded_turn(branched)
    response = _client(alice).get(f"/scratchpad/{entry_id}/")
    assert response.status_code == 200
    assert 'option value="grep"' in response.content.decode()
    assert _client(bob).get(f"/scratchpad/{entry_id}/").status_code == 404
    assert _client(alice).get("/scratchpad/0000000000000000/").status_code == 404


def test_conversation_page_links_the_tree_and_the_context_view(alice, branched):
    html = _client(alice).get(f"/conversations/{branched.pk}/").content.decode()
    assert f'href="/conversations/{branched.pk}/tree/" id="tree-link"' in html
    assert f'href="/conversations/{branched.pk}/context/" id="context-link"' in html


def test_context_of_an_empty_conversation_is_the_fixed_prefix_only(alice):
    conversation = Conversation.objects.create(owner=alice, title="empty")
    view = turns.context_view(conversation=conversation)
    by_name = {c["name"]: c["tokens"] for c in view["categories"]}
    assert by_name["messages"] == by_name["tool_results"] == by_name["scratchpad"] == 0
    assert by_name["system"] > 0 and view["scratchpad"] == [] and view["turn"]["run"] is None
    json.dumps(view)  # JSON-ready for the API
