"""The emulator over HTTP on 127.0.0.1, for the official SDKs and any other client.

Routes as the real services have them: `POST /v1/messages` (JSON, or SSE with
`"stream": true`), `POST /v1/messages/count_tokens`, and the OpenAI-compatible
`POST /v1/chat/completions`. Streams use chunked transfer encoding, so a stream
cut (an injected fault) is a connection dropped before the final chunk, which
clients see as an incomplete body, exactly as with a real network failure.

Every request gets an HTTP answer in the API's error shape; an unexpected
exception is a 500 `api_error`, never a dropped connection. A body comes with
`Content-Length` or chunked (`Transfer-Encoding: chunked`), at most `MAX_BODY_BYTES`
either way (413 `request_too_large` above). Faults and latency
come over HTTP too, for both routes and both streaming modes: a request header
`x-emulator-fault: KIND[;retry_after=S][;after_chars=N]` applies to that request
only; `x-emulator-first-token-ms` / `x-emulator-delta-ms` set its latencies;
`POST /_emulator/faults` (`{"kind": ..., "retry_after": ..., "after_chars": ...}` or
`{"faults": [...]}`) queues faults for the next requests, `POST /_emulator/latency`
(`{"first_token_ms": ..., "delta_ms": ...}`) sets the server's latencies, and
`GET /_emulator/faults` shows both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from engine.emulator import ApiError, Emulator, Fault, StreamCut
from engine.emulator.openai_route import StreamEnded
from engine.emulator.validation import invalid_request, milliseconds, parse_body, too_deep

logger = logging.getLogger(__name__)
FAULT_KINDS = ("rate_limit", "overloaded", "stream_cut", "stream_overloaded")


FAULT_HEADER = "x-emulator-fault"
FIRST_TOKEN_HEADER = "x-emulator-first-token-ms"
DELTA_HEADER = "x-emulator-delta-ms"
ADMIN_PREFIX = "/_emulator/"
# The Messages API's documented request size limit, applied to both routes.
MAX_BODY_BYTES = 32 * 1024 * 1024
CHUNK_LINE_BYTES = 1024


def parse_fault(value: str) -> Fault:
    """`kind[;retry_after=S][;after_chars=N]`, e.g. `rate_limit;retry_after=2` or `stream_cut;after_chars=40`."""
    kind, *options = [part.strip() for part in value.split(";")]
    fields: dict[str, Any] = {}
    for option in options:
        name, _, raw = option.partition("=")
        if name == "retry_after":
            fields["retry_after"] = _seconds(raw)
        elif name == "after_chars":
            fields["after_chars"] = _count(raw)
        else:
            raise ValueError(f"unknown fault option {name!r}")
    return Fault(kind, **fields)


def _seconds(value: Any) -> float:
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"retry_after must be a finite number of seconds, 0 or more; got {value!r}")
    return seconds


def _count(value: Any) -> int:
    count = int(value)
    if count < 0:
        raise ValueError(f"after_chars must be 0 or more; got {value!r}")
    return count


def _too_large() -> ApiError:
    return ApiError(413, "request_too_large", "Request exceeds the maximum allowed number of bytes.")


def _anthropic_error(status: int, error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        if self.server.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            self._json(200, {"data": [{"id": "emulator", "type": "model"}], "object": "list"})
        elif path == ADMIN_PREFIX + "faults":
            self._json(200, self.server.admin_state())
        else:
            self._json(404, _anthropic_error(404, "not_found_error", f"Not found: {self.path}"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        openai = path.endswith("/chat/completions")
        started = False
        try:
            payload = parse_body(self._read_body())
            if not isinstance(payload, dict):
                raise ApiError(400, "invalid_request_error", "The request body must be a JSON object.")
            if path.startswith(ADMIN_PREFIX):
                self._admin(path[len(ADMIN_PREFIX) :], payload)
                return
            self._header_faults()
            started = True
            if path.startswith("/v1/messages") and not (self.headers.get("anthropic-version") or "").strip():
                raise invalid_request("anthropic-version: header is required")
            if path == "/v1/messages":
                self._messages(payload)
            elif path == "/v1/messages/count_tokens":
                self._json(200, {"input_tokens": self.server.emulator.count_tokens(payload)})
            elif openai:
                self._chat_completions(payload)
            else:
                self._json(404, _anthropic_error(404, "not_found_error", f"Not found: {path}"))
        except RecursionError:
            # Nesting within MAX_JSON_DEPTH that a recursive check (a tool's JSON schema) still cannot walk.
            if self._stream_open:
                self._cut()
                return
            error = too_deep()
            self._json(400, error.openai_body() if openai else error.anthropic_body())
        except ApiError as exc:
            self._json(exc.status, exc.openai_body() if openai else exc.anthropic_body(), exc.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # every request gets an answer in the API's shape, never a dropped socket
            logger.exception("emulator: internal error on %s", path)
            if self._stream_open:
                self._cut()
                return
            error = ApiError(500, "api_error", "Internal server error")
            self._json(500, error.openai_body() if openai else error.anthropic_body())
        finally:
            if started:
                self._request_latency = None

    def _read_body(self) -> bytes:
        """The body by `Content-Length` or chunked; a body not read to its end closes the connection."""
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            self.close_connection = True
            raise invalid_request("Content-Length must be a number of bytes") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            raise _too_large() if length > 0 else invalid_request("Content-Length must be a number of bytes")
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            line = self.rfile.readline(CHUNK_LINE_BYTES)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                raise invalid_request("The request body is not valid chunked transfer encoding") from None
            if size == 0:
                # Trailer fields, if any, up to the blank line that ends the body.
                while self.rfile.readline(CHUNK_LINE_BYTES) not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(body)
            if size < 0 or len(body) + size > MAX_BODY_BYTES:
                self.close_connection = True
                raise _too_large()
            chunk = self.rfile.read(size)
            if len(chunk) != size or self.rfile.readline(CHUNK_LINE_BYTES) not in (b"\r\n", b"\n"):
                self.close_connection = True
                raise invalid_request("The request body is not valid chunked transfer encoding")
            body += chunk

    _stream_open = False
    _fault: Fault | None = None
    _request_latency: tuple[float, float] | None = None

    def _header_faults(self) -> None:
        fault = self.headers.get(FAULT_HEADER)
        self._fault = None
        if fault:
            try:
                self._fault = parse_fault(fault)
            except (TypeError, ValueError) as exc:
                raise ApiError(400, "invalid_request_error", f"{FAULT_HEADER}: {exc}") from None
            if self._fault.kind not in FAULT_KINDS:
                raise ApiError(400, "invalid_request_error", f"{FAULT_HEADER}: unknown fault kind {self._fault.kind!r}")
        try:
            first = self.headers.get(FIRST_TOKEN_HEADER)
            delta = self.headers.get(DELTA_HEADER)
            self._request_latency = (
                milliseconds(first, FIRST_TOKEN_HEADER) / 1000 if first else self.server.first_token_seconds,
                milliseconds(delta, DELTA_HEADER) / 1000 if delta else self.server.delta_seconds,
            )
        except ValueError as exc:
            raise invalid_request(f"latency headers must be numbers of milliseconds, 0 or more: {exc}") from None

    def _admin(self, action: str, payload: dict[str, Any]) -> None:
        """`POST /_emulator/faults` queues faults; `POST /_emulator/latency` sets the latencies."""
        try:
            if action == "faults":
                faults = payload.get("faults", [payload])
                parsed = [
                    Fault(
                        str(f["kind"]),
                        retry_after=None if f.get("retry_after") is None else _seconds(f["retry_after"]),
                        after_chars=_count(f.get("after_chars", 0)),
                    )
                    for f in faults
                ]
                for fault in parsed:
                    if fault.kind not in FAULT_KINDS:
                        raise ValueError(f"unknown fault kind {fault.kind!r}; one of {', '.join(FAULT_KINDS)}")
                for fault in parsed:
                    self.server.emulator.inject(fault)
            elif action == "latency":
                first = milliseconds(payload.get("first_token_ms", 0), "first_token_ms")
                delta = milliseconds(payload.get("delta_ms", 0), "delta_ms")
                self.server.first_token_seconds, self.server.delta_seconds = first / 1000, delta / 1000
            else:
                self._json(404, _anthropic_error(404, "not_found_error", f"Not found: {ADMIN_PREFIX}{action}"))
                return
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(400, "invalid_request_error", f"{ADMIN_PREFIX}{action}: {exc}") from None
        self._json(200, self.server.admin_state())

    @property
    def _latency(self) -> tuple[float, float]:
        return self._request_latency or (self.server.first_token_seconds, self.server.delta_seconds)

    def _messages(self, payload: dict[str, Any]) -> None:
        response = self.server.emulator.begin(payload, fault=self._fault)
        first, delta = self._latency
        if not payload.get("stream"):
            # A whole answer is sent once it is generated: its writes become readable only then.
            time.sleep(first + delta * response.delta_count())
            response.start()
            self._whole(response.fault, response.message(), openai=False)
            return
        time.sleep(first)
        self._start_stream()
        try:
            for event, data in response.sse_events():
                if event == "content_block_delta":
                    time.sleep(delta)
                self._chunk(f"event: {event}\ndata: {json.dumps(data)}\n\n")
        except StreamCut:
            self._cut()
            return
        self._end_stream()

    def _chat_completions(self, payload: dict[str, Any]) -> None:
        response = self.server.emulator.openai_begin(payload, fault=self._fault)
        first, delta = self._latency
        if not payload.get("stream"):
            time.sleep(first + delta * response.delta_count())
            self._whole(response.fault, response.completion(), openai=True)
            return
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        time.sleep(first)
        self._start_stream()
        try:
            for n, chunk in enumerate(response.chunks(include_usage)):
                if n:
                    time.sleep(delta)
                self._chunk(f"data: {json.dumps(chunk)}\n\n")
        except StreamCut:
            self._cut()
            return
        except StreamEnded:
            pass
        self._chunk("data: [DONE]\n\n")
        self._end_stream()

    def _whole(self, fault: Fault | None, body: dict[str, Any], *, openai: bool) -> None:
        """A non-streamed answer under a mid-response fault: overloaded, or the body cut short."""
        kind = fault.kind if fault is not None else None
        if kind == "stream_overloaded":
            error = ApiError(529, "overloaded_error", "Overloaded", code="overloaded" if openai else None)
            self._json(529, error.openai_body() if openai else error.anthropic_body())
        elif kind == "stream_cut":
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: min(len(data) - 1, fault.after_chars if fault else 0)])
            self._cut()
        else:
            self._json(200, body)

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
        self._stream_open = True

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self._stream_open = False

    def _cut(self) -> None:
        # No terminating chunk: the client sees the body end mid-stream.
        self.wfile.flush()
        self.close_connection = True
        self._stream_open = False
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
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        # Registered before its thread starts, so a stop right after the accept still ends it.
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.discard(request)

    def close_connections(self) -> None:
        """End every open connection, as a server going away does: a client keeping one alive for its
        next request must not have it answered by a stopped server's thread."""
        with self._connections_lock:
            open_connections = list(self._connections)
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def admin_state(self) -> dict[str, Any]:
        return {
            "queued_faults": [f.kind for f in self.emulator.queued_faults()],
            "first_token_ms": self.first_token_seconds * 1000,
            "delta_ms": self.delta_seconds * 1000,
        }


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
        self._server.close_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
