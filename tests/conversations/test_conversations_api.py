"""Conversations and messages through the REST API, including what bad input gets."""

from __future__ import annotations

import pytest

from agents.models import Run
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


def _snapshot() -> tuple[int, int, int]:
    return Conversation.objects.count(), Message.objects.count(), Run.objects.count()


def test_create_and_list_only_own_conversations(alice_api, bob_api):
    created = alice_api.post("/api/conversations/", {"title": "Logs"}, format="json")
    assert created.status_code == 201
    assert created.json()["title"] == "Logs"
    bob_api.post("/api/conversations/", {"title": "Bob's"}, format="json")
    titles = [c["title"] for c in alice_api.get("/api/conversations/").json()]
    assert titles == ["Logs"]


@pytest.mark.req("RN-3")
def test_the_list_comes_in_pages_newest_first_and_refuses_a_bad_page(alice, alice_api):
    Conversation.objects.bulk_create(Conversation(owner=alice, title=f"c{i}") for i in range(60))
    first = alice_api.get("/api/conversations/").json()
    rest = alice_api.get("/api/conversations/?offset=50").json()
    assert len(first) == 50 and len(rest) == 10
    listed = [c["id"] for c in first + rest]
    assert listed == [c.pk for c in Conversation.objects.order_by("-updated_at", "-id")]
    assert [c["id"] for c in alice_api.get("/api/conversations/?limit=200").json()] == listed
    assert alice_api.get("/api/conversations/?limit=5&offset=3&q=c1").json()[0]["title"].startswith("c1")
    for query, field in [("limit=0", "limit"), ("limit=201", "limit"), ("limit=x", "limit"), ("offset=-1", "offset")]:
        refused = alice_api.get(f"/api/conversations/?{query}")
        assert refused.status_code == 400 and field in refused.json()["error"]["message"], refused.json()


@pytest.mark.req("RN-3")
def test_posting_a_message_appends_it_under_the_tip_and_queues_a_run(alice_api, django_capture_on_commit_callbacks):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    with django_capture_on_commit_callbacks() as callbacks:
        response = alice_api.post(
            f"/api/conversations/{conversation['id']}/messages/", {"text": "hello"}, format="json"
        )
    assert response.status_code == 201
    body = response.json()
    assert body["run"]["status"] == "queued"
    assert body["message"]["content"] == [{"type": "text", "text": "hello"}]
    assert Conversation.objects.get(pk=conversation["id"]).tip_id == body["message"]["id"]
    # Only once the message and run rows are committed are the conversation's open tabs told
    # (UX-4) and the turn handed to a worker.
    assert len(callbacks) == 2


@pytest.mark.req("RN-3")
def test_posting_to_another_users_conversation_is_404_and_stores_nothing(alice_api, bob_api):
    conversation = bob_api.post("/api/conversations/", {}, format="json").json()
    before = _snapshot()
    response = alice_api.post(f"/api/conversations/{conversation['id']}/messages/", {"text": "hi"}, format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert alice_api.get(f"/api/conversations/{conversation['id']}/").status_code == 404
    assert _snapshot() == before


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "empty"), ("   \n ", "empty"), ("x" * (1024 * 1024 + 1), "the limit is")],
    ids=["empty", "whitespace", "over-1MB"],
)
def test_empty_or_huge_message_is_400_with_a_message_and_stores_nothing(alice_api, text, message):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    before = _snapshot()
    response = alice_api.post(f"/api/conversations/{conversation['id']}/messages/", {"text": text}, format="json")
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert _snapshot() == before


def test_message_without_text_field_is_400(alice_api):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    response = alice_api.post(f"/api/conversations/{conversation['id']}/messages/", {"txt": "hi"}, format="json")
    assert response.status_code == 400
    assert "text" in response.json()["error"]["message"]


def test_malformed_json_is_400(alice_api):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    before = _snapshot()
    response = alice_api.post(
        f"/api/conversations/{conversation['id']}/messages/", data="{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]
    assert _snapshot() == before


def test_second_message_while_a_run_is_in_progress_is_409(alice_api):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    url = f"/api/conversations/{conversation['id']}/messages/"
    assert alice_api.post(url, {"text": "first"}, format="json").status_code == 201
    before = _snapshot()
    response = alice_api.post(url, {"text": "second"}, format="json")
    assert response.status_code == 409
    assert "in progress" in response.json()["error"]["message"]
    assert _snapshot() == before


def test_unauthenticated_api_is_refused(client):
    assert client.get("/api/conversations/").status_code in (401, 403)


def test_run_of_another_user_is_invisible(alice_api, bob_api):
    conversation = bob_api.post("/api/conversations/", {}, format="json").json()
    run = bob_api.post(f"/api/conversations/{conversation['id']}/messages/", {"text": "x"}, format="json").json()["run"]
    assert alice_api.get(f"/api/runs/{run['id']}/").status_code == 404
    assert alice_api.get(f"/api/runs/{run['id']}/events/").status_code == 404
    assert alice_api.post(f"/api/runs/{run['id']}/cancel/").status_code == 404
    assert Run.objects.get(pk=run["id"]).status == "queued"


def test_events_after_must_be_a_number(alice_api):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    run = alice_api.post(f"/api/conversations/{conversation['id']}/messages/", {"text": "x"}, format="json").json()[
        "run"
    ]
    for after in ("abc", "-1", "\u00b2", "9" * 19):  # '²' is a digit to str.isdigit(), not to int()
        response = alice_api.get(f"/api/runs/{run['id']}/events/", {"after": after})
        assert response.status_code == 400, after
        assert response.json()["error"]["details"]["after"], after
    for bad_run in ("x", "\u00b2"):
        response = alice_api.get("/api/metrics/cache/", {"group": "run", "run": bad_run})
        assert response.status_code == 400 and "run" in response.json()["error"]["details"], bad_run


def test_cancel_a_queued_run_then_cancel_again_is_409(alice_api):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    run = alice_api.post(f"/api/conversations/{conversation['id']}/messages/", {"text": "x"}, format="json").json()[
        "run"
    ]
    assert alice_api.post(f"/api/runs/{run['id']}/cancel/").json()["status"] == "cancelled"
    again = alice_api.post(f"/api/runs/{run['id']}/cancel/")
    assert again.status_code == 409


def test_openapi_schema_is_served(alice_api):
    response = alice_api.get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/conversations/" in response.content


@pytest.mark.req("RN-3")
def test_the_conversation_can_be_read_without_its_path_and_a_bad_choice_is_a_400(alice_api):
    conversation = alice_api.post("/api/conversations/", {"title": "settings"}, format="json").json()
    alice_api.post(f"/api/conversations/{conversation['id']}/messages/", {"text": "hi"}, format="json")
    url = f"/api/conversations/{conversation['id']}/"
    whole, light = alice_api.get(url).json(), alice_api.get(url, {"path": "0"}).json()
    assert [m["content"] for m in whole["path"]] == [[{"type": "text", "text": "hi"}]]
    assert light == {"conversation": whole["conversation"], "path": None}
    refused = alice_api.get(url, {"path": "no"})
    assert refused.status_code == 400 and "'no' is not 0 or 1" in refused.content.decode()
