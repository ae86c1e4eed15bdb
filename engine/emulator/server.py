"""The emulator over HTTP on 127.0.0.1, for the official SDKs and any other client.

Routes as the real services have them: `POST /v1/messages` (JSON, or SSE with
`"stream": true`), `POST /v1/messages/count_tokens`, and the OpenAI-compatible
`POST /v1/chat/completions`. Streams use chunked transfer encoding, so a stream
cut (an injected fault) is a connection dropped before the final chunk, which
clients see as an incomplete body, exactly as with a real network failure.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from engine.emulator import ApiError, Emulator, StreamCut


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"data": [{"id": "emulator", "type": "model"}], "object": "list"})
        else:
            self._json(
                404, {"type": "error", "error": {"type": "not_found_error", "message": f"Not found: {self.path}"}}
            )

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        openai = path.endswith("/chat/completions")
        try:
            payload = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            if not isinstance(payload, dict):
                raise ApiError(400, "invalid_request_error", "The request body must be a JSON object.")
            if path == "/v1/messages":
                self._messages(payload)
            elif path == "/v1/messages/count_tokens":
                self._json(200, {"input_tokens": self.server.emulator.count_tokens(payload)})
            elif openai:
                self._chat_completions(payload)
            else:
                self._json(
                    404, {"type": "error", "error": {"type": "not_found_error", "message": f"Not found: {path}"}}
                )
        except json.JSONDecodeError as exc:
            error = ApiError(400, "invalid_request_error", f"The request body is not valid JSON: {exc}")
            self._json(400, error.openai_body() if openai else error.anthropic_body())
        except ApiError as exc:
            self._json(exc.status, exc.openai_body() if openai else exc.anthropic_body(), exc.headers)

    def _messages(self, payload: dict[str, Any]) -> None:
        response = self.server.emulator.begin(payload)
        if not payload.get("stream"):
            response.start()
            self._json(200, response.message())
            return
        time.sleep(self.server.first_token_seconds)
        self._start_stream()
        try:
            for event, data in response.sse_events():
                if event == "content_block_delta":
                    time.sleep(self.server.delta_seconds)
                self._chunk(f"event: {event}\ndata: {json.dumps(data)}\n\n")
        except StreamCut:
            self._cut()
            return
        self._end_stream()

    def _chat_completions(self, payload: dict[str, Any]) -> None:
        response = self.server.emulator.openai_begin(payload)
        if not payload.get("stream"):
            self._json(200, response.completion())
            return
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        self._start_stream()
        try:
            for chunk in response.chunks(include_usage):
                self._chunk(f"data: {json.dumps(chunk)}\n\n")
        except StreamCut:
            self._cut()
            return
        self._chunk("data: [DONE]\n\n")
        self._end_stream()

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", "req_emulator")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _cut(self) -> None:
        # No terminating chunk: the client sees the body end mid-stream.
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    # Many concurrent streams in benchmarks: a deeper accept queue than the default 5.
    request_queue_size = 512

    def __init__(self, address: tuple[str, int], emulator: Emulator, verbose: bool) -> None:
        super().__init__(address, _Handler)
        self.emulator = emulator
        self.verbose = verbose
        self.first_token_seconds = 0.0
        self.delta_seconds = 0.0


class EmulatorServer:
    """Serve an emulator on 127.0.0.1; `port=0` picks a free port.

    `first_token_ms` and `delta_ms` add a real model's latencies to streamed Messages
    responses (time to first token, then the gap before each text delta) for load tests.
    """

    def __init__(
        self,
        emulator: Emulator,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
        first_token_ms: float = 0.0,
        delta_ms: float = 0.0,
    ) -> None:
        self.emulator = emulator
        self._server = _Server((host, port), emulator, verbose)
        self._server.first_token_seconds = first_token_ms / 1000
        self._server.delta_seconds = delta_ms / 1000
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EmulatorServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="emulator-http", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
