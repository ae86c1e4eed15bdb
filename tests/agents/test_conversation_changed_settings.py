"""A rename, a picked model or mode and a new checkpoint tell the tabs open on the conversation, once
committed (UX-4): a socket on the conversation hears `conversation_changed` with its own reason, so a
tab shows the title and the pickers the next run uses. A compaction shows nothing on the page and
tells nobody."""

from __future__ import annotations

import pytest
from django.test import override_settings

from conversations.models import Checkpoint, Conversation
from tests.support.history import add_turn
from tests.support.sockets import changed, heard_while
from toolcatalog.models import Mode

pytestmark = pytest.mark.django_db(transaction=True)


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
    updated = [changed("updated", conversation)]

    assert heard_while(alice, conversation, _call(alice_api, "patch", url, {"title": "renamed"})) == updated
    assert heard_while(alice, conversation, _call(alice_api, "patch", url, {"model": "offline-2"})) == updated
    assert heard_while(alice, conversation, _call(alice_api, "patch", url, {"mode": mode.pk})) == updated
    # A refused value changes nothing, so there is nothing to show.
    refused = _call(alice_api, "patch", url, {"model": "no-such-model"}, status=400)
    assert heard_while(alice, conversation, refused, expected=0) == []


@pytest.mark.req("UX-4", "CH-9", "CH-10")
def test_a_checkpoint_tells_the_open_tabs_and_a_compaction_tells_none(alice, alice_api):
    conversation = Conversation.objects.create(owner=alice, title="tabs")
    add_turn(conversation, "one", "answer one")
    checkpoints = f"/api/conversations/{conversation.pk}/checkpoints/"

    created = _call(alice_api, "post", checkpoints, {"label": "start"}, status=201)
    assert heard_while(alice, conversation, created) == [changed("checkpoint", conversation)]
    # Refused (the label is taken): nothing was stored.
    taken = _call(alice_api, "post", checkpoints, {"label": "start"}, status=409)
    assert heard_while(alice, conversation, taken, expected=0) == []
    # The page shows no compaction (only the tab that ran it gets its note), so no tab is told.
    shaken = _call(alice_api, "post", f"/api/conversations/{conversation.pk}/messages/", {"text": "/shake"})
    assert heard_while(alice, conversation, shaken, expected=0) == []


@pytest.mark.req("UX-4", "CH-9")
def test_a_checkpoint_renamed_or_deleted_in_the_admin_tells_the_open_tabs(alice, admin_client):
    conversation = Conversation.objects.create(owner=alice, title="tabs")
    first = add_turn(conversation, "one", "answer one")
    checkpoint = Checkpoint.objects.create(conversation=conversation, label="start", message=first[-1])
    told = [changed("checkpoint", conversation)]

    def rename() -> None:
        response = admin_client.post(f"/admin/conversations/checkpoint/{checkpoint.pk}/change/", {"label": "begin"})
        assert response.status_code == 302, response.content

    def delete() -> None:
        response = admin_client.post(f"/admin/conversations/checkpoint/{checkpoint.pk}/delete/", {"post": "yes"})
        assert response.status_code == 302, response.content

    assert heard_while(alice, conversation, rename) == told
    checkpoint.refresh_from_db()
    assert checkpoint.label == "begin"
    assert heard_while(alice, conversation, delete) == told
    assert not Checkpoint.objects.filter(pk=checkpoint.pk).exists()
