"""A move of the tip that queues no run tells the tabs open on the conversation, once committed (UX-4):
a socket on the conversation hears `conversation_changed`, as it does for a queued run."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from controlcenter.routing import websocket_urlpatterns
from conversations.models import Checkpoint, Conversation
from conversations.services import message_delete
from tests.support.history import add_turn

pytestmark = pytest.mark.django_db(transaction=True)


def _heard(user, conversation: Conversation, change, *, expected: int = 1) -> list[dict]:
    """What a tab on `conversation` is told while `change()` runs: the `expected` events (each waited
    for as long as a loaded machine needs), then whatever else arrives in a quiet second."""

    async def scenario() -> list[dict]:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/conversations/{conversation.pk}/")
        communicator.scope["user"] = user
        assert (await communicator.connect(timeout=10))[0]
        await sync_to_async(change)()
        heard = [await communicator.receive_json_from(timeout=15) for _ in range(expected)]
        while not await communicator.receive_nothing(timeout=1):
            heard.append(await communicator.receive_json_from(timeout=1))
        await communicator.disconnect(timeout=10)
        return heard

    return async_to_sync(scenario)()


def _changed(reason: str, conversation: Conversation) -> dict:
    return {"type": "conversation_changed", "conversation_id": conversation.pk, "reason": reason}


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

    branched = [_changed("branch", conversation)]
    assert _heard(alice, conversation, post("branch/", {"message": first[-1].pk})) == branched
    # Already there: nothing moved, nothing to redraw.
    assert _heard(alice, conversation, post("branch/", {"message": first[-1].pk}), expected=0) == []
    assert _heard(alice, conversation, post("branch/", {"message": second[-1].pk})) == branched
    assert _heard(alice, conversation, post("rewind/", {"label": "start"})) == [_changed("rewind", conversation)]

    # The admin deletes the other branch of the prompt shown: its arrows (2/2) go.
    add_turn(conversation, "two, again", "answer two again")
    deleted = _heard(alice, conversation, lambda: message_delete(message=second[0]))
    assert deleted == [_changed("message_deleted", conversation)]
