"""REST endpoints for the tree, checkpoints, compaction, context, export and retry (CH-7..CH-10, RN-3)."""

from __future__ import annotations

import pytest

from agents.models import Run
from conversations import selectors
from conversations.models import Checkpoint, Compaction, Conversation, Message, RewindDigest
from tests.support.factories import ConversationFactory
from tests.support.history import add_turn

pytestmark = pytest.mark.django_db


def url(conversation: Conversation, route: str) -> str:
    return f"/api/conversations/{conversation.pk}/{route}"


def _snapshot() -> tuple:
    return (
        list(Message.objects.values_list("id", "parent_id", "content")),
        list(Conversation.objects.values_list("id", "tip_id")),
        Checkpoint.objects.count(),
        RewindDigest.objects.count(),
        Compaction.objects.count(),
        Run.objects.count(),
    )


@pytest.mark.req("CH-7")
def test_messages_lists_the_whole_tree_with_the_current_path(alice_api, explored):
    first_answer = selectors.current_path(explored)[1]
    response = alice_api.post(url(explored, "branch/"), {"message": first_answer.pk}, format="json")
    assert response.status_code == 200
    add_turn(explored, "Side quest.", "Side answer.")
    response = alice_api.get(url(explored, "messages/"))
    assert response.status_code == 200
    tree = response.json()
    assert tree["tip"] == explored.tip_id and len(tree["messages"]) == 8
    assert tree["roots"] == [selectors.current_path(explored)[0].pk]
    on_path = [m["id"] for m in tree["messages"] if m["on_path"]]
    assert on_path == [m.pk for m in selectors.current_path(explored)]
    by_id = {m["id"]: m for m in tree["messages"]}
    assert len(by_id[first_answer.pk]["children"]) == 2


@pytest.mark.req("CH-7")
@pytest.mark.req("CH-8")
@pytest.mark.req("CH-9")
def test_branch_edit_fork_checkpoint_rewind_over_the_api(alice_api, explored):
    path = selectors.current_path(explored)
    response = alice_api.post(url(explored, "checkpoints/"), {"label": "listed"}, format="json")
    assert response.status_code == 201 and response.json()["message"] == explored.tip_id
    assert [c["label"] for c in alice_api.get(url(explored, "checkpoints/")).json()] == ["listed"]

    response = alice_api.post(url(explored, f"messages/{path[2].pk}/edit/"), {"text": "List more."}, format="json")
    assert response.status_code == 201 and response.json()["message"]["parent"] == path[1].pk
    Run.objects.update(status=Run.Status.SUCCEEDED)

    response = alice_api.post(url(explored, "branch/"), {"message": path[-1].pk}, format="json")
    assert response.status_code == 200 and response.json()["tip"] == path[-1].pk
    add_turn(explored, "Explore.", "Explored.")
    response = alice_api.post(url(explored, "rewind/"), {"label": "listed"}, format="json")
    assert response.status_code == 200 and response.json()["digest"]["tried"] == ["Explore."]
    assert len(alice_api.get(url(explored, "rewind/")).json()) == 1

    response = alice_api.post(url(explored, "fork/"), {"title": "Copy"}, format="json")
    assert response.status_code == 201 and response.json()["title"] == "Copy"
    assert alice_api.get(f"/api/conversations/{response.json()['id']}/").status_code == 200
    assert alice_api.get(url(explored, f"messages/{path[0].pk}/")).json()["content"] == path[0].content


@pytest.mark.req("CH-10")
def test_compact_context_export_and_slash_commands_over_the_api(alice_api, explored, settings):
    settings.CC_COMPACT_TAIL_TOKENS = 256
    add_turn(explored, "Read it.", "Read.", tools=[("read_file", {"ok": True, "text": "z " * 4000})])
    add_turn(explored, "Again.", "Done.")
    response = alice_api.post(url(explored, "compact/"), {"rungs": ["elide", "drop_images"]}, format="json")
    assert response.status_code == 201 and [s["rung"] for s in response.json()["steps"]] == ["elide", "drop_images"]
    assert len(alice_api.get(url(explored, "compact/")).json()) == 1
    context = alice_api.get(url(explored, "context/")).json()
    assert context["categories"][-1]["name"] == "free"
    exported = alice_api.get(url(explored, "export/json/")).json()
    assert len(exported["messages"]) == 6 + 6
    markdown = alice_api.get(url(explored, "export/markdown/"))
    assert markdown["Content-Type"].startswith("text/markdown") and b"# History" in markdown.content
    response = alice_api.post(url(explored, "messages/"), {"text": "/tree"}, format="json")
    assert response.status_code == 200 and response.json()["command"]["command"] == "tree"


@pytest.mark.req("CH-5")
def test_retry_over_the_api_says_which_empty_case_it_is(alice_api, alice, explored):
    response = alice_api.post(url(explored, "retry/"))
    assert response.status_code == 409 and response.json()["error"]["code"] == "nothing_to_retry"
    empty = ConversationFactory(owner=alice, title="Empty")
    response = alice_api.post(url(empty, "retry/"))
    assert response.status_code == 409 and response.json()["error"]["code"] == "nothing_loaded"


@pytest.mark.req("CH-10")
@pytest.mark.parametrize(
    ("method", "route", "payload", "fragment"),
    [
        ("post", "branch/", {"message": "abc"}, "message"),
        ("post", "branch/", {}, "message"),
        ("post", "checkpoints/", {"label": "no spaces allowed"}, "not a valid label"),
        ("post", "checkpoints/", {"label": "v1\n"}, "not a valid label"),
        ("post", "checkpoints/", {}, "label"),
        # A number is no label: DRF's CharField stored 42 as "42".
        ("post", "checkpoints/", {"label": 42}, "Must be a string, not int"),
        ("post", "rewind/", {"label": 42}, "Must be a string, not int"),
        ("post", "compact/", {"rungs": ["summarise"]}, "rungs"),
        ("post", "compact/", {"rungs": []}, "rungs"),
        ("post", "messages/", {"text": "/rewind a b"}, "at most one label"),
        ("post", "messages/", {"text": "/branch x"}, "needs one message id"),
        ("post", "messages/{answer}/edit/", {"text": "x"}, "not a prompt you wrote"),
        ("post", "messages/{prompt}/edit/", {"text": "  "}, "empty"),
        ("get", "export/pdf/", None, "Unknown export format"),
    ],
)
def test_bad_input_is_a_400_with_a_message_and_nothing_is_stored(alice_api, explored, method, route, payload, fragment):
    path = selectors.current_path(explored)
    route = route.format(answer=path[-1].pk, prompt=path[0].pk)
    before = _snapshot()
    response = getattr(alice_api, method)(url(explored, route), payload, format="json")
    assert response.status_code == 400, response.content
    assert fragment in str(response.json())
    assert _snapshot() == before


@pytest.mark.req("CH-10")
@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("get", "messages/"),
        ("post", "messages/"),
        ("get", "messages/{first}/"),
        ("post", "messages/{first}/edit/"),
        ("post", "branch/"),
        ("post", "fork/"),
        ("get", "checkpoints/"),
        ("post", "checkpoints/"),
        ("post", "rewind/"),
        ("post", "compact/"),
        ("get", "context/"),
        ("get", "export/json/"),
        ("post", "retry/"),
    ],
)
def test_only_the_owner_reaches_a_conversation(bob_api, explored, method, route):
    first = selectors.current_path(explored)[1].pk
    before = _snapshot()
    payload = {"message": first, "label": "x", "text": "/fork"}
    response = getattr(bob_api, method)(url(explored, route.format(first=first)), payload, format="json")
    assert response.status_code == 404
    assert _snapshot() == before


@pytest.mark.req("UX-8")
@pytest.mark.parametrize(
    ("method", "route", "payload", "status", "fragment"),
    [
        ("post", "branch/", {"message": 999999}, 404, "not part of conversation"),
        ("post", "messages/999999/edit/", {"text": "x"}, 404, "not part of conversation"),
        ("post", "messages/999999/regenerate/", {}, 404, "not part of conversation"),
        ("post", "rewind/", {"label": "missing"}, 404, "no checkpoint named"),
        ("post", "checkpoints/", {"label": "twice"}, 409, "already exists"),
    ],
)
def test_a_missing_object_is_a_404_and_a_state_conflict_a_409_and_nothing_is_stored(
    alice_api, explored, method, route, payload, status, fragment
):
    assert alice_api.post(url(explored, "checkpoints/"), {"label": "twice"}, format="json").status_code == 201
    before = _snapshot()
    response = getattr(alice_api, method)(url(explored, route), payload, format="json")
    assert response.status_code == status, response.content
    assert fragment in response.json()["error"]["message"]
    assert _snapshot() == before


@pytest.mark.req("UX-8")
def test_an_empty_conversation_refuses_fork_checkpoint_and_compact_with_a_409(alice, alice_api):
    empty = Conversation.objects.create(owner=alice, title="Empty")
    for route, payload in (("fork/", {}), ("checkpoints/", {"label": "start"}), ("compact/", {})):
        response = alice_api.post(url(empty, route), payload, format="json")
        assert response.status_code == 409, (route, response.content)
        assert "no messages yet" in response.json()["error"]["message"]


@pytest.mark.req("CH-7", "UX-8")
def test_branch_is_refused_while_a_run_works_as_every_move_of_the_tip_is(alice_api, explored):
    path = selectors.current_path(explored)
    running = Run.objects.create(
        conversation=explored, trigger_id=path[-2].id, provider="offline", model="offline-1", status="running"
    )
    before = _snapshot()
    for route, payload in (("branch/", {"message": path[1].id}), ("messages/", {"text": f"/branch {path[1].id}"})):
        response = alice_api.post(url(explored, route), payload, format="json")
        assert response.status_code == 409, (route, response.content)
        assert response.json()["error"]["code"] == "run_in_progress"  # worth sending again once the run ends
        assert "still in progress" in response.json()["error"]["message"]
    assert _snapshot() == before  # the answer the run writes lands on the path it was asked on
    running.status = "succeeded"
    running.save()
    assert alice_api.post(url(explored, "branch/"), {"message": path[1].id}, format="json").status_code == 200
