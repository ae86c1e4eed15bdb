"""Websocket transport for run events: authenticate, join one group, forward.

Messages arrive already serialised (`agents.events.frame`): a consumer forwards the text as it
is, so an event is encoded once however many sockets watch it (RN-1).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from agents import selectors
from agents.events import conversation_group, dashboard_group, over_fresh_connection, run_group

logger = logging.getLogger(__name__)


# A websocket close code of RFC 6455's registry: "Try Again Later".
TRY_AGAIN_LATER = 1013


class _GroupConsumer(AsyncWebsocketConsumer):
    """A socket that joins one channel-layer group and forwards what is sent to it.

    With Redis down, a socket is accepted and closed "try again later" at once, with one line in
    the log: each attempt was an HTTP 500 and a traceback (QA: 286 in 6 s of outage), though the
    page only has to come back, as its backoff makes it, once Redis is."""

    group: str = ""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except RedisError as exc:
            # Joining the group failed, or the socket's own channel, which Channels reads beside it.
            logger.warning("websocket closed at once: the channel layer is unreachable (%s)", exc)
            # Each refused by the server when already done (an open socket whose Redis went away).
            for message in ({"type": "websocket.accept"}, {"type": "websocket.close", "code": TRY_AGAIN_LATER}):
                with contextlib.suppress(Exception):
                    await send(message)

    async def join(self) -> None:
        await over_fresh_connection(lambda: self.channel_layer.group_add(self.group, self.channel_name))
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            with contextlib.suppress(RedisConnectionError):  # gone with Redis; nothing left to leave
                await over_fresh_connection(lambda: self.channel_layer.group_discard(self.group, self.channel_name))


class _EventsConsumer(_GroupConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await self.may_watch(user):
            await self.close(code=4404)
            return
        await self.join()

    async def run_event(self, message: dict[str, Any]) -> None:
        await self.send(text_data=message["text"])

    async def may_watch(self, user: Any) -> bool:
        raise NotImplementedError


class RunEventsConsumer(_EventsConsumer):
    async def may_watch(self, user: Any) -> bool:
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        self.group = run_group(run_id)
        return await database_sync_to_async(selectors.run_visible_to)(run_id=run_id, user=user)


class ConversationEventsConsumer(_EventsConsumer):
    async def may_watch(self, user: Any) -> bool:
        conversation_id = self.scope["url_route"]["kwargs"]["conversation_id"]
        self.group = conversation_group(conversation_id)
        return await database_sync_to_async(selectors.conversation_visible_to)(
            conversation_id=conversation_id, user=user
        )


class DashboardConsumer(_GroupConsumer):
    """The signed-in user's dashboard figures, pushed when one of their runs finishes."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.group = dashboard_group(user.pk)
        await self.join()

    async def dashboard_update(self, message: dict[str, Any]) -> None:
        await self.send(text_data=message["text"])
