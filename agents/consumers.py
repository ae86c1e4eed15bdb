"""Websocket transport for run events: authenticate, join one group, forward.

Messages arrive already serialised (`agents.events.frame`): a consumer forwards the text as it
is, so an event is encoded once however many sockets watch it (RN-1).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from agents import selectors
from agents.events import conversation_group, dashboard_group, over_fresh_connection, run_group


class _EventsConsumer(AsyncWebsocketConsumer):
    group: str = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await self.may_watch(user):
            await self.close(code=4404)
            return
        await over_fresh_connection(lambda: self.channel_layer.group_add(self.group, self.channel_name))
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await over_fresh_connection(lambda: self.channel_layer.group_discard(self.group, self.channel_name))

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


class DashboardConsumer(AsyncWebsocketConsumer):
    """The signed-in user's dashboard figures, pushed when one of their runs finishes."""

    group: str = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.group = dashboard_group(user.pk)
        await over_fresh_connection(lambda: self.channel_layer.group_add(self.group, self.channel_name))
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await over_fresh_connection(lambda: self.channel_layer.group_discard(self.group, self.channel_name))

    async def dashboard_update(self, message: dict[str, Any]) -> None:
        await self.send(text_data=message["text"])
