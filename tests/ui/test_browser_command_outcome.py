"""The composer in a real headless Chromium: the status line shows the latest slash command's outcome
only, never a previous one beside a new error (CH-10)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.browser import new_conversation, screenshot, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def _send(page, text: str) -> None:
    page.locator("#composer-input").focus()
    page.fill("#composer-input", text)
    page.keyboard.press("Enter")


@pytest.mark.req("CH-10")
def test_a_refused_command_replaces_the_previous_commands_outcome(embedded_server, page):
    base, _ = embedded_server
    sign_in(page, base)
    new_conversation(page, "outcomes")
    _send(page, "first question")
    status = page.locator("#status")
    expect(status).to_have_text("Run finished.", timeout=15_000)

    _send(page, "/checkpoint ui-cp")
    expect(status).to_contain_text("Checkpoint 'ui-cp' at message")
    _send(page, "/branch 1 2")
    expect(page.locator("#errors .error-card")).to_contain_text("/branch needs one message id")
    expect(status).not_to_contain_text("Checkpoint 'ui-cp'")

    # And a command that succeeds after a refused one shows only its own outcome.
    _send(page, "/checkpoint ui-cp-2")
    expect(status).to_contain_text("Checkpoint 'ui-cp-2' at message")
    expect(page.locator("#errors .error-card")).to_have_count(0)
    screenshot(page, "composer-command-outcome")
