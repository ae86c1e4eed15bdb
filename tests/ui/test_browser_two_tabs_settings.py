"""Two tabs on one conversation in Debian's headless Chromium: a rename or a picked model or mode made
in one tab or through the API shows in the other at once (UX-4, UX-2), so its next prompt runs with
what the server will use; a field the other tab's person is working in is left as it is until they
leave it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import api_call, open_conversation, seed, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# The live cue arrives within a second on a quiet machine. Without it the page never learns of these
# changes (it redraws only the messages), so the cap is only for a loaded CI host.
LIVE_MS = 15_000

SEED = """
from toolcatalog.models import Mode
m = Mode.objects.create(name='tabs-mode', allow=['*'])
c = Conversation.objects.create(owner=admin, title='two tabs')
print(json.dumps({'conversation': c.pk, 'mode': m.pk}))
"""


@pytest.fixture
def offered_models(monkeypatch):
    # Read by the embedded server when it starts (it inherits this environment).
    monkeypatch.setenv("CC_MODELS", "offline-1,offline-2=offline")


@pytest.fixture
def context(browser, offered_models, embedded_server):
    base, _ = embedded_server
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    sign_in(context.new_page(), base)
    yield context
    context.close()


@pytest.mark.req("UX-4", "UX-2")
def test_a_rename_or_a_pick_elsewhere_shows_in_the_other_tab_without_taking_its_field(context, embedded_server):
    base, log = embedded_server
    seeded = seed(log.parent, SEED)
    conversation, mode = seeded["conversation"], str(seeded["mode"])
    detail = f"{base}/api/conversations/{conversation}/"
    tab_a = open_conversation(context, base, conversation)
    tab_b = open_conversation(context, base, conversation)
    heading_b = tab_b.locator("#conversation-title")
    model_b, mode_b = tab_b.locator("#model-picker"), tab_b.locator("#mode-picker")

    # Tab A renames: tab B's heading and window title follow.
    tab_a.click("#rename")
    tab_a.fill("#rename-input", "renamed in A")
    tab_a.click("#rename-form button[type=submit]")
    expect(heading_b).to_have_text("renamed in A", timeout=LIVE_MS)
    expect(tab_b).to_have_title("renamed in A · Control Center")

    # Tab A picks a model; the API picks a mode: both show in tab B, and tab A takes the API's mode.
    tab_a.select_option("#model-picker", "offline-2")
    expect(model_b).to_have_value("offline-2", timeout=LIVE_MS)
    api_call(context, "PATCH", detail, {"mode": seeded["mode"]})
    expect(mode_b).to_have_value(mode, timeout=LIVE_MS)
    expect(tab_a.locator("#mode-picker")).to_have_value(mode, timeout=LIVE_MS)
    expect(tab_b.locator("#run-options-status")).to_have_text("Changed elsewhere: the next run uses mode tabs-mode.")

    # Tab B's person is typing a title and is on the model picker: one change of title and model
    # elsewhere moves the heading but neither their draft nor the picker under their hands ...
    tab_b.click("#rename")
    tab_b.fill("#rename-input", "a title being typed in B")
    model_b.focus()
    api_call(context, "PATCH", detail, {"title": "renamed by the API", "model": ""})
    expect(heading_b).to_have_text("renamed by the API", timeout=LIVE_MS)
    expect(tab_b.locator("#rename-input")).to_have_value("a title being typed in B")
    expect(model_b).to_have_value("offline-2")
    # ... which follows the server once they leave it, before their next prompt.
    tab_b.focus("#composer-input")
    expect(model_b).to_have_value("", timeout=LIVE_MS)
    expect(tab_b.locator("#run-options-status")).to_have_text(
        re.compile(r"^Changed elsewhere: the next run uses model offline-1")
    )
    assert not tab_a.js_errors and not tab_b.js_errors
