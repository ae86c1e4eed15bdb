"""The embedded default: no DATABASE_URL, no REDIS_URL, and the product still answers."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

pytestmark = pytest.mark.integration


def test_embedded_server_answers_a_message_with_a_streamed_reply(embedded_server):
    base, log_path = embedded_server
    with httpx.Client(base_url=base, timeout=10) as http:
        health = http.get("/healthz").json()
        assert health["mode"] == "embedded"
        assert health["checks"]["database"] == {"ok": True}  # no details for anonymous callers (SB-5)
        login_page = http.get("/login/")
        csrf = http.cookies["csrftoken"]
        assert login_page.status_code == 200
        signed_in = http.post(
            "/login/", data={"username": "admin", "password": "embedded-pass-1", "csrfmiddlewaretoken": csrf}
        )
        assert signed_in.status_code == 302
        csrf = http.cookies["csrftoken"]  # rotated at sign-in
        created = http.post("/", data={"title": "laptop", "csrfmiddlewaretoken": csrf})
        conversation_id = int(created.headers["location"].rstrip("/").rsplit("/", 1)[-1])
        page = http.get(f"/conversations/{conversation_id}/")
        assert page.status_code == 200 and b"composer" in page.content
        cookies = "; ".join(f"{name}={value}" for name, value in http.cookies.items())
        csrf = http.cookies["csrftoken"]

        async def watch_and_send() -> list[dict]:
            ws_url = base.replace("http", "ws") + f"/ws/conversations/{conversation_id}/"
            async with websockets.connect(ws_url, additional_headers={"Cookie": cookies, "Origin": base}) as socket_:
                response = await asyncio.to_thread(
                    http.post,
                    f"/api/conversations/{conversation_id}/messages/",
                    json={"text": "what are you?"},
                    headers={"X-CSRFToken": csrf, "Referer": base + "/"},
                )
                assert response.status_code == 201, response.text
                events = []
                while not events or events[-1]["type"] != "run_finished":
                    event = json.loads(await asyncio.wait_for(socket_.recv(), timeout=15))
                    if event["type"] != "conversation_changed":  # the tabs' cue to redraw (UX-4)
                        events.append(event)
                return events

        events = asyncio.run(watch_and_send())
        assert events[0]["type"] == "run_started"
        assert events[-1]["payload"]["status"] == "succeeded"
        streamed = "".join(e["payload"]["text"] for e in events if e["type"] == "text_delta")
        assert "offline model" in streamed
        path = http.get(f"/api/conversations/{conversation_id}/").json()["path"]
        assert [m["role"] for m in path] == ["user", "assistant"]
        assert path[-1]["content"][0]["text"] == streamed
    assert "embedded mode" in log_path.read_text()
