"""What a tab open on a conversation hears over its websocket while something changes (UX-4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from controlcenter.routing import websocket_urlpatterns


def heard_while(user: Any, conversation: Any, change: Callable[[], None], *, expected: int = 1) -> list[dict]:
    """The events a socket on `conversation` receives while `change()` runs: the `expected` ones (each
    waited for as long as a loaded machine needs), then whatever else arrives in a quiet second."""

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


def changed(reason: str, conversation: Any) -> dict:
    """The `conversation_changed` event a tab hears for `reason`."""
    return {"type": "conversation_changed", "conversation_id": conversation.pk, "reason": reason}
