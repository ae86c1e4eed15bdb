"""The web process restarted while a real browser watches a run: the page reconnects and catches up (RN-1)."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from playwright.sync_api import expect, sync_playwright

from agents.models import Run
from controlcenter.stack import Stack
from conversations.models import Message
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.timing import scaled

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
]


@pytest.mark.req("RN-1")
def test_the_page_reconnects_after_a_web_restart_and_shows_the_whole_run(tmp_path, alice):
    stack = Stack(connection.settings_dict["NAME"], tmp_path)
    try:
        web = stack.start_web()
        stack.start_worker()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context().new_page()
            page.goto(web.base_url + "/")
            page.fill("input[name=username]", "alice")
            page.fill("input[name=password]", "alice-password-1")
            page.keyboard.press("Enter")
            page.fill("#new-conversation input[name=title]", "restart")
            page.click("#new-conversation button")
            expect(page.locator("h1")).to_have_text("restart")
            page.wait_for_timeout(300)
            page.fill("#composer-input", "please run `sleep 3; echo done`")
            page.keyboard.press("Enter")
            streamed = page.locator("#messages")  # the live reply, then the stored one drawn in its place
            expect(streamed.locator("details.tool summary").first).to_contain_text("bash", timeout=scaled(20_000))

            web.kill()  # the page loses its websocket mid-run
            time.sleep(1.0)
            web.start()

            expect(page.locator("#status")).to_have_text("Run finished.", timeout=scaled(40_000))
            expect(streamed).to_contain_text("done")
            shown = streamed.inner_text()
            browser.close()
    finally:
        stack.stop()
    # Playwright's loop makes its block an async context: the database is read after it.
    run = Run.objects.get(conversation__owner=alice)
    assert run.status == Run.Status.SUCCEEDED
    final = Message.objects.filter(conversation=run.conversation).order_by("id").last()
    assert final.content[0]["text"] in shown  # the text streamed after the restart reached the page
