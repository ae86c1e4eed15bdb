"""The UI in a real headless Chromium against the embedded server (its own worker thread):
the slash menu by keyboard, approval prompts by keyboard, the run page, and the dashboard's
cache ratio changing live after a new run. Each test saves a screenshot of its page in
var/test-artifacts/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import new_conversation, screenshot, seed, sign_in
from tests.support.timing import scaled

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def _record_decisions(page) -> None:
    """Remember every approval card the page marks decided, as (approval id, decision).

    A decided card lives only until its run ends: the stored reply then replaces the live drawing.
    With the offline model a denied call's run ends within a second of the decision, so a check
    that polls the card itself could find it undecided, then gone (seen once under load).
    """
    page.evaluate(
        """() => {
            window.ccDecisions = [];
            new MutationObserver((records) => {
                for (const record of records) {
                    const { approvalId, decision } = record.target.dataset;
                    if (decision) window.ccDecisions.push([approvalId, decision]);
                }
            }).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-decision"] });
        }"""
    )


def _expect_decided(page, approval_id: str | None, decision: str) -> None:
    """The page marked the card of this approval with the decision (it may be gone by now, its run ended)."""
    assert approval_id
    page.wait_for_function(
        "([id, decision]) => window.ccDecisions.some(([i, d]) => i === id && d === decision)",
        arg=[approval_id, decision],
        timeout=scaled(15_000),
    )


@pytest.mark.req("CH-10")
def test_slash_menu_is_driven_by_the_keyboard_alone(embedded_server_module, page):
    base, log = embedded_server_module
    sign_in(page, base)
    new_conversation(page, "slash")
    composer = page.locator("#composer-input")
    menu = page.locator("#slash-menu")
    composer.focus()

    page.keyboard.type("/")
    expect(menu).to_be_visible()
    expect(composer).to_have_attribute("aria-expanded", "true")
    expect(menu.locator("[role=option]:visible")).to_have_count(8)
    expect(menu.locator("[aria-selected=true]")).to_have_attribute("data-command", "/compact")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    expect(menu.locator("[aria-selected=true]")).to_have_attribute("data-command", "/context")
    expect(composer).to_have_attribute("aria-activedescendant", "slash-context")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowUp")  # wraps from the first to the last
    expect(menu.locator("[aria-selected=true]")).to_have_attribute("data-command", "/rewind")
    screenshot(page, "conversation-slash-menu")

    page.keyboard.press("Escape")
    expect(menu).to_be_hidden()
    expect(composer).to_have_value("/")  # Escape closes the menu and keeps what was typed

    page.keyboard.type("c")  # "/c" narrows to the commands starting with it
    expect(menu).to_be_visible()
    expect(menu.locator("[role=option]:visible")).to_have_count(3)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Tab")
    expect(composer).to_have_value("/context ")
    expect(menu).to_be_hidden()
    expect(composer).to_be_focused()

    page.fill("#composer-input", "")
    page.keyboard.type("/sh")
    page.keyboard.press("Enter")  # Enter picks while the menu is open; it does not send
    expect(composer).to_have_value("/shake ")
    expect(page.locator("article.message")).to_have_count(0)

    page.fill("#composer-input", "")
    page.keyboard.type("/checkpoint")
    page.keyboard.press("Enter")  # typed whole, but its label is needed: Enter picks it, ready for one
    expect(composer).to_have_value("/checkpoint ")
    page.fill("#composer-input", "")
    page.keyboard.type("/rewind")
    page.keyboard.press("Enter")  # typed whole, and its label is optional: it is sent as typed
    expect(page.locator("#errors .error-card")).to_contain_text("no checkpoint behind the tip")  # the server's answer
    expect(composer).to_have_value("/rewind")
    page.locator("#errors .error-card button").first.click()

    page.fill("#composer-input", "")
    page.keyboard.type("/zzz")
    expect(menu).to_be_hidden()  # nothing matches: no empty menu

    page.fill("#composer-input", "")
    page.locator("h1").click()  # focus away from the composer
    page.keyboard.press("/")  # "/" anywhere starts a command
    expect(composer).to_be_focused()
    expect(composer).to_have_value("/")
    expect(menu).to_be_visible()


@pytest.mark.req("RN-4")
def test_a_shell_call_waits_for_approval_and_the_keyboard_approves_or_denies_it(embedded_server_module, page):
    base, log = embedded_server_module
    sign_in(page, base)
    new_conversation(page, "approvals")

    # The offline model asks for the shell, which requires a person's approval (RN-4).
    page.fill("#composer-input", "please run `echo approved-by-keyboard`")
    page.keyboard.press("Enter")
    prompt = page.locator(".approval").last
    expect(prompt).to_contain_text("echo approved-by-keyboard", timeout=scaled(15_000))
    # The prompt never takes focus (UX-3): Shift+Tab from the composer reaches Deny, then Approve.
    expect(page.locator("#composer-input")).to_be_focused()
    screenshot(page, "conversation-approval")
    page.keyboard.press("Shift+Tab")
    expect(prompt.locator("button.deny")).to_be_focused()
    page.keyboard.press("Shift+Tab")
    expect(prompt.locator("button.approve")).to_be_focused()
    _record_decisions(page)
    approval_id = prompt.get_attribute("data-approval-id")
    page.keyboard.press("Enter")
    _expect_decided(page, approval_id, "approved")
    expect(page.locator("#status")).to_have_text("Run finished.", timeout=scaled(15_000))
    expect(page.locator("#messages article.assistant").last).to_contain_text(
        "the command exited with 0: approved-by-keyboard"
    )

    page.fill("#composer-input", "please run `echo never-runs`")
    page.keyboard.press("Enter")
    prompt = page.locator(".approval").last
    expect(prompt).to_contain_text("echo never-runs", timeout=scaled(15_000))
    # What the waiting run would refuse (409) is offered disabled, saying why, and back once it ends.
    earlier = page.locator("#messages article.assistant button.regenerate, #messages article button.branch")
    # The first answer's Regenerate and Branch here, and Branch here on both prompts.
    expect(earlier).to_have_count(4)
    for index in range(4):
        expect(earlier.nth(index)).to_be_disabled()
        expect(earlier.nth(index)).to_have_attribute("title", "A run is answering: wait for it to finish, or stop it.")
    page.keyboard.press("Shift+Tab")
    expect(prompt.locator("button.deny")).to_be_focused()
    approval_id = prompt.get_attribute("data-approval-id")
    page.keyboard.press("Enter")
    _expect_decided(page, approval_id, "denied")
    expect(page.locator("#status")).to_have_text("Run finished.", timeout=scaled(15_000))
    reply = page.locator("#messages article.assistant").last
    expect(reply).to_contain_text("the tool failed")
    expect(reply).not_to_contain_text("exited with 0: never-runs")
    regenerate = page.locator("#messages article.assistant button.regenerate").first
    expect(regenerate).to_be_enabled()
    expect(regenerate).to_have_attribute("title", "Answer the same prompt again (a new branch)")


@pytest.mark.req("RN-4", "TD-14")
def test_subagents_approvals_appear_on_the_parent_conversation_and_the_keyboard_decides_them(
    embedded_server_module,
    page,
):
    base, log = embedded_server_module
    sign_in(page, base)
    new_conversation(page, "subagent approvals")

    # The offline model fans out one subagent per task; each asks for the shell (RN-4).
    page.fill("#composer-input", "in parallel: run `echo child-zero-ran`; run `echo child-one-ran`")
    page.keyboard.press("Enter")
    prompts = page.locator(".approval[data-subagent]")
    expect(prompts).to_have_count(2, timeout=scaled(30_000))
    zero = page.locator(".approval[data-subagent]", has_text="echo child-zero-ran")
    one = page.locator(".approval[data-subagent]", has_text="echo child-one-ran")
    expect(zero).to_contain_text("Subagent 0 (worker) asks to run bash")
    expect(one).to_contain_text("Subagent 1 (worker) asks to run bash")
    screenshot(page, "conversation-subagent-approvals")
    _record_decisions(page)
    zero.locator("button.approve").focus()
    page.keyboard.press("Enter")
    expect(zero).to_have_attribute("data-decision", "approved")  # the parent still waits for the other child
    one_id = one.get_attribute("data-approval-id")
    one.locator("button.deny").focus()
    page.keyboard.press("Space")
    _expect_decided(page, one_id, "denied")
    expect(page.locator("#status")).to_have_text("Run finished.", timeout=scaled(30_000))
    reply = page.locator("#messages")
    expect(reply).to_contain_text(
        "subagent 0 said: I am the offline model. I ran the tool and the command exited with 0: child-zero-ran"
    )
    expect(reply).to_contain_text(
        "subagent 1 said: I am the offline model. I ran the tool and the tool failed: A person denied"
    )


@pytest.mark.req("RN-2")
def test_run_page_shows_each_model_request_with_usage_and_the_event_timeline(embedded_server_module, page):
    base, log = embedded_server_module
    sign_in(page, base)
    new_conversation(page, "run page")
    page.fill("#composer-input", "please list the files in the workspace")
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_have_text("Run finished.", timeout=scaled(15_000))
    tool = page.locator("#messages article.assistant details.tool").first
    expect(tool.locator(".tool-state")).to_have_text("ok")  # the call and its result in one place
    tool.locator("summary").click()
    expect(tool).to_contain_text("Arguments")
    expect(tool).to_contain_text("Result")

    page.click("#run-link")
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    rows = page.locator("#model-requests tbody tr")
    expect(rows).to_have_count(2)  # the tool call step and the answer step
    headers = page.locator("#model-requests thead th").all_inner_texts()
    assert headers[1] == "Agent" and headers[3:7] == ["Uncached input", "Cache writes", "Cache reads", "Output"]
    reads, stops = [], []
    for row in rows.all():
        cells = row.locator("td").all_inner_texts()
        assert cells[1] == "this run"
        uncached, writes, read = (int(cells[i].replace(",", "")) for i in (3, 4, 5))
        assert uncached + writes + read > 0  # the prompt was recorded, split as the provider reported it
        reads.append(read)
        assert cells[8].split()[0] in ("hit", "miss", "uncached")
        stops.append(cells[9])
        assert cells[10].endswith(" ms")
    assert stops == ["tool_use", "end_turn"]
    assert reads[1] > 0  # the answer step read the tool step's prefix from the cache (TD-13)
    timeline = page.locator("#timeline")
    expect(timeline.locator(".event-tool_call")).to_contain_text("list_dir")
    expect(timeline.locator(".event-run_finished")).to_contain_text("succeeded")
    expect(page.locator("#run-status")).to_have_text("succeeded")
    screenshot(page, "run-page")


@pytest.mark.req("RN-2")
@pytest.mark.req("TD-15")
@pytest.mark.req("UX-4")
def test_dashboard_cache_ratio_changes_live_when_a_new_run_finishes(embedded_server, page, tmp_path):
    base, log = embedded_server
    # An earlier run that read most of its prompt from the cache: 900 of 1,000 tokens.
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
    ratio = page.locator("#cache-ratio")
    expect(ratio).to_have_text("90.0%")
    expect(page.locator("#dashboard[data-live]")).to_have_count(1)
    expect(page.locator("#chart-ratio-time")).to_be_visible()

    other = page.context.new_page()  # the conversation in another tab; the dashboard stays open
    other.goto(base + "/")
    new_conversation(other, "moves the ratio")
    note = page.locator("#saved-cache-note")
    expect(note).to_have_text("input-token equivalents: 900 reads at 0.1×")
    for count, text in enumerate(("hello dashboard", "and again"), start=1):
        other.locator("#composer-input").focus()
        other.fill("#composer-input", text)
        other.keyboard.press("Enter")
        expect(other.locator("article.assistant")).to_have_count(count, timeout=scaled(15_000))
        expect(other.locator("#status")).to_have_text("Run finished.", timeout=scaled(15_000))

    expect(ratio).not_to_have_text("90.0%", timeout=scaled(10_000))  # pushed, no reload
    # The second run's push, once its cache reads are counted ("Run finished." may still be the first run's).
    expect(page.locator("#saved-cache")).not_to_have_text("810", timeout=scaled(10_000))
    expected = page.evaluate("fetch('/dashboard/data/').then(r => r.json())")
    assert ratio.inner_text() == f"{expected['totals']['cache_ratio'] * 100:.1f}%"
    # The "Saved by caching" card follows as a whole: its detail line with its headline (QA: the
    # line kept its page-load figure).
    saved = expected["savings"]["cache"]
    assert saved["cache_read"] > 900, saved
    expect(page.locator("#saved-cache")).to_have_text(f"{saved['saved_tokens']:,}")
    expect(note).to_have_text(f"input-token equivalents: {saved['cache_read']:,} reads at 0.1×")
    expect(page.locator("#recent-runs tbody tr").first).to_contain_text("moves the ratio")
    expect(page.locator("#by-day tbody tr").first).to_contain_text(ratio.inner_text())  # one model, one day
    screenshot(page, "dashboard")


def test_conversation_list_searches_message_text_and_shows_recent_activity(embedded_server, page):
    base, log = embedded_server
    sign_in(page, base)
    new_conversation(page, "alpha")
    page.fill("#composer-input", 'the word "zebra" appears here')
    page.keyboard.press("Enter")
    expect(page.locator("#status")).to_have_text("Run finished.", timeout=scaled(15_000))
    page.goto(base + "/")
    new_conversation(page, "beta")
    page.goto(base + "/")
    items = page.locator("#conversations li")
    expect(items.first).to_contain_text("beta")  # most recent activity first
    expect(items.nth(1)).to_contain_text("2 messages")
    expect(items.nth(1)).to_contain_text("run succeeded")
    page.fill("input[name=q]", 'word "zebra"')  # SQLite here: the text is matched, not its escaped JSON
    page.keyboard.press("Enter")
    expect(items).to_have_count(1)
    expect(items.first).to_contain_text("alpha")
    page.fill("input[name=q]", "type")  # a key of the stored JSON, in no title or text
    page.keyboard.press("Enter")
    expect(items).to_have_text(["No conversation matches “type”."])
    page.fill("input[name=q]", "zebra")
    page.keyboard.press("Enter")
    expect(items).to_have_count(1)
    screenshot(page, "conversation-list")
