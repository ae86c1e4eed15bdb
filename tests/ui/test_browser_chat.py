"""The conversation page as a person meets it, in Debian's headless Chromium (UX-1..UX-5):
two real tabs, reloads mid-way, typing while an approval arrives, phone and desktop widths.

One embedded server and one browser serve the whole module; each journey works in its own
conversation. Screenshots go to var/test-artifacts/ (docs/ui.md shows them).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import expect

from tests.support.browser import ARTIFACTS, open_conversation, screenshot, seed
from tests.support.embedded import EMBEDDED_ADMIN_PASSWORD
from tests.support.timing import scaled
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PHONE, DESKTOP = 390, 1400
# The page's width, the viewport's, and the elements reaching past it (for the failure message).
WIDEST = """() => [document.documentElement.scrollWidth, innerWidth,
  [...document.querySelectorAll("body *")].filter((e) => e.getBoundingClientRect().right > innerWidth + 1)
    .slice(-5).map((e) => `${e.tagName}.${e.className}#${e.id} ${Math.round(e.getBoundingClientRect().right)}`)]"""


# Every page of every journey here reports what its Content-Security-Policy refused (SB-6).
REPORT_VIOLATIONS = """document.addEventListener("securitypolicyviolation", (e) =>
  window.ccViolation(`${location.pathname}: ${e.violatedDirective} refused ${e.blockedURI || "inline"}`));"""


def _watch_csp(context) -> list[str]:
    refused: list[str] = []
    context.expose_binding("ccViolation", lambda _source, text: refused.append(text))
    context.add_init_script(REPORT_VIOLATIONS)
    context.on(
        "console",
        lambda message: "Content Security Policy" in message.text and refused.append(message.text),
    )
    return refused


@pytest.fixture(scope="module")
def signed_in(browser, embedded_server_module) -> dict:
    """One sign-in for the module (a password hash costs seconds on a loaded host); each
    journey's context starts from its cookies."""
    base, _ = embedded_server_module
    context = browser.new_context()
    page = context.new_page()
    page.goto(base + "/login/")
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", EMBEDDED_ADMIN_PASSWORD)
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Conversations", timeout=scaled(30_000))
    state = context.storage_state()
    context.close()
    return state


@pytest.fixture
def context(browser, embedded_server_module, signed_in):
    base, _ = embedded_server_module
    context = browser.new_context(viewport={"width": 1100, "height": 800}, storage_state=signed_in)
    refused = _watch_csp(context)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    yield context
    context.close()
    assert not refused, f"the Content-Security-Policy refused: {refused}"


def _new(context, base: str, title: str) -> int:
    created = context.request.post(
        f"{base}/api/conversations/",
        data=json.dumps({"title": title}),
        headers={"Content-Type": "application/json", "X-CSRFToken": _csrf(context)},
    )
    assert created.status == 201, created.text()
    return created.json()["id"]


def _csrf(context) -> str:
    return next(cookie["value"] for cookie in context.cookies() if cookie["name"] == "csrftoken")


def _send(page, text: str) -> None:
    page.locator("#composer-input").focus()
    page.fill("#composer-input", text)
    page.keyboard.press("Enter")


def _texts(page) -> list[str]:
    """Each card's rendered text, in order: what a person reads."""
    return page.locator("#messages > article").evaluate_all("cards => cards.map(card => card.innerText.trim())")


def _shot(page, name: str) -> None:
    """The visible part of a page as a small JPEG (docs/screenshots/ holds copies for docs/ui.md)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"page-{name}.jpg"), type="jpeg", quality=70)


def _settled(page) -> None:
    """Nothing in flight: no request of the page pending, no run drawn live, no refresh running."""
    page.wait_for_function(
        "() => { const root = document.getElementById('conversation');"
        " return !root.dataset.busy && !document.querySelector('#messages article.live'); }",
        timeout=scaled(20_000),
    )
    expect(page.locator("#cancel")).to_be_hidden()


@pytest.mark.req("UX-3", "UX-4")
def test_typing_in_a_second_tab_while_an_approval_arrives_never_approves(context, embedded_server_module):
    base, _ = embedded_server_module
    conversation = _new(context, base, "two tabs")
    tab_a = open_conversation(context, base, conversation)
    tab_b = open_conversation(context, base, conversation)

    tab_b.locator("#composer-input").focus()
    tab_b.keyboard.type("a note from tab B")  # typing in B ...
    _send(tab_a, "please run `echo from-tab-a`")  # ... while A's message asks for the shell
    for tab in (tab_a, tab_b):
        # Every tab shows the prompt from tab A, the pending approval and a Cancel button.
        expect(tab.locator("article.user").last).to_contain_text("please run echo from-tab-a")
        expect(tab.locator(".approval")).to_contain_text("echo from-tab-a", timeout=scaled(15_000))
        expect(tab.locator("#cancel")).to_be_visible()
    expect(tab_b.locator("#composer-input")).to_be_focused()  # the approval did not take focus
    expect(tab_a.locator("#composer-input")).to_be_focused()
    tab_b.keyboard.press("Enter")  # meant for the note, with the approval on screen
    expect(tab_b.locator("#errors .error-card")).to_contain_text("A run is still in progress")
    expect(tab_b.locator("#errors .error-card")).to_contain_text("send it when the run ends")
    expect(tab_b.locator("#composer-input")).to_have_value("a note from tab B")  # refused, never lost
    tab_a.keyboard.press("Enter")  # an empty composer in A: nothing is decided either
    assert tab_b.locator(".approval").get_attribute("data-decision") is None
    pending = context.request.get(f"{base}/api/conversations/{conversation}/approvals/?status=pending").json()
    assert len(pending) == 1
    screenshot(tab_b, "chat-approval-second-tab")

    tab_a.locator(".approval button.approve").click()  # only the prompt's own button decides
    expect(tab_b.locator(".approval")).to_have_attribute("data-decision", "approved")  # the other tab follows
    _settled(tab_a)
    _settled(tab_b)
    expect(tab_b.locator("article.assistant").last).to_contain_text("exited with 0: from-tab-a")
    tab_b.locator("#composer-input").focus()
    tab_b.keyboard.press("Enter")  # now the note goes
    expect(tab_a.locator("article.user").last).to_contain_text("a note from tab B", timeout=scaled(15_000))
    _settled(tab_a)
    _settled(tab_b)
    assert _texts(tab_a) == _texts(tab_b)
    assert not tab_a.js_errors and not tab_b.js_errors


@pytest.mark.req("UX-1", "UX-2")
def test_a_tab_whose_edit_form_was_open_while_the_conversation_changed_redraws_once_it_closes(
    context, embedded_server_module
):
    base, _ = embedded_server_module
    conversation = _new(context, base, "edit open")
    tab_a = open_conversation(context, base, conversation)
    _send(tab_a, "/checkpoint start")  # refused (nothing to mark yet), and no run is to blame
    expect(tab_a.locator("#errors .error-card")).to_contain_text("no messages yet")
    expect(tab_a.locator("#errors .error-card")).not_to_contain_text("when the run ends")
    _send(tab_a, "first question")
    _settled(tab_a)
    tab_b = open_conversation(context, base, conversation)
    tab_b.locator("article.user button.edit").click()  # B is editing ...
    expect(tab_b.locator("article.user .edit-inline textarea")).to_be_focused()
    _send(tab_a, "asked in tab A")  # ... while A adds a turn
    _settled(tab_a)
    expect(tab_b.locator("article.user")).to_have_count(1)  # not swapped away under the open form
    tab_b.keyboard.press("Escape")  # B closes the form: now it catches up
    expect(tab_b.locator("article.user").last).to_contain_text("asked in tab A")
    _send(tab_b, "asked in tab B")  # and its own sends keep showing
    expect(tab_b.locator("article.assistant").last).to_contain_text('"asked in tab B"', timeout=scaled(15_000))
    _settled(tab_b)
    expect(tab_a.locator("article.assistant").last).to_contain_text('"asked in tab B"')
    _settled(tab_a)
    assert _texts(tab_a) == _texts(tab_b)

    # Branch here on an answered prompt: the page says where its answer is, and can answer it again.
    tab_a.locator("article.user").last.locator("button.branch").click()
    _settled(tab_a)
    note = tab_a.locator("article.unanswered")
    expect(note).to_contain_text("answered on another branch")
    note.get_by_role("button", name="Show its answer").click()
    _settled(tab_a)
    expect(tab_a.locator("#messages > article").last).to_contain_text('"asked in tab B"')
    tab_a.locator("article.user").last.locator("button.branch").click()
    _settled(tab_a)
    tab_a.locator("article.unanswered").get_by_role("button", name="Answer it again").click()
    _settled(tab_a)
    expect(tab_a.locator("article.assistant .sibling-count").last).to_have_text("2/2")  # a second answer
    expect(tab_a.locator("article.unanswered")).to_have_count(0)
    assert not tab_a.js_errors and not tab_b.js_errors


# Every catch-up read of a run's log waits until the test lets it go, one by one in their order;
# `__applied` counts the reads whose events the page has drawn.
HOLD_CATCH_UPS = """(() => {
  const realFetch = window.fetch.bind(window);
  window.__held = [];
  window.__applied = 0;
  window.fetch = async (input, init) => {
    const response = await realFetch(input, init);
    if (!String(input).includes("/events/?after=")) return response;
    await new Promise((release) => window.__held.push(release));
    const json = response.json.bind(response);
    // Counted once the caller's loop over the events has run (a task after the JSON resolves).
    response.json = () => json().then((events) => { setTimeout(() => { window.__applied += 1; }); return events; });
    return response;
  };
})();"""


@pytest.mark.req("UX-3", "UX-4")
def test_a_pending_approval_shows_when_the_page_redraws_the_run_while_it_catches_up(context, embedded_server_module):
    """The interleaving CI met with two tabs: a catch-up of a run's log still in flight when a
    fresh fragment redraws the messages (here after a dropped websocket). The run's article is
    kept through the redraw, the catch-up in flight draws into it and one more read of the log
    follows it: the approval prompt is on the page once. (When the redraw replaced the article,
    the old catch-up drew into one no longer shown, and the prompt went missing.)"""
    base, _ = embedded_server_module
    conversation = _new(context, base, "redraw while catching up")
    sent = context.request.post(
        f"{base}/api/conversations/{conversation}/messages/",
        data=json.dumps({"text": "please run `echo redrawn`"}),
        headers={"Content-Type": "application/json", "X-CSRFToken": _csrf(context)},
    )
    assert sent.status == 201, sent.text()
    pending_url = f"{base}/api/conversations/{conversation}/approvals/?status=pending"
    wait_until(lambda: context.request.get(pending_url).json(), timeout=30, what="the run waits for approval")

    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.add_init_script(HOLD_CATCH_UPS)
    sockets = []

    def through_to_server(socket) -> None:
        socket.connect_to_server()
        sockets.append(socket)

    page.route_web_socket(re.compile(r"/ws/conversations/"), through_to_server)
    page.goto(f"{base}/conversations/{conversation}/")
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    page.wait_for_function("() => window.__held.length === 1")  # the page's first catch-up is out
    # The first connect's own check of the drawing is over (unchanged: nothing redrawn), so the
    # reconnect's fetch is not folded into it.
    page.wait_for_function("() => !document.getElementById('conversation').dataset.busy")
    page.evaluate("() => { window.__drawn = document.getElementById('messages'); }")
    sockets[0].close()  # the connection drops: the page reconnects and fetches the fragment again
    page.wait_for_function("() => document.getElementById('messages') !== window.__drawn")  # redrawn
    page.evaluate("() => window.__held[0]()")
    page.wait_for_function("() => window.__applied === 1")  # the catch-up from before the redraw ends
    # The redraw asked to catch up while that read was out: a second read follows it.
    page.wait_for_function("() => window.__held.length === 2")
    page.evaluate("() => window.__held[1]()")
    page.wait_for_function("() => window.__applied === 2")

    prompt = page.locator("#messages .approval")
    expect(prompt).to_have_count(1)
    expect(prompt).to_contain_text("echo redrawn")
    prompt.locator("button.approve").click()
    expect(page.locator("#messages article.assistant").last).to_contain_text(
        "exited with 0: redrawn", timeout=scaled(20_000)
    )
    assert not errors


# The page's first read of a run's log waits until the test lets it go; later reads go at once.
HOLD_FIRST_CATCH_UP = """(() => {
  const realFetch = window.fetch.bind(window);
  window.__catchUps = 0;
  window.fetch = async (input, init) => {
    const response = await realFetch(input, init);
    if (!String(input).includes("/events/?after=")) return response;
    window.__catchUps += 1;
    if (window.__catchUps === 1) await new Promise((release) => { window.__release = release; });
    return response;
  };
})();"""


@pytest.mark.req("UX-3", "UX-4", "TD-14")
def test_what_happened_while_the_socket_was_down_shows_though_a_read_of_the_log_was_in_flight(
    context, embedded_server_module
):
    """The page's first read of a run's log is slow; meanwhile its websocket hears nothing (a dead
    connection), a person approves one of two subagents' calls from elsewhere, and the socket is
    then replaced. The reconnect asks to catch up while that first read is still out: once it
    answers, with the log from before the decision, the page reads the log again and shows the call
    decided (the second ask was dropped, and the prompt stayed undecided for good)."""
    base, _ = embedded_server_module
    conversation = _new(context, base, "missed while reading")
    sent = context.request.post(
        f"{base}/api/conversations/{conversation}/messages/",
        data=json.dumps({"text": "in parallel: run `echo missed-zero`; run `echo missed-one`"}),
        headers={"Content-Type": "application/json", "X-CSRFToken": _csrf(context)},
    )
    assert sent.status == 201, sent.text()
    pending_url = f"{base}/api/conversations/{conversation}/approvals/?status=pending"
    pending = wait_until(
        lambda: (found := context.request.get(pending_url).json()) and len(found) == 2 and found,
        timeout=30,
        what="both subagents wait for approval",
    )

    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.add_init_script(HOLD_FIRST_CATCH_UP)
    sockets = []

    def deaf_then_through(socket) -> None:
        if sockets:  # the page's later connections reach the server
            socket.connect_to_server()
        sockets.append(socket)  # its first one hears nothing, as a dead connection would

    page.route_web_socket(re.compile(r"/ws/conversations/"), deaf_then_through)
    page.goto(f"{base}/conversations/{conversation}/")
    page.wait_for_function("() => window.__catchUps === 1")  # the first read of the log is out
    decided = context.request.post(
        f"{base}/api/approvals/{pending[0]['id']}/approve/", headers={"X-CSRFToken": _csrf(context)}
    )
    assert decided.status == 200, decided.text()
    page.evaluate("() => { window.__drawn = document.getElementById('messages'); }")
    sockets[0].close()  # replaced: the page reconnects, draws the messages again and asks to catch up
    page.wait_for_function("() => document.getElementById('messages') !== window.__drawn")
    page.evaluate("() => window.__release()")

    prompt = page.locator(f"#messages .approval[data-approval-id='{pending[0]['id']}']")
    expect(prompt).to_have_attribute("data-decision", "approved")
    other = page.locator(f"#messages .approval[data-approval-id='{pending[1]['id']}']")
    expect(other).to_be_visible()
    assert other.get_attribute("data-decision") is None
    other.locator("button.approve").click()
    expect(page.locator("#messages article.assistant").last).to_contain_text(
        "exited with 0: missed-one", timeout=scaled(30_000)
    )
    assert not errors


# Every approval prompt taken off the page, counted as it happens.
COUNT_REMOVED_PROMPTS = """(() => {
  window.__promptsRemoved = 0;
  new MutationObserver((changes) => {
    for (const change of changes) for (const node of change.removedNodes) {
      if (node.nodeType === 1 && (node.matches(".approval") || node.querySelector(".approval"))
          && !node.isConnected) window.__promptsRemoved += 1;
    }
  }).observe(document, { childList: true, subtree: true });
})();"""


@pytest.mark.req("UX-3", "UX-4")
def test_a_pending_approval_stays_put_with_its_focus_while_the_page_redraws_the_messages(
    context, embedded_server_module
):
    """A reconnect redraws the messages while a person is on the prompt's Approve button: the prompt
    never leaves the page (it blinked out until the run's log was replayed, and focus fell to the
    message box), and the button keeps the focus."""
    base, _ = embedded_server_module
    conversation = _new(context, base, "redraw under the prompt")
    sent = context.request.post(
        f"{base}/api/conversations/{conversation}/messages/",
        data=json.dumps({"text": "please run `echo kept`"}),
        headers={"Content-Type": "application/json", "X-CSRFToken": _csrf(context)},
    )
    assert sent.status == 201, sent.text()
    pending_url = f"{base}/api/conversations/{conversation}/approvals/?status=pending"
    wait_until(lambda: context.request.get(pending_url).json(), timeout=30, what="the run waits for approval")

    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sockets = []

    def through_to_server(socket) -> None:
        socket.connect_to_server()
        sockets.append(socket)

    page.route_web_socket(re.compile(r"/ws/conversations/"), through_to_server)
    page.goto(f"{base}/conversations/{conversation}/")
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    approve = page.locator("#messages .approval button.approve")
    expect(approve).to_be_visible()
    # The first connect's own check of the drawing is over (unchanged: nothing redrawn).
    page.wait_for_function("() => !document.getElementById('conversation').dataset.busy")
    page.evaluate(COUNT_REMOVED_PROMPTS)
    page.evaluate("() => { window.__drawn = document.getElementById('messages'); }")
    approve.focus()

    sockets[0].close()  # the connection drops: the page reconnects and draws the messages again
    page.wait_for_function("() => document.getElementById('messages') !== window.__drawn")
    page.wait_for_function("() => !document.getElementById('conversation').dataset.busy")

    assert page.evaluate("() => window.__promptsRemoved") == 0
    expect(page.locator("#messages .approval")).to_have_count(1)
    expect(approve).to_be_focused()
    page.keyboard.press("Enter")  # the focused button is the person's own choice
    expect(page.locator("#messages article.assistant").last).to_contain_text(
        "exited with 0: kept", timeout=scaled(20_000)
    )
    assert not errors


@pytest.mark.req("UX-4")
def test_back_to_a_conversation_shows_what_was_sent_while_the_page_was_away(context, embedded_server_module):
    base, _ = embedded_server_module
    conversation = _new(context, base, "back")
    page = open_conversation(context, base, conversation)
    _send(page, "before leaving")
    _settled(page)
    page.locator("#tree-link").click()
    expect(page).to_have_url(re.compile(r"/tree/$"))
    _sent_and_answered(context, base, conversation, "sent while away")  # another tab, or the API
    # The tree page follows that live (it reloads for the prompt and for the answer): Back once it has
    # drawn the answer, not in the middle of one of its reloads.
    expect(page.locator("#tree [aria-selected=true]")).to_have_class(re.compile(r"\bassistant\b"))
    expect(page.locator("#tree-page[data-live]")).to_have_count(1)
    back = page.go_back()
    assert back is not None and "no-store" in back.headers["cache-control"]  # asked the server again
    expect(page.locator("#messages article.user").last).to_contain_text("sent while away")
    expect(page.locator("#messages article.assistant").last).to_contain_text('"sent while away"')


@pytest.mark.req("UX-4", "RN-4")
def test_back_to_a_conversation_waiting_for_approval_shows_the_approval_again(context, embedded_server_module):
    base, _ = embedded_server_module
    conversation = _new(context, base, "back to approve")
    page = open_conversation(context, base, conversation)
    _send(page, "please run `echo back-again`")
    expect(page.locator(".approval")).to_contain_text("echo back-again", timeout=scaled(15_000))
    page.locator("a", has_text="Conversations").first.click()
    expect(page).to_have_url(re.compile(r"/$"))
    page.go_back()
    # The run's log is read again from the server, not from the browser's cache of the first read.
    expect(page.locator(".approval")).to_contain_text("echo back-again")
    # An edit refused while the run waits keeps its text in the open form, to send once the run ends.
    page.locator("article.user").last.locator("button.edit").click()
    editor = page.locator("article.user .edit-inline textarea")
    editor.fill("please run `echo edited`")
    page.keyboard.press("Control+Enter")
    expect(page.locator("#errors .error-card")).to_contain_text("still in progress")
    expect(editor).to_have_value("please run `echo edited`")
    editor.press("Escape")
    page.locator(".approval button.approve").click()
    _settled(page)
    expect(page.locator("article.assistant").last).to_contain_text("exited with 0: back-again")
    # Every answer of the app is kept out of the browser's cache; static files are not.
    assert "no-store" in context.request.get(f"{base}/api/conversations/{conversation}/").headers["cache-control"]
    assert "no-store" not in context.request.get(f"{base}/static/cc/app.css").headers.get("cache-control", "")


@pytest.mark.req("UX-4")
def test_a_message_sent_between_drawing_the_page_and_joining_its_socket_shows(context, embedded_server_module):
    base, _ = embedded_server_module
    conversation = _new(context, base, "before the socket")
    url = f"{base}/conversations/{conversation}/"

    def sent_before_the_script_runs(route) -> None:  # the page is drawn; its socket is not open yet
        _sent_and_answered(context, base, conversation, "sent before the socket joined")
        route.continue_()

    late = context.new_page()
    late.route("**/static/cc/conversation.js", sent_before_the_script_runs)
    late.goto(url)
    expect(late.locator("#messages article.user").last).to_contain_text("sent before the socket joined")

    fragments: list[int] = []  # a page drawn with nothing new since: its first refetch is answered 304
    page = context.new_page()
    page.on("response", lambda response: "/messages/" in response.url and fragments.append(response.status))
    page.goto(url)
    expect(page.locator("#conversation[data-live]")).to_have_count(1)  # the refetch starts with it
    page.wait_for_function("() => !document.getElementById('conversation').dataset.busy")
    assert fragments == [304]


def _sent_and_answered(context, base: str, conversation: int, text: str) -> None:
    sent = context.request.post(
        f"{base}/api/conversations/{conversation}/messages/",
        data=json.dumps({"text": text}),
        headers={"Content-Type": "application/json", "X-CSRFToken": _csrf(context)},
    )
    assert sent.status == 201, sent.text()
    run = f"{base}/api/runs/{sent.json()['run']['id']}/"
    wait_until(lambda: context.request.get(run).json()["status"] == "succeeded", timeout=30, what="the run")


@pytest.mark.req("CH-7", "UX-4")
def test_a_tab_still_showing_the_old_answer_cannot_file_a_prompt_under_another(context, embedded_server_module):
    # QA: tab A switched to the other answer; tab B, not yet redrawn, sent a follow-up that was
    # stored under the answer tab A chose, one tab B's person never saw.
    base, _ = embedded_server_module
    conversation = _new(context, base, "two tabs, two answers")
    _sent_and_answered(context, base, conversation, "first prompt")
    api = f"{base}/api/conversations/{conversation}/"
    tip = lambda: context.request.get(api).json()["conversation"]["tip"]  # noqa: E731
    first_answer = tip()
    headers = {"Content-Type": "application/json", "X-CSRFToken": _csrf(context)}
    again = context.request.post(f"{api}messages/{first_answer}/regenerate/", data="{}", headers=headers)
    assert again.status == 201, again.text()
    wait_until(lambda: tip() != first_answer, timeout=30, what="the new answer")
    regenerated = f"{base}/api/runs/{again.json()['run']['id']}/"
    wait_until(lambda: context.request.get(regenerated).json()["status"] == "succeeded", timeout=30, what="run")
    page = open_conversation(context, base, conversation)
    _settled(page)
    # Tab B learns of nothing from here on (its redraws fail), as a tab a moment behind.
    fragment = re.compile(r"^https?://[^/]+/conversations/\d+/messages/")
    page.route(fragment, lambda route: route.abort())
    switched = context.request.post(f"{api}branch/", data=json.dumps({"message": first_answer}), headers=headers)
    assert switched.status == 200, switched.text()  # tab A's arrow
    stored = len(context.request.get(f"{api}messages/").json()["messages"])

    _send(page, "follow-up to the answer I see")

    expect(page.locator("#errors .error-text")).to_contain_text("moved on since you saw it")
    expect(page.locator("#composer-input")).to_have_value("follow-up to the answer I see")
    assert len(context.request.get(f"{api}messages/").json()["messages"]) == stored
    page.unroute(fragment)
    page.reload()
    expect(page.locator("#messages article.assistant").last).to_contain_text("first prompt")
    _send(page, "follow-up to the answer I see")  # now under the answer it shows
    wait_until(lambda: tip() != first_answer, timeout=30, what="the send")
    rows = context.request.get(f"{api}messages/").json()["messages"]
    (follow_up,) = [row for row in rows if row["role"] == "user" and "follow-up" in row["preview"]]
    assert follow_up["parent"] == first_answer
    assert not page.js_errors


@pytest.mark.req("CH-10")
def test_a_refused_command_replaces_the_previous_commands_outcome(context, embedded_server_module):
    # QA: a refused command showed its error while the previous command's success stayed beside it.
    base, _ = embedded_server_module
    page = open_conversation(context, base, _new(context, base, "outcomes"))
    _send(page, "first question")
    status = page.locator("#status")
    expect(status).to_have_text("Run finished.", timeout=scaled(15_000))

    _send(page, "/checkpoint ui-cp")
    expect(status).to_contain_text("Checkpoint 'ui-cp' at message")
    _send(page, "/branch 1 2")
    expect(page.locator("#errors .error-card")).to_contain_text("/branch needs one message id")
    expect(status).not_to_contain_text("Checkpoint 'ui-cp'")

    # And a command that succeeds after a refused one shows only its own outcome.
    _send(page, "/checkpoint ui-cp-2")
    expect(status).to_contain_text("Checkpoint 'ui-cp-2' at message")
    expect(page.locator("#errors .error-card")).to_have_count(0)
    assert not page.js_errors


def _wait_in_page(page, condition, what: str) -> None:
    # Playwright hands the held requests over only while the test is inside one of its calls.
    wait_until(condition, what=what, interval=0.1, sleep=lambda seconds: page.wait_for_timeout(seconds * 1000))


@pytest.mark.req("CH-10")
def test_a_late_report_of_a_runs_end_does_not_replace_the_outcome_of_a_later_command(context, embedded_server_module):
    """A run that ended before the page drew it is reported by reading the run; on a loaded host that
    read came back after the person's next command, and "Run finished." replaced its outcome."""
    base, _ = embedded_server_module
    conversation = _new(context, base, "late report")
    page = open_conversation(context, base, conversation)
    held: dict[str, list] = {"fragments": [], "runs": []}
    fragment = f"/conversations/{conversation}/messages/"
    page.route(lambda url: urlsplit(url).path == fragment, lambda route: held["fragments"].append(route))
    page.route(
        lambda url: re.fullmatch(r"/api/runs/\d+/", urlsplit(url).path), lambda route: held["runs"].append(route)
    )

    # The page draws nothing of the run until it has ended, so no live event tells its end.
    _send(page, "first question")
    _wait_in_page(page, lambda: held["fragments"], "the page asking for the new messages")
    stored = f"{base}/api/conversations/{conversation}/"
    _wait_in_page(page, lambda: context.request.get(stored).json()["path"][-1]["role"] == "assistant", "the reply")
    page.unroute(lambda url: urlsplit(url).path == fragment)
    for route in held["fragments"]:
        route.continue_()
    _wait_in_page(page, lambda: held["runs"], "the page reading the ended run")

    # The person's next command is answered before that read comes back.
    status = page.locator("#status")
    _send(page, "/checkpoint ui-late")
    expect(status).to_contain_text("Checkpoint 'ui-late' at message")
    with page.expect_request_finished(lambda request: re.fullmatch(r"/api/runs/\d+/", urlsplit(request.url).path)):
        held["runs"].pop().continue_()
    page.wait_for_timeout(1_000)  # the read's answer is handled at once; a second is room to spare
    expect(status).to_contain_text("Checkpoint 'ui-late' at message", timeout=1)
    assert not page.js_errors


@pytest.mark.req("UX-3")
def test_a_catch_up_read_late_does_not_replace_what_the_person_did_meanwhile(context, embedded_server_module):
    """The page reads a live run's log before it follows the run; that read came back late under load,
    and its replay (the run started, the approval asked for) wrote over the person's newer news."""
    base, _ = embedded_server_module
    page = open_conversation(context, base, _new(context, base, "held catch-up"))
    held: list = []

    def log_read(url: str) -> bool:
        return re.fullmatch(r"/api/runs/\d+/events/", urlsplit(url).path) is not None

    page.route(log_read, lambda route: held.append(route))

    _send(page, "please run `echo held-catch-up`")  # the shell waits for approval: the run stays live
    _wait_in_page(page, lambda: held, "the page reading the live run's log")
    page.click("#rename")
    page.fill("#rename-input", "renamed meanwhile")
    page.click("#rename-form button[type=submit]")
    status = page.locator("#status")
    expect(status).to_have_text("Renamed.")

    # Removing the route (by the same matcher) lets the held read go on, and every later one.
    with page.expect_request_finished(lambda request: "/events/" in request.url):
        page.unroute(log_read)
    # The replay still draws the run: its approval prompt is there to decide.
    expect(page.locator(".approval").last).to_contain_text("echo held-catch-up")
    expect(status).to_have_text("Renamed.", timeout=1)
    page.locator(".approval").last.locator("button.deny").click()
    expect(status).to_have_text(re.compile(r"Run (finished|failed|cancelled)"), timeout=scaled(15_000))
    assert not page.js_errors


@pytest.mark.req("UX-5")
def test_a_send_that_reaches_no_server_says_so_and_keeps_the_message(context, embedded_server_module):
    # Seen with the web server stopped: Send did nothing visible at all, the error only in the console.
    base, _ = embedded_server_module
    page = open_conversation(context, base, _new(context, base, "unreachable"))
    messages = f"{base}/api/conversations/*/messages/"
    page.route(messages, lambda route: route.abort("connectionrefused"))
    _send(page, "are you there?")
    expect(page.locator(".error-card")).to_contain_text("The server could not be reached.")
    expect(page.locator("#composer-input")).to_have_value("are you there?")
    expect(page.locator("#send")).to_be_enabled()
    page.unroute(messages)
    page.locator("#composer-input").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#messages article.user").last).to_contain_text("are you there?")
    expect(page.locator(".error-card")).to_have_count(0)
    _settled(page)
    assert not page.js_errors


@pytest.mark.req("UX-1", "UX-2")
def test_replies_follow_their_prompts_and_the_live_view_equals_the_reloaded_one(context, embedded_server_module):
    base, _ = embedded_server_module
    page = open_conversation(context, base, _new(context, base, "order"))
    for n in range(6):
        page.locator("#composer-input").focus()
        page.keyboard.type(f"prompt {n}")
        page.keyboard.press("Shift+Enter")  # a line break that must survive
        page.keyboard.type("second line")
        page.keyboard.press("Enter")
        _settled(page)
        cards = page.locator("#messages > article")
        expect(cards.nth(2 * n)).to_contain_text(f"prompt {n}\nsecond line")  # the prompt, then its reply
        expect(cards.nth(2 * n + 1)).to_contain_text(f'"prompt {n} second line"')
    live = _texts(page)
    page.reload()
    assert _texts(page) == live
    assert page.locator("#messages article.user .text br").count() == 6


@pytest.mark.req("UX-2")
def test_a_failed_run_stays_with_retry_and_regenerate_and_edit_branch_in_place(context, embedded_server_module):
    base, log = embedded_server_module
    seeded = seed(
        log.parent,
        "c = Conversation.objects.create(owner=admin, title='failed run')\n"
        "m = Message.objects.create(conversation=c, role='user', content=[{'type': 'text', 'text': 'try me'}])\n"
        "c.tip = m; c.save()\n"
        "Run.objects.create(conversation=c, trigger=m, provider='offline', model='offline-1', status='failed', "
        "error='ProviderError: the model was overloaded')\n"
        "print(json.dumps({'conversation': c.pk}))\n",
    )
    page = open_conversation(context, base, seeded["conversation"])
    card = page.locator("article.run-ended")
    expect(card).to_contain_text("the model was overloaded")
    page.reload()  # still there after a reload, with its Retry
    screenshot(page, "chat-failed-run")
    page.locator("article.run-ended button.retry").click()
    _settled(page)
    expect(page.locator("article.run-ended")).to_have_count(0)
    expect(page.locator("article.assistant")).to_contain_text('"try me"')

    page.locator("article.assistant button.regenerate").click()  # a sibling answer
    _settled(page)
    expect(page.locator("article.assistant .sibling-count")).to_have_text("2/2")
    page.locator("article.assistant button[aria-label='Previous version']").click()
    expect(page.locator("article.assistant .sibling-count")).to_have_text("1/2")
    page.reload()
    expect(page.locator("article.assistant .sibling-count")).to_have_text("1/2")

    page.locator("article.user button.edit").click()  # edit in place, which branches and reruns
    editor = page.locator("article.user .edit-inline textarea")
    expect(editor).to_be_focused()
    editor.fill("try me again, edited")
    page.keyboard.press("Control+Enter")
    _settled(page)
    expect(page.locator("article.user")).to_contain_text("try me again, edited")
    expect(page.locator("article.user .sibling-count")).to_have_text("2/2")
    expect(page.locator("article.assistant")).to_contain_text('"try me again, edited"')
    _settled(page)  # the streamed answer is drawn again, whole, once its run has ended
    live = _texts(page)
    page.reload()
    assert _texts(page) == live


def _processes_with(*words: bytes) -> list[int]:
    """Host pids whose command line holds every word: a sandboxed process is visible from here."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        if all(word in command for word in words):
            found.append(int(entry.name))
    return found


@pytest.mark.req("UX-2", "UX-3", "OP-3")
def test_stop_kills_a_running_sleep_and_the_composer_works_at_once(context, embedded_server_module):
    base, _ = embedded_server_module
    conversation = _new(context, base, "stop")
    page = open_conversation(context, base, conversation)
    _send(page, "please run `sleep 30.4417`")  # an odd length: no other process on the machine has it
    card = page.locator("article.live")
    badge = card.locator("details.tool .tool-state")
    expect(card.locator(".approval")).to_be_visible(timeout=scaled(15_000))
    expect(badge).to_have_text("waiting for approval")  # nothing runs before a person decides
    # The request that asked for the call was stored when its reply came in: the usage bar shows it mid-turn.
    expect(page.locator("#conversation-usage")).to_contain_text(" out")
    # The live card and its prompt read at the stored messages' size: the command must be legible.
    # Read once all four are drawn: on a slow machine the check once ran as one of them was being drawn.
    sizes = page.wait_for_function(
        "() => { const found = ['article.user', 'article.live', 'article.live .approval',"
        " 'article.live .approval button.approve'].map((selector) => document.querySelector(selector));"
        " return found.every(Boolean) && found.map((element) => getComputedStyle(element).fontSize); }"
    ).json_value()
    assert len(set(sizes)) == 1, sizes
    # One ellipsis: the stylesheet's pulsing one after the working line's text.
    line = "(line) => line.textContent + getComputedStyle(line, '::after').content.replaceAll('\"', '')"
    assert card.locator(".working").evaluate(line) == "Waiting for your approval…"
    page.locator(".approval button.approve").click()
    expect(badge).to_have_text("running…")
    wait_until(lambda: _processes_with(b"sleep", b"30.4417"), timeout=15, what="the sandboxed sleep")
    stop = page.locator("#cancel")
    expect(stop).to_be_visible()
    expect(card.locator(".working")).to_have_text("Running bash")
    run = page.locator("#conversation").get_attribute("data-active-run")

    started = time.monotonic()
    stop.click()
    expect(stop).to_be_hidden(timeout=scaled(2_000))  # the run's end reached the page
    elapsed = time.monotonic() - started
    assert context.request.get(f"{base}/api/runs/{run}/").json()["status"] == "cancelled"
    assert elapsed < scaled(2), f"Stop took {elapsed:.2f} s"  # not the sleep's 30 s
    assert not _processes_with(b"sleep", b"30.4417")  # killed, not left to finish
    expect(page.locator("#composer-input")).to_be_focused()
    _settled(page)
    expect(page.locator("#status")).to_contain_text("cancelled")
    # The kept tool call is no answer: the run's red card with Retry follows it, across a reload.
    ended = page.locator("#messages > article").last
    expect(ended).to_have_class(re.compile("run-ended"))
    expect(ended).to_contain_text("cancelled before it answered")
    expect(ended.locator("button.retry")).to_be_visible()
    live = _texts(page)
    page.reload()
    assert _texts(page) == live
    ended.locator("button.retry").click()  # goes on from the kept call's result
    _settled(page)
    expect(page.locator("article.run-ended")).to_have_count(0)
    expect(page.locator("#messages > article").last).to_have_class(re.compile("assistant"))
    _send(page, "after the stop")  # the composer works at once: no 409, a reply
    expect(page.locator("article.assistant").last).to_contain_text('"after the stop"', timeout=scaled(15_000))
    expect(page.locator("#errors .error-card")).to_have_count(0)


@pytest.mark.req("UX-4", "TD-14")
def test_subagents_show_live_in_the_parents_card_with_their_calls_and_answers(context, embedded_server_module):
    base, _ = embedded_server_module
    conversation = _new(context, base, "subagents")
    page = open_conversation(context, base, conversation)
    # Child 0 asks for the shell and waits for a person; child 1 lists the files and answers.
    _send(page, "in parallel: run `echo child-zero`; list the files in the workspace")
    card = page.locator("article.live")
    zero = card.locator(".subagent[data-index='0']")
    one = card.locator(".subagent[data-index='1']")
    expect(one).to_have_attribute("data-status", "succeeded", timeout=scaled(20_000))
    expect(one.locator("summary").first).to_contain_text("Subagent 1 (worker) · done")
    expect(one.locator("details.tool .tool-name")).to_have_text("list_dir")
    expect(one.locator("details.tool .tool-state")).to_have_text("ok")
    expect(one.locator(".subagent-answer")).not_to_be_empty()
    expect(zero).to_have_attribute("data-status", "waiting")
    expect(zero.locator(".subagent-task")).to_have_text("run `echo child-zero`")
    expect(card.locator(".approval[data-subagent]")).to_contain_text("Subagent 0 (worker) asks to run bash")
    # The usage bar counts the children's requests as they come (they are the parent run's), not at its end.
    stored = context.request.get(f"{base}/conversations/{conversation}/usage/").text()
    spent = re.search(r"([\d,]+) out", stored).group(1)
    expect(page.locator("#conversation-usage")).to_contain_text(f"{spent} out")
    _shot(page, "subagents-live")
    live = card.inner_text()
    page.reload()  # mid-run: the log replays the same card
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    expect(page.locator("article.live .subagent[data-index='1']")).to_have_attribute("data-status", "succeeded")
    expect(page.locator("article.live .approval")).to_have_count(1)
    assert page.locator("article.live").inner_text() == live
    page.locator(".approval button.approve").click()
    _settled(page)  # the parent answered: its stored reply replaces the live card
    expect(page.locator("article.assistant").last).to_contain_text("child-zero")
    live = _texts(page)
    page.reload()
    assert _texts(page) == live
    assert not page.js_errors


@pytest.mark.req("UX-1", "UX-5")
def test_markdown_code_and_tables_render_and_a_script_payload_never_runs(context, embedded_server_module):
    base, _ = embedded_server_module
    page = open_conversation(context, base, _new(context, base, "markdown"))
    _send(
        page,
        "# Title\n\n| tool | ok |\n|---|---|\n| bash | yes |\n\n- [x] done\n\n"
        "```python\ndef f():\n    return 1 < 2\n```\n\n"
        '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> '
        "[bad](javascript:window.__pwned=3) [good](https://example.org/) ![diagram](https://example.org/d.png)",
    )
    _settled(page)
    prompt = page.locator("article.user").last
    expect(prompt.locator("table td").first).to_have_text("bash")
    expect(prompt.locator("input[type=checkbox][checked]")).to_have_count(1)
    block = prompt.locator(".code-block")
    expect(block.locator(".code-lang")).to_have_text("python")
    expect(block.locator("pre .k").first).to_have_text("def")  # highlighted
    expect(prompt).to_contain_text("<script>window.__pwned = 1</script>")  # shown as text
    expect(prompt.locator("script, img")).to_have_count(0)
    expect(prompt.locator("a", has_text="good")).to_have_attribute("rel", re.compile("noopener"))
    expect(prompt.locator("a", has_text="bad")).to_have_count(0)
    # A remote image is a link to it: the CSP would refuse to load it (the fixture fails on that).
    expect(prompt.locator("a.image-link")).to_have_attribute("href", "https://example.org/d.png")
    expect(prompt.locator("a.image-link")).to_have_text("diagram")
    block.locator("button.copy").click()
    expect(block.locator("button.copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == "def f():\n    return 1 < 2\n"
    assert page.evaluate("window.__pwned") is None
    screenshot(page, "chat-markdown")

    # A wide table keeps whole words in its cells and scrolls inside its block; the page never does (UX-5).
    header = " | ".join(f"heading{n}word" for n in range(12))
    _send(page, f"| {header} |\n|{'---|' * 12}\n| {' | '.join(['cell'] * 12)} |")
    _settled(page)
    table = page.locator("article.user").last.locator("table")
    for width in (PHONE, DESKTOP):
        page.set_viewport_size({"width": width, "height": 800})
        widths = page.evaluate(WIDEST)
        assert widths[0] <= widths[1], f"at {width} px the page is {widths[0]} px wide: {widths[2]}"
        scroll, client = table.evaluate("(t) => [t.scrollWidth, t.clientWidth]")
        assert scroll > client, f"at {width} px the table does not scroll: {scroll} ≤ {client}"
        lines = table.locator("th").evaluate_all(
            "cells => cells.map((c) =>"
            " Math.round(c.getBoundingClientRect().height / parseFloat(getComputedStyle(c).lineHeight)))"
        )
        assert set(lines) == {1}, f"at {width} px header cells broke into {lines} lines"
    page.set_viewport_size({"width": 1100, "height": 800})

    page.emulate_media(color_scheme="dark")
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")  # follows the system
    screenshot(page, "chat-markdown-dark")
    page.locator("#theme-toggle").click()
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "light")  # the toggle is remembered


@pytest.mark.req("UX-5", "UX-2", "CH-10")
def test_no_page_overflows_sideways_and_a_long_conversation_follows_the_stream(context, embedded_server_module):
    base, log = embedded_server_module
    seeded = seed(
        log.parent,
        "c = Conversation.objects.create(owner=admin, title='long ' + 'x' * 300)\n"
        "parent = None\n"
        "for n in range(60):\n"
        "    role = 'user' if n % 2 == 0 else 'assistant'\n"
        "    text = ('y' * 100000) if n == 10 else f'message {n} ' + 'words ' * 40\n"
        "    parent = Message.objects.create(conversation=c, parent=parent, role=role, "
        "content=[{'type': 'text', 'text': text}])\n"
        "c.tip = parent; c.save()\n"
        "r = Run.objects.create(conversation=c, trigger=parent.parent, provider='offline', model='offline-1', "
        "status='succeeded')\n"
        "print(json.dumps({'conversation': c.pk, 'run': r.pk}))\n",
    )
    conversation = seeded["conversation"]
    page = open_conversation(context, base, conversation)
    pages = {
        "list": "/",
        "conversation": f"/conversations/{conversation}/",
        "tree": f"/conversations/{conversation}/tree/",
        "context": f"/conversations/{conversation}/context/",
        "run": f"/runs/{seeded['run']}/",
        "dashboard": "/dashboard/",
    }
    for width in (PHONE, DESKTOP):
        page.set_viewport_size({"width": width, "height": 900})
        for name, url in pages.items():
            page.goto(base + url)
            widths = page.evaluate(WIDEST)
            assert widths[0] <= widths[1], f"{name} at {width} px is {widths[0]} px wide: {widths[2]}"
            _shot(page, f"{name}-{width}")
            if width == DESKTOP:  # and each page in dark mode, for docs/ui.md
                page.emulate_media(color_scheme="dark")
                page.reload()
                _shot(page, f"{name}-dark")
                page.emulate_media(color_scheme="light")
        page.goto(base + pages["tree"])
        assert page.locator("#checkpoint-label").bounding_box()["width"] >= 120  # usable, not squeezed

    page.set_viewport_size({"width": 1100, "height": 800})
    page.goto(base + pages["conversation"])
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    at_bottom = "window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80"
    assert page.evaluate(at_bottom)  # opens at the newest message
    _send(page, "follow me")
    expect(page.locator("article.assistant").last).to_contain_text('"follow me"', timeout=scaled(15_000))
    _settled(page)
    assert page.evaluate(at_bottom)  # followed the reply
    page.mouse.wheel(0, -3000)  # the person scrolls up to read: the page stays there
    page.wait_for_function(f"() => !({at_bottom})")  # a function, not an expression: the CSP refuses eval
    other = open_conversation(context, base, conversation)  # a message from another tab streams in meanwhile
    _send(other, "do not move")
    expect(page.locator("article.assistant").last).to_contain_text('"do not move"', timeout=scaled(15_000))
    _settled(page)
    expect(page.locator("#jump-latest")).to_be_visible()
    assert not page.evaluate(at_bottom)
    page.locator("#jump-latest").click()
    assert page.evaluate(at_bottom)

    # Slash commands (UX-5): the menu opens in view with each command's arguments, and a whole
    # command typed out runs on Enter.
    page.locator("#composer-input").focus()
    page.keyboard.type("/")
    menu = page.locator("#slash-menu")
    expect(menu).to_be_visible()
    box = menu.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= 800
    expect(menu.locator("#slash-branch")).to_contain_text("/branch <message id>")
    expect(menu.locator("#slash-checkpoint")).to_contain_text("/checkpoint <label>")
    page.keyboard.type("shake")
    page.keyboard.press("Enter")
    expect(page.locator("#messages article.command-result[data-command=shake]")).to_contain_text("/shake:")
    expect(page.locator("#composer-input")).to_have_value("")
    # A leading "/" that is no command is sent as a prompt, and the page says so (CH-10).
    page.locator("#composer-input").fill("/usr/bin/python3 crashes on start")
    page.keyboard.press("Enter")
    expect(page.locator("article.user").last).to_contain_text(
        "/usr/bin/python3 crashes on start", timeout=scaled(15_000)
    )
    prompt_note = page.locator("#messages article.prompt-note")
    expect(prompt_note).to_contain_text("is not a command, so it was sent as a message")
    _settled(page)
    # The notes stay where they came, among the messages: the later prompt and its reply are drawn
    # below them, not above (UX-2: messages stay in order).
    kinds = page.locator("#messages > article").evaluate_all(
        "cards => cards.map((c) => c.dataset.command || [...c.classList].pop())"
    )
    assert kinds[-4:] == ["shake", "prompt-note", "user", "assistant"], kinds


@pytest.mark.req("UX-5")
def test_an_expired_session_goes_to_the_sign_in_page(context, embedded_server_module):
    base, _ = embedded_server_module
    page = context.new_page()
    conversation = _new(context, base, "expiring")
    page.goto(f"{base}/conversations/{conversation}/")
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    context.clear_cookies()  # the session ends while the page is open
    _send(page, "are you there?")
    expect(page).to_have_url(re.compile(r"/login/\?next="))
    assert parse_qs(urlsplit(page.url).query)["next"] == [f"/conversations/{conversation}/"]
    expect(page.locator("body")).not_to_contain_text("Authentication credentials")
    # Signed in again, the page has the message back in its box and says why (QA: it was lost).
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", EMBEDDED_ADMIN_PASSWORD)
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"/conversations/{conversation}/$"))
    expect(page.locator("#composer-input")).to_have_value("are you there?")
    expect(page.locator("#status")).to_have_text(
        "Your session had ended; the message you were writing is back in the box."
    )
    context.close()


def _light_and_dark(page, name: str) -> None:
    _shot(page, f"{name}-{DESKTOP}")
    page.emulate_media(color_scheme="dark")
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    _shot(page, f"{name}-dark")
    page.emulate_media(color_scheme="light")


def _assert_security_headers(name: str, headers: dict[str, str]) -> None:
    policy = dict((directive.split(" ", 1) + [""])[:2] for directive in headers["content-security-policy"].split("; "))
    for directive in ("script-src", "style-src", "default-src", "connect-src", "img-src"):
        sources = policy[directive].split()
        assert "'unsafe-inline'" not in sources and "'unsafe-eval'" not in sources, (name, directive)
        # Nothing from another origin: only 'self', 'none' and data: images.
        assert set(sources) <= {"'self'", "'none'", "data:"}, (name, directive, sources)
    assert policy["frame-ancestors"] == "'none'", name
    assert policy["object-src"] == "'none'", name
    assert headers["x-content-type-options"] == "nosniff", name
    assert headers["referrer-policy"] == "same-origin", name
    assert headers["x-frame-options"] == "DENY", name


@pytest.mark.req("SB-6")
def test_every_page_sends_the_security_headers_and_breaks_no_csp_rule_in_use(context, embedded_server_module):
    """Each page is opened and used a little in Chromium: the headers are on every response, and
    the context fixture fails the test on any CSP violation (the API docs included: offline,
    from the app's own Swagger UI)."""
    base, log = embedded_server_module
    seeded = seed(
        log.parent,
        "from scratchpad.services import put_observation\n"
        "c = Conversation.objects.create(owner=admin, title='headers')\n"
        "m = Message.objects.create(conversation=c, role='user', content=[{'type': 'text', 'text': "
        "'| l | c | r |\\n|:--|:-:|--:|\\n| 1 | 2 | 3 |'}])\n"
        "c.tip = m; c.save()\n"
        "r = Run.objects.create(conversation=c, trigger=m, provider='offline', model='offline-1', status='failed', "
        "error='boom')\n"
        "entry, _ = put_observation(turn_id=str(r.pk), step_num=1, executor_name='read_file', "
        "observation={'ok': True, 'content': 'x' * 9000}, threshold=4096, run_id=r.pk, conversation_id=c.pk)\n"
        "print(json.dumps({'conversation': c.pk, 'run': r.pk, 'entry': entry.pk}))\n",
    )
    conversation, run = seeded["conversation"], seeded["run"]
    page = context.new_page()
    pages = {
        "list": "/",
        "conversation": f"/conversations/{conversation}/",
        "tree": f"/conversations/{conversation}/tree/",
        "context": f"/conversations/{conversation}/context/",
        "run": f"/runs/{run}/",
        "dashboard": "/dashboard/",
        "scratchpad": f"/scratchpad/{seeded['entry']}/",
        "api docs": "/api/docs/",
        "admin": "/admin/",
        "admin runs": "/admin/agents/run/",
        "admin run": f"/admin/agents/run/{run}/change/",
        "admin conversation": f"/admin/conversations/conversation/{conversation}/change/",
        "not found": "/conversations/999999999/",
    }
    for name, url in pages.items():
        response = page.goto(base + url)
        _assert_security_headers(name, response.all_headers())
    for name, url in {"schema": "/api/schema/", "api": f"/api/conversations/{conversation}/"}.items():
        _assert_security_headers(name, context.request.get(base + url).headers)  # downloads, not pages
    page.goto(base + pages["conversation"])  # used, not only opened: the live page, a Markdown table
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    expect(page.locator("article.user td.align-right")).to_have_text("3")
    page.locator("#theme-toggle").click()
    page.evaluate("localStorage.removeItem('cc-theme')")  # back to following the system
    page.goto(base + pages["context"])
    assert page.locator("#context-bar .segment").first.evaluate("node => node.style.width").endswith("%")
    page.goto(base + pages["tree"])
    assert page.locator("#tree [data-level]").first.evaluate("node => node.style.getPropertyValue('--level')") == "0"
    page.goto(base + pages["api docs"])
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Control Center API", timeout=scaled(10_000))
    page.goto(base + pages["dashboard"])
    expect(page.locator("canvas").first).to_be_visible()
    page.set_viewport_size({"width": DESKTOP, "height": 900})
    page.goto(base + pages["scratchpad"])
    expect(page.locator("h1")).to_contain_text(seeded["entry"])
    _light_and_dark(page, "scratchpad")  # docs/ui.md: the pages the width journey does not open
    page.close()
    signed_out = context.browser.new_context(viewport={"width": DESKTOP, "height": 900})
    refused = _watch_csp(signed_out)
    login = signed_out.new_page()
    _assert_security_headers("login", login.goto(base + "/login/").all_headers())
    expect(login.locator("input[name=username]")).to_be_visible()
    _light_and_dark(login, "login")
    signed_out.close()
    assert not refused, refused
