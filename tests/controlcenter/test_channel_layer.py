"""The Redis channel layer as the consumers use it (OP-1): a closed websocket's consumer ends."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from controlcenter.routing import websocket_urlpatterns

pytestmark = pytest.mark.integration


@pytest.mark.req("OP-1")
def test_a_closed_websockets_consumer_ends_at_once_even_while_its_receive_opens_a_connection(settings):
    """A refused socket closes while its consumer's first channel-layer receive is still opening
    its Redis connection, the moment Python 3.11's wait_for used to swallow the cancellation
    (controlcenter/channel_redis.py): the consumer then never ended, and `serve` could not stop."""
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"

    async def refused_and_closed() -> float:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/runs/1/")
        communicator.scope["user"] = AnonymousUser()
        assert await communicator.connect(timeout=10) == (False, 4401)
        started = time.monotonic()
        await communicator.disconnect(timeout=5)  # returns after 5 s when the consumer is stuck
        return time.monotonic() - started

    durations = []
    for _ in range(5):
        channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)  # a new layer: new connections
        durations.append(async_to_sync(refused_and_closed)())
    assert max(durations) < 2, durations
