"""Refuse oversized request bodies with 413 at the ASGI layer, before anything reads them (SB-5).

Django's ASGI handler spools a body to a temporary file as it arrives, so a Django middleware
runs only after the whole upload sits on disk. This wrapper sits in front of every HTTP app
(Django and `/mcp`), for authenticated and anonymous requests alike: a declared
`Content-Length` over the limit is answered at once, unread, and a body without one (chunked) is
counted as it streams and cut off at the limit. The refusal is in the REST API's error shape,
or a JSON-RPC error on `/mcp`.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from toolcatalog.mcp_server import jsonrpc_error_body, mcp_endpoint

Scope = dict[str, Any]
Receive = Any
Send = Any
App = Any


def _error(scope: Scope, code: str, message: str) -> bytes:
    if mcp_endpoint.handles(scope["path"]):
        # /mcp answers every error as JSON-RPC, as its clients expect: an Invalid Request.
        return jsonrpc_error_body(-32600, message)
    # The API's error shape (controlcenter.api.error_body), built here so this layer needs no DRF.
    return json.dumps({"error": {"code": code, "message": message, "details": {}}}).encode()


class BodySizeLimit:
    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        declared = None
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                declared = value
        if declared is not None:
            if not declared.isdigit() or len(declared) > 18:
                await _respond(send, 400, _error(scope, "invalid", "Content-Length is not a number."))
                return
            if int(declared) > limit:
                await _respond(send, 413, _error(scope, "request_too_large", _too_large(limit, int(declared))))
                return
        limited = _Limited(receive, send, limit, _error(scope, "request_too_large", _too_large(limit)))
        await self.app(scope, limited.receive, limited.send)


def _too_large(limit: int, length: int | None = None) -> str:
    size = f"has {length} bytes" if length is not None else "is larger than the limit"
    return f"The request body {size}; the limit is {limit} bytes (CC_MAX_REQUEST_BYTES)."


async def _respond(send: Send, status: int, body: bytes) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        # The rest of the body is never read, so this connection cannot carry another request.
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Limited:
    """Counts the body as it streams. Past the limit it answers 413 itself, tells the app the
    client left (Django then drops what it spooled), and drops whatever the app still sends."""

    def __init__(self, receive: Receive, send: Send, limit: int, refusal: bytes) -> None:
        self._receive = receive
        self._send = send
        self._limit = limit
        self._refusal = refusal
        self._seen = 0
        self._cut = False

    async def receive(self) -> dict:
        if self._cut:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self._seen += len(message.get("body", b""))
            if self._seen > self._limit:
                self._cut = True
                await _respond(self._send, 413, self._refusal)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: dict) -> None:
        if not self._cut:
            await self._send(message)
