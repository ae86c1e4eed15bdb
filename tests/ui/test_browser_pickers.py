"""The model and mode pickers in a real headless Chromium against the embedded server: chosen by
keyboard, saved at once, used by the next run and shown on its run page. Screenshots go to
var/test-artifacts/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import new_conversation, screenshot, seed, sign_in
from tests.support.timing import scaled

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture
def offered_models(monkeypatch):
    # Read by the embedded server when it starts (it inherits this environment).
    monkeypatch.setenv("CC_MODELS", "offline-1,offline-2=offline")


@pytest.mark.req("RN-1")
@pytest.mark.req("TD-8")
def test_pickers_are_keyboard_driven_saved_at_once_and_used_by_the_next_run(
    offered_models,
    embedded_server,
    page,
    tmp_path,
):
    base, _ = embedded_server
    seeded = seed(
        tmp_path,
        "from toolcatalog.models import Mode\n"
        "m = Mode.objects.create(name='no-listing', allow=['*'], deny=['list_dir'])\n"
        "print(json.dumps({'mode': m.pk}))\n",
    )
    sign_in(page, base)
    new_conversation(page, "pickers")
    conversation_id = int(re.search(r"/conversations/(\d+)/$", page.url).group(1))
    model, mode = page.locator("#model-picker"), page.locator("#mode-picker")
    status = page.locator("#run-options-status")
    expect(model).to_have_value("")  # the server default
    expect(model.locator("option")).to_have_text(["offline-1 (default)", "offline-2"])

    model.focus()
    page.keyboard.press("ArrowDown")  # a closed select changes with the arrow keys
    expect(status).to_have_text("The next run uses model offline-2.")
    page.keyboard.press("Tab")
    expect(mode).to_be_focused()

    # Two keys faster than the saves: the first save (chat) is held unanswered while the second
    # key (code) is pressed. The server must end with the later choice, as the picker shows it.
    held: list = []

    def hold_the_first_save(route):
        if route.request.method == "PATCH" and not held:
            held.append(route)
        else:
            route.continue_()

    page.route(f"**/api/conversations/{conversation_id}/", hold_the_first_save)
    page.keyboard.press("ArrowDown")  # chat, a starter mode bootstrap creates
    page.keyboard.press("ArrowDown")  # code
    page.wait_for_timeout(300)
    assert len(held) == 1
    held[0].continue_()
    expect(status).to_have_text("The next run uses mode code.")
    page.unroute(f"**/api/conversations/{conversation_id}/")
    code = mode.locator("option", has_text="code").get_attribute("value")
    stored = page.evaluate(f"fetch('/api/conversations/{conversation_id}/').then(r => r.json())")["conversation"]
    assert (stored["mode"], mode.input_value()) == (int(code), code)

    page.keyboard.press("ArrowDown")
    expect(status).to_have_text("The next run uses mode no-listing.")
    saved = page.evaluate(f"fetch('/api/conversations/{conversation_id}/').then(r => r.json())")["conversation"]
    assert (saved["model"], saved["mode"]) == ("offline-2", seeded["mode"])

    page.reload()  # saved on the server, not only in the page
    expect(model).to_have_value("offline-2")
    expect(mode).to_have_value(str(seeded["mode"]))
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    screenshot(page, "pickers")

    page.fill("#composer-input", "please list the files in the workspace")
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_have_text("Run finished.", timeout=scaled(15_000))
    # The mode withheld list_dir: the offline model had no tool to call.
    expect(page.locator("article.assistant details.tool")).to_have_count(0)
    page.click("#run-link")
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    expect(page.locator("#run-model")).to_have_text("offline/offline-2")
    expect(page.locator("#run-mode")).to_have_text("no-listing")
    screenshot(page, "pickers-run-page")


def test_a_refused_choice_puts_the_picker_back_and_says_why(offered_models, embedded_server, page):
    base, _ = embedded_server
    sign_in(page, base)
    new_conversation(page, "refused")
    # An option the server does not offer (as if CC_MODELS changed since the page was drawn).
    page.evaluate("document.querySelector('#model-picker').add(new Option('gone-1', 'gone-1'))")
    page.select_option("#model-picker", "gone-1")
    status = page.locator("#run-options-status")
    expect(status).to_contain_text("Model 'gone-1' is not offered here; choose one of offline-1, offline-2")
    expect(status).to_have_class(re.compile(r"\berror\b"))
    expect(page.locator("#model-picker")).to_have_value("")  # back to what the server has
