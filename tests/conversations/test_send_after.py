"""A prompt goes under the answer its sender saw, or nowhere (CH-7, UX-4)."""

from __future__ import annotations

import pytest

from agents.models import Run
from conversations import selectors
from conversations.models import Conversation, Message
from tests.support.factories import ConversationFactory


def _send(client, conversation: Conversation, body: dict):
    return client.post(f"/api/conversations/{conversation.pk}/messages/", body, format="json")


@pytest.mark.django_db
@pytest.mark.req("CH-7")
def test_a_prompt_sent_after_another_tab_moved_the_tip_is_refused_and_nothing_is_stored(alice_api, explored):
    # QA: tab A switched to another answer; tab B, still showing the first one, sent a follow-up,
    # which was stored under the answer tab A had chosen, one the sender never saw.
    path = selectors.current_path(explored)
    shown_tip, other_answer = explored.tip_id, path[1].pk
    assert (
        alice_api.post(
            f"/api/conversations/{explored.pk}/branch/", {"message": other_answer}, format="json"
        ).status_code
        == 200
    )
    before = Message.objects.count()

    refused = _send(alice_api, explored, {"text": "Follow-up to what I see.", "after": shown_tip})

    assert refused.status_code == 409
    assert f"its tip is now message {other_answer}, not message {shown_tip}" in refused.json()["error"]["message"]
    explored.refresh_from_db()
    assert Message.objects.count() == before and explored.tip_id == other_answer
    assert not Run.objects.filter(conversation=explored).exists()

    sent = _send(alice_api, explored, {"text": "Follow-up to what I see.", "after": other_answer})
    assert sent.status_code == 201 and sent.json()["message"]["parent"] == other_answer


@pytest.mark.django_db
@pytest.mark.req("CH-7")
def test_a_tip_that_only_went_on_along_the_same_path_takes_the_prompt(alice, alice_api, explored):
    # The page drew the conversation before its own run's answer came: the answer is below what
    # it saw, so the prompt goes under the answer, as the page shows it once the stream ends.
    path = selectors.current_path(explored)
    sent = _send(alice_api, explored, {"text": "Go on.", "after": path[-3].pk})
    assert sent.status_code == 201 and sent.json()["message"]["parent"] == path[-1].pk
    empty = ConversationFactory(owner=alice)
    assert _send(alice_api, empty, {"text": "First.", "after": None}).status_code == 201
    Run.objects.update(status=Run.Status.SUCCEEDED)
    assert _send(alice_api, empty, {"text": "Second."}).status_code == 201  # a client that does not say
    Run.objects.update(status=Run.Status.SUCCEEDED)
    for bad in ("seven", 0, True, [1]):
        response = _send(alice_api, empty, {"text": "Third.", "after": bad})
        assert response.status_code == 400 and "after" in str(response.json()), (bad, response.json())


@pytest.mark.django_db
@pytest.mark.req("CH-7")
def test_a_stale_tip_on_an_empty_conversation_says_it_is_empty(alice, alice_api, explored):
    # QA: "its tip is now message None, not 4".
    empty = ConversationFactory(owner=alice)
    refused = _send(alice_api, empty, {"text": "Hello?", "after": explored.tip_id})
    assert refused.status_code == 409
    message = refused.json()["error"]["message"]
    assert f"its tip is now no message (it is empty), not message {explored.tip_id}" in message
    assert "None" not in message and not Message.objects.filter(conversation=empty).exists()
