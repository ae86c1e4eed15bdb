"""The dashboard in a real headless Chromium: the "Saved by caching" card follows the pushed figures
as a whole, its detail line with its headline (UX-4)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.browser import new_conversation, screenshot, seed, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def _send(page, text: str) -> None:
    page.locator("#composer-input").focus()
    page.fill("#composer-input", text)
    page.keyboard.press("Enter")


@pytest.mark.req("UX-4")
def test_the_saved_by_caching_card_updates_whole_when_a_run_finishes(embedded_server, page, tmp_path):
    base, _ = embedded_server
    seed(
        tmp_path,
        "c = Conversation.objects.create(owner=admin, title='earlier')\n"
        "m = Message.objects.create(conversation=c, role='user', content=[{'type': 'text', 'text': 'hi'}])\n"
        "r = Run.objects.create(conversation=c, trigger=m, provider='offline', model='offline-1', "
        "status='succeeded')\n"
        "ModelRequest.objects.create(run=r, step=1, model='offline-1', input_tokens=100, "
        "cache_read_input_tokens=900, output_tokens=10, breakpoints=['tools'])\n"
        "print(json.dumps({'run': r.pk}))\n",
    )
    sign_in(page, base)
    page.goto(base + "/dashboard/")
    note = page.locator("#saved-cache-note")
    expect(note).to_have_text("input-token equivalents: 900 reads at 0.1×")
    expect(page.locator("#dashboard[data-live]")).to_have_count(1)

    other = page.context.new_page()  # two runs in another tab; the second reads its prompt from the cache
    other.goto(base + "/")
    new_conversation(other, "reads the cache")
    for count, text in enumerate(("first", "second"), start=1):
        _send(other, text)
        expect(other.locator("article.assistant")).to_have_count(count, timeout=15_000)
        expect(other.locator("#status")).to_have_text("Run finished.", timeout=15_000)

    expect(page.locator("#saved-cache")).not_to_have_text("810", timeout=10_000)  # pushed, no reload
    expected = page.evaluate("fetch('/dashboard/data/').then(r => r.json())")["savings"]["cache"]
    assert expected["cache_read"] > 900, expected  # the runs moved the figure the note shows
    expect(page.locator("#saved-cache")).to_have_text(f"{expected['saved_tokens']:,}")
    expect(note).to_have_text(f"input-token equivalents: {expected['cache_read']:,} reads at 0.1×")
    screenshot(page, "dashboard-saved-by-caching")
