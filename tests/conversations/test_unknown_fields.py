"""Every conversation action that takes a body refuses a field it does not take, naming it, and
changes nothing (UX-8). QA: `fork/` with `titel` made a fork with the default title, `compact/`
with `rung` ran the default rungs, and `edit/` with `after` ran without the stale-tip check the
client asked for."""

from __future__ import annotations

import pytest

from agents.models import Run
from conversations.models import Checkpoint, Compaction, Conversation, Message

pytestmark = pytest.mark.django_db


def _state(conversation: Conversation) -> tuple:
    conversation.refresh_from_db()
    return (
        conversation.tip_id,
        conversation.title,
        Conversation.objects.count(),
        Message.objects.count(),
        Run.objects.count(),
        Checkpoint.objects.count(),
        Compaction.objects.count(),
    )


@pytest.mark.req("UX-8")
@pytest.mark.parametrize(
    ("action", "body", "takes"),
    [
        ("messages/", {"text": "hi", "unknown": 1}, "text, after"),
        ("messages/{prompt}/edit/", {"text": "ok", "after": 3}, "text"),
        ("branch/", {"message": "{prompt}", "tip": 1}, "message"),
        ("fork/", {"titel": "My fork"}, "title"),
        ("checkpoints/", {"label": "before", "message": 1}, "label"),
        ("rewind/", {"label": "before", "to": 1}, "label"),
        ("compact/", {"rung": ["elide"]}, "rungs"),
    ],
)  # fmt: skip
def test_an_unknown_field_is_a_400_that_names_it_and_changes_nothing(alice_api, explored, action, body, takes):
    prompt = Message.objects.filter(conversation=explored, role="user").order_by("id").first()
    assert prompt is not None
    url = f"/api/conversations/{explored.pk}/{action.format(prompt=prompt.pk)}"
    payload = {key: prompt.pk if value == "{prompt}" else value for key, value in body.items()}
    before = _state(explored)

    response = alice_api.post(url, payload, format="json")

    assert response.status_code == 400, response.content
    unknown = (set(payload) - set(takes.split(", "))).pop()
    assert f"{unknown}: Unknown field; this endpoint takes {takes}." in response.json()["error"]["message"]
    assert _state(explored) == before
