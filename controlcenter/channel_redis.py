"""The channel layer's Redis connections: ones that never lose a cancellation.

redis-py writes every command under `asyncio.wait_for(..., socket_timeout)`. On Python 3.11,
`wait_for` returns the inner result when the write finishes in the same loop step as a
`cancel()` of the calling task, and the cancellation is gone (3.12 rewrote `wait_for` on
`asyncio.timeout`). channels cancels a consumer's channel-layer `receive` when its websocket
closes. When that cancel landed while the receive was writing a command (always so when it had
to open a new connection: HELLO, CLIENT SETINFO, SELECT), the receive went on into its
`BZPOPMIN` loop and never returned. The consumer never ended, and a SIGTERM to `serve` waited for
it until it was killed (OP-1). Seen every time with a refused websocket in the test suite.

A write whose task gained a cancel request and came back normally raises the CancelledError it
should have raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection, parse_url


class _KeepsCancellation:
    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        task = asyncio.current_task()
        requested = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)  # type: ignore[misc]
        if task is not None and task.cancelling() > requested:
            raise asyncio.CancelledError


class KeepsCancellationConnection(_KeepsCancellation, Connection):
    pass


class KeepsCancellationSSLConnection(_KeepsCancellation, SSLConnection):
    pass


class KeepsCancellationUnixConnection(_KeepsCancellation, UnixDomainSocketConnection):
    pass


def channel_layer_host(url: str, **options: Any) -> dict[str, Any]:
    """channels_redis's host entry for `url` (redis://, rediss:// or unix://) with these connections.

    Given an "address", channels_redis builds the pool with `ConnectionPool.from_url`, which sets
    the connection class from the URL's scheme over any passed in; so the URL is parsed here.
    """
    kwargs = parse_url(url)
    plain = kwargs.get("connection_class", Connection)
    kwargs["connection_class"] = {
        Connection: KeepsCancellationConnection,
        SSLConnection: KeepsCancellationSSLConnection,
        UnixDomainSocketConnection: KeepsCancellationUnixConnection,
    }[plain]
    return {**kwargs, **options}
