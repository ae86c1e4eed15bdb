"""A rename, a picked model or mode and a new checkpoint tell the tabs open on the conversation, once
committed (UX-4): a socket on the conversation hears `conversation_changed` with its own reason, so a
tab shows the title and the pickers the next run uses. A compaction shows nothing on the page and
tells nobody."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from controlcenter.routing import websocket_urlpatterns
from conversations.models import Conversation
from tests.support.history import add_turn
from toolcatalog.models import Mode

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


def _call(api, method: str, url: str, body: dict, status: int = 200):
    def change() -> None:
        response = getattr(api, method)(url, body, format="json")
        assert response.status_code == status, response.content

    return change


@pytest.mark.req("UX-4", "UX-2")
@override_settings(CC_MODELS={"offline-1": "offline", "offline-2": "offline"})
def test_a_rename_and_each_picker_tell_the_open_tabs(alice, alice_api):
    conversation = Conversation.objects.create(owner=alice, title="tabs")
    mode = Mode.objects.create(name="tabs-mode", allow=["*"])
    url = f"/api/conversations/{conversation.pk}/"
    updated = [_changed("updated", conversation)]

    assert _heard(alice, conversation, _call(alice_api, "patch", url, {"title": "renamed"})) == updated
    assert _heard(alice, conversation, _call(alice_api, "patch", url, {"model": "offline-2"})) == updated
    assert _heard(alice, conversation, _call(alice_api, "patch", url, {"mode": mode.pk})) == updated
    # A refused value changes nothing, so there is nothing to show.
    refused = _call(alice_api, "patch", url, {"model": "no-such-model"}, status=400)
    assert _heard(alice, conversation, refused, expected=0) == []


@pytest.mark.req("UX-4", "CH-9", "CH-10")
def test_a_checkpoint_tells_the_open_tabs_and_a_compaction_tells_none(alice, alice_api):
    conversation = Conversation.objects.create(owner=alice, title="tabs")
    add_turn(conversation, "one", "answer one")
    checkpoints = f"/api/conversations/{conversation.pk}/checkpoints/"

    created = _call(alice_api, "post", checkpoints, {"label": "start"}, status=201)
    assert _heard(alice, conversation, created) == [_changed("checkpoint", conversation)]
    # Refused (the label is taken): nothing was stored.
    taken = _call(alice_api, "post", checkpoints, {"label": "start"}, status=409)
    assert _heard(alice, conversation, taken, expected=0) == []
    # The page shows no compaction (only the tab that ran it gets its note), so no tab is told.
    shaken = _call(alice_api, "post", f"/api/conversations/{conversation.pk}/messages/", {"text": "/shake"})
    assert _heard(alice, conversation, shaken, expected=0) == []
