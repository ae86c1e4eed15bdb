"""The emulator's HTTP server reads and refuses request bodies as the APIs do (EM-1).

QA: a lone surrogate escape, an array nested 100,000 deep, a 5,000-digit integer and a
negative or NaN latency header each got `500 api_error` (which clients retry), and a
chunked body was ignored ("model: Field required").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.emulator import Emulator, TestClock
from engine.emulator import server as emulator_server
from engine.emulator.server import EmulatorServer

MESSAGES = {"model": "claude-sonnet-4-5", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
ROUTES = {"/v1/messages": MESSAGES, "/v1/chat/completions": CHAT}
HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def server():
    with EmulatorServer(Emulator(clock=TestClock())) as running:
        yield running


def _body(base: dict[str, Any], replace: str, raw: str) -> bytes:
    """`base` as JSON with the value of `replace` (a JSON string in it) swapped for raw JSON text."""
    return json.dumps(base).replace(json.dumps(replace), raw, 1).encode()


def _error(route: str, response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    if route == "/v1/chat/completions":
        return body["error"]
    assert body["type"] == "error"
    return body["error"]


BAD_BODIES = {
    "lone_surrogate": lambda base: _body(base, "hi", '"\\ud800"'),
    "nested_100000_deep": lambda base: _body(base, "hi", "[" * 100_000 + "]" * 100_000),
    "nested_150_deep": lambda base: _body(base, "hi", "[" * 150 + "]" * 150),
    "integer_of_5000_digits": lambda base: _body({**base, "max_tokens": "N"}, "N", "9" * 5000),
    "nan": lambda base: _body({**base, "temperature": "T"}, "T", "NaN"),
}


@pytest.mark.req("EM-1")
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_body_the_api_cannot_parse_is_a_400_not_a_500(server, route, case):
    response = httpx.post(f"{server.base_url}{route}", content=BAD_BODIES[case](ROUTES[route]), headers=HEADERS)
    assert response.status_code == 400, response.text
    error = _error(route, response)
    assert error["type"] == "invalid_request_error"
    assert "not valid JSON" in error["message"]


@pytest.mark.req("EM-1")
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("header", ["x-emulator-first-token-ms", "x-emulator-delta-ms"])
@pytest.mark.parametrize("value", ["-5", "nan", "inf"])
def test_a_latency_header_that_is_no_duration_is_a_400(server, route, header, value):
    response = httpx.post(f"{server.base_url}{route}", json=ROUTES[route], headers={**HEADERS, header: value})
    assert response.status_code == 400, response.text
    error = _error(route, response)
    assert error["type"] == "invalid_request_error" and "milliseconds" in error["message"]


@pytest.mark.req("EM-3")
@pytest.mark.parametrize("body", ['{"first_token_ms": -5}', '{"delta_ms": "nan"}', '{"first_token_ms": 1e999}'])
def test_the_admin_route_refuses_a_latency_that_is_no_duration(server, body):
    response = httpx.post(f"{server.base_url}/_emulator/latency", content=body)
    assert response.status_code == 400, response.text
    assert httpx.get(f"{server.base_url}/_emulator/faults").json()["first_token_ms"] == 0


@pytest.mark.req("EM-3")
@pytest.mark.parametrize(
    "fault", ["rate_limit;retry_after=-1", "rate_limit;retry_after=nan", "stream_cut;after_chars=-3"]
)
def test_a_fault_header_with_a_negative_or_nan_option_is_a_400(server, fault):
    response = httpx.post(
        f"{server.base_url}/v1/messages", json=MESSAGES, headers={**HEADERS, "x-emulator-fault": fault}
    )
    assert response.status_code == 400, response.text


def _chunks(body: dict[str, Any]) -> Iterator[bytes]:
    data = json.dumps(body).encode()
    yield from (data[i : i + 7] for i in range(0, len(data), 7))


@pytest.mark.req("EM-1")
@pytest.mark.parametrize("route", list(ROUTES))
def test_a_chunked_body_is_read_like_any_other(server, route):
    response = httpx.post(f"{server.base_url}{route}", content=_chunks(ROUTES[route]), headers=HEADERS)
    assert response.status_code == 200, response.text
    # The connection stays usable: the next request on it is answered too.
    with httpx.Client(base_url=server.base_url, headers=HEADERS) as client:
        assert client.post(route, content=_chunks(ROUTES[route])).status_code == 200
        assert client.post(route, json=ROUTES[route]).status_code == 200


@pytest.mark.req("EM-1")
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("chunked", [True, False])
def test_a_body_over_the_size_limit_is_a_413_however_it_is_sent(server, route, chunked, monkeypatch):
    monkeypatch.setattr(emulator_server, "MAX_BODY_BYTES", 1000)
    body = {**ROUTES[route], "messages": [{"role": "user", "content": "x" * 2000}]}
    content = _chunks(body) if chunked else json.dumps(body).encode()
    response = httpx.post(f"{server.base_url}{route}", content=content, headers=HEADERS)
    assert response.status_code == 413, response.text
    assert _error(route, response)["type"] == "request_too_large"


@pytest.mark.req("EM-1")
def test_a_stopped_server_ends_the_connections_clients_keep_alive():
    """Like a real server going away: a client that kept its connection for the next request (the
    SDKs' pools do, across runs) must not have it answered by the stopped server's thread."""
    emulator_server_ = EmulatorServer(Emulator(clock=TestClock())).start()
    with httpx.Client(base_url=emulator_server_.base_url, timeout=10) as client:
        assert client.post("/v1/messages", json=MESSAGES, headers=HEADERS).status_code == 200
        emulator_server_.stop()
        with pytest.raises(httpx.TransportError):
            client.post("/v1/messages", json=MESSAGES, headers=HEADERS)
