"""A move of the tip that queues no run tells the tabs open on the conversation, once committed (UX-4):
a socket on the conversation hears `conversation_changed`, as it does for a queued run."""

from __future__ import annotations

import pytest

from conversations.models import Checkpoint, Conversation
from conversations.services import message_delete
from tests.support.history import add_turn
from tests.support.sockets import changed, heard_while

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.req("UX-4", "CH-7", "CH-9")
def test_a_branch_a_rewind_and_a_deleted_message_each_tell_the_open_tabs(alice, alice_api):
    conversation = Conversation.objects.create(owner=alice, title="tabs")
    first = add_turn(conversation, "one", "answer one")
    Checkpoint.objects.create(conversation=conversation, label="start", message=first[-1])
    second = add_turn(conversation, "two", "answer two")

    def post(route: str, body: dict):
        def change() -> None:
            response = alice_api.post(f"/api/conversations/{conversation.pk}/{route}", body, format="json")
            assert response.status_code == 200, response.content

        return change

    branched = [changed("branch", conversation)]
    assert heard_while(alice, conversation, post("branch/", {"message": first[-1].pk})) == branched
    # Already there: nothing moved, nothing to redraw.
    assert heard_while(alice, conversation, post("branch/", {"message": first[-1].pk}), expected=0) == []
    assert heard_while(alice, conversation, post("branch/", {"message": second[-1].pk})) == branched
    assert heard_while(alice, conversation, post("rewind/", {"label": "start"})) == [changed("rewind", conversation)]

    # The admin deletes the other branch of the prompt shown: its arrows (2/2) go.
    add_turn(conversation, "two, again", "answer two again")
    deleted = heard_while(alice, conversation, lambda: message_delete(message=second[0]))
    assert deleted == [changed("message_deleted", conversation)]
