"""What the message tree tells the apps above it, which this app never imports."""

from __future__ import annotations

from django.db import transaction
from django.dispatch import Signal

# Sent with `conversation_id` and `reason` once a change to what a conversation shows commits without
# queueing a run (a run announces itself): `agents` tells the tabs open on it to redraw (UX-4).
conversation_changed = Signal()


def announce_on_commit(*, conversation_id: int, reason: str) -> None:
    """Send `conversation_changed` when the current transaction commits (at once outside one): a tab
    told earlier would fetch the conversation as it was."""
    transaction.on_commit(
        lambda: conversation_changed.send(sender=None, conversation_id=conversation_id, reason=reason)
    )
