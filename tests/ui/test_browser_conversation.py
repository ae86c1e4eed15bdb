"""The conversation page in a real headless Chromium: live streaming, then the same history on reload."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.embedded import EMBEDDED_ADMIN_PASSWORD
from tests.support.timing import scaled

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.mark.req("RN-1")
def test_a_message_streams_into_the_page_live_and_stays_after_reload(embedded_server, page):
    base, _ = embedded_server
    page.goto(base + "/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", EMBEDDED_ADMIN_PASSWORD)
    page.keyboard.press("Enter")
    page.fill("#new-conversation input[name=title]", "browser")
    page.click("#new-conversation button")
    expect(page.locator("h1")).to_have_text("browser")
    page.wait_for_timeout(300)  # let the websocket connect before the reply can stream

    page.fill("#composer-input", "please list the files in the workspace")
    page.keyboard.press("Enter")  # the keyboard alone sends

    streamed = page.locator("#messages")
    expect(streamed).to_contain_text("I ran the tool", timeout=scaled(15_000))
    expect(streamed.locator("article.assistant details.tool summary").first).to_contain_text("list_dir")
    expect(page.locator("#status")).to_have_text("Run finished.")
    url_before = page.url

    page.reload()
    assert page.url == url_before
    persisted = page.locator("article.message.assistant")
    expect(persisted.last).to_contain_text("I ran the tool")
    expect(page.locator("article.message.user").first).to_contain_text("please list the files")
