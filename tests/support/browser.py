"""Driving the UI in Debian's headless Chromium: the browser and its flags, screenshots, signing in
to an embedded server, and seeding its database as an earlier session would have."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import BrowserContext, Page, expect

from tests.support.embedded import EMBEDDED_ADMIN_PASSWORD, ROOT, embedded_env

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "var" / "test-artifacts"


def open_conversation(context: BrowserContext, base: str, conversation_id: int) -> Page:
    """A new tab on a conversation, once its websocket is open; `page.js_errors` collects its uncaught errors."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors  # read by the tests after their steps
    page.goto(f"{base}/conversations/{conversation_id}/")
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    return page


def api_call(context: BrowserContext, method: str, url: str, body: dict) -> None:
    """A JSON call to the API as the signed-in person of `context` (another tab's action, without its page)."""
    csrf = next(cookie["value"] for cookie in context.cookies() if cookie["name"] == "csrftoken")
    response = context.request.fetch(
        url,
        method=method,
        data=json.dumps(body),
        headers={"Content-Type": "application/json", "X-CSRFToken": csrf},
    )
    assert response.ok, response.text()


def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, base: str) -> None:
    page.goto(base + "/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", EMBEDDED_ADMIN_PASSWORD)
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Conversations")


def new_conversation(page: Page, title: str) -> None:
    page.fill("#new-conversation input[name=title]", title)
    page.click("#new-conversation button")
    expect(page.locator("h1")).to_have_text(title)
    expect(page.locator("#conversation[data-live]")).to_have_count(1)  # the websocket is open


def seed(folder: Path, code: str) -> dict:
    """Run `code` against the embedded server's database in `folder / "var"`; what it prints last, as JSON."""
    prelude = (
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "from agents.models import ModelRequest, Run, RunEvent\n"
        "from conversations.models import Conversation, Message\n"
        "admin = get_user_model().objects.get(username='admin')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "controlcenter.cli", "manage", "shell", "-c", prelude + code],
        env=embedded_env(folder / "var"),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
