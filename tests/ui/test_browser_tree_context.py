"""The tree navigator, fork, the Context view and /shake in a real headless Chromium against the
embedded server. Each test saves a screenshot of its page in var/test-artifacts/."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import api_call, screenshot, seed, sign_in
from tests.support.timing import scaled

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# Two finished turns; the second prompt was edited, so the tree forks under the first answer.
# The tip is on the edited branch; the first branch's turn ran a tool with a large result.
SEED = """
def add(parent, role, content):
    return Message.objects.create(conversation=c, parent=parent, role=role, content=content)
text = lambda t: [{'type': 'text', 'text': t}]
c = Conversation.objects.create(owner=admin, title='branches')
p1 = add(None, 'user', text('Plan the migration.'))
a1 = add(p1, 'assistant', text('Here is the plan.'))
p2 = add(a1, 'user', text('List the files.'))
call = add(p2, 'assistant', text('Listing.') + [{'type': 'tool_use', 'id': 'tu1', 'name': 'list_dir', 'input': {}}])
result = add(call, 'user', [{'type': 'tool_result', 'tool_use_id': 'tu1',
    'content': json.dumps({'ok': True, 'entries': ['file%d.txt' % i for i in range(3000)]})}])
a2 = add(result, 'assistant', text('There are 3000 files.'))
p3 = add(a2, 'user', text('Summarise them.'))
a3 = add(p3, 'assistant', text('They are numbered files.'))
e2 = add(a1, 'user', text('List only the text files.'))
b2 = add(e2, 'assistant', text('Only text files here.'))
c.tip = b2; c.save()
print(json.dumps({'conversation': c.pk, 'a3': a3.pk, 'b2': b2.pk, 'a1': a1.pk}))
"""


@pytest.mark.req("CH-7")
@pytest.mark.req("CH-9")
@pytest.mark.req("CH-10")
def test_tree_opens_from_the_slash_command_and_switches_branch_by_click_and_keyboard(
    embedded_server_module, page, tmp_path
):
    base, log = embedded_server_module
    seeded = seed(log.parent, SEED)
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/")
    expect(page.locator("article.message").last).to_contain_text("Only text files here.")
    page.fill("#composer-input", "/tree")
    page.keyboard.press("Escape")  # close the menu; Enter then sends the command
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"/conversations/{seeded['conversation']}/tree/$"))

    tip = page.locator("#tree [aria-selected=true]")
    expect(tip).to_have_attribute("data-message-id", str(seeded["b2"]))
    expect(tip).to_be_focused()  # the keyboard starts at the tip
    expect(page.locator("#tree [role=treeitem]")).to_have_count(10)
    screenshot(page, "tree-before")

    page.click(f"#m-{seeded['a3']}")  # the other branch's last answer
    expect(page.locator("#tree [aria-selected=true]")).to_have_attribute("data-message-id", str(seeded["a3"]))
    expect(page.locator("#tree-status")).to_have_text(f"The tip is now #{seeded['a3']}.")
    expect(page.locator(f"#m-{seeded['b2']}")).not_to_have_class(re.compile(r"\bon-path\b"))

    # Keyboard: from the focused tip, Home goes to the root's answer chain; Enter moves the tip.
    expect(page.locator(f"#m-{seeded['a3']}")).to_be_focused()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowDown")  # #a1, the first answer
    expect(page.locator(f"#m-{seeded['a1']}")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#tree [aria-selected=true]")).to_have_attribute("data-message-id", str(seeded["a1"]))

    # A checkpoint at the first answer, explore back to the other branch, then rewind to it.
    page.fill("#checkpoint-label", "planned")
    page.keyboard.press("Enter")
    expect(page.locator("#checkpoints li[data-label=planned]")).to_contain_text("at the tip")
    page.click(f"#m-{seeded['a3']}")
    expect(page.locator("#tree [aria-selected=true]")).to_have_attribute("data-message-id", str(seeded["a3"]))
    page.click("button.rewind[data-label=planned]")
    expect(page.locator("#tree-status")).to_contain_text("Rewound to planned")
    expect(page.locator("#tree [aria-selected=true]")).to_have_attribute("data-message-id", str(seeded["a1"]))
    expect(page.locator(".rewinds")).to_contain_text("planned")
    screenshot(page, "tree-after-branch")

    page.go_back()  # one Back leaves the tree, however many actions were taken on it
    expect(page).to_have_url(re.compile(rf"/conversations/{seeded['conversation']}/$"))
    expect(page.locator("article.message").last).to_contain_text("Here is the plan.")  # the new path


@pytest.mark.req("CH-8")
def test_fork_from_the_tree_opens_the_copy(embedded_server_module, page, tmp_path):
    base, log = embedded_server_module
    seeded = seed(log.parent, SEED)
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/tree/")
    page.click("#fork")
    expect(page.locator("h1")).to_have_text("branches (fork)")
    match = re.search(r"/conversations/(\d+)/$", page.url)
    assert match and int(match.group(1)) != seeded["conversation"]
    expect(page.locator("article.message")).to_have_count(4)  # the current path, copied
    expect(page.locator(".page-links")).to_contain_text(f"forked from conversation {seeded['conversation']}")
    page.click("#tree-link")
    expect(page.locator("#tree [role=treeitem]")).to_have_count(4)  # no rows shared with the source
    screenshot(page, "fork")


@pytest.mark.req("TD-15")
@pytest.mark.req("CH-10")
def test_context_view_opens_from_the_slash_command_with_the_apis_figures(embedded_server_module, page, tmp_path):
    base, log = embedded_server_module
    seeded = seed(log.parent, SEED.replace("c.tip = b2", "c.tip = a3"))
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/")
    page.fill("#composer-input", "/context")
    page.keyboard.press("Escape")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/context/$"))
    expect(page.locator("h1")).to_have_text("What fills the context window")
    api = page.evaluate(f"fetch('/api/conversations/{seeded['conversation']}/context/').then(r => r.json())")
    expect(page.locator("#used-tokens")).to_have_text(f"{api['used_tokens']:,}")
    bar = page.locator("#context-bar .segment")
    expect(bar.first).to_be_visible()
    assert bar.count() == sum(1 for c in api["categories"] if c["tokens"] > 0)
    for category in api["categories"]:
        row = page.locator(f"#categories tr[data-category={category['name']}] td").nth(1)
        expect(row).to_have_text(f"{category['tokens']:,}")
    by_name = {category["name"]: category["tokens"] for category in api["categories"]}
    assert by_name["tool_results"] > 1000 and by_name["tool_prompt"] > 0
    expect(page.locator("#resident-tools tbody tr")).to_have_count(max(1, len(api["tools"]["resident"])))
    screenshot(page, "context-view")


@pytest.mark.req("CH-1")
@pytest.mark.req("CH-10")
def test_shake_shows_what_each_free_rung_did(embedded_server_module, page, tmp_path):
    base, log = embedded_server_module
    seeded = seed(log.parent, SEED.replace("c.tip = b2", "c.tip = a3"))
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/")
    page.fill("#composer-input", "/shake")
    page.keyboard.press("Escape")
    page.keyboard.press("Enter")
    note = page.locator("article.command-result[data-command=shake]")
    expect(note).to_contain_text("/shake:")
    rows = note.locator("table.rungs tr")
    expect(rows).to_have_count(3)  # header, elide, drop_images
    expect(rows.nth(1).locator("td").first).to_have_text("elide")
    freed = int(rows.nth(1).locator("td").nth(3).inner_text())
    assert freed > 1000  # the 3,000-entry listing of the older turn was elided
    expect(page.locator("#status")).to_contain_text("tokens sent (rung: elide)")
    expect(page.locator("#composer-input")).to_have_value("")
    screenshot(page, "shake")


@pytest.mark.req("CH-7")
def test_edit_and_rerun_from_the_tree_keeps_both_answers(embedded_server_module, page, tmp_path):
    base, log = embedded_server_module
    seeded = seed(log.parent, SEED)
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/tree/")
    first_prompt = page.locator("#tree [role=treeitem]").first
    first_prompt.focus()
    page.keyboard.press("e")  # edit from the keyboard
    expect(page.locator("#edit-text")).to_be_focused()
    expect(page.locator("#edit-text")).to_have_value("Plan the migration.")
    page.fill("#edit-text", "Plan the migration, in two steps.")
    page.click("#edit-form button[type=submit]")
    expect(page).to_have_url(re.compile(rf"/conversations/{seeded['conversation']}/$"))
    expect(page.locator("article.message.user").last).to_contain_text("in two steps")  # the new path
    api = f"/api/conversations/{seeded['conversation']}/"
    for _ in range(75):  # the run answers within seconds; its reply moves the tip
        if page.evaluate(f"fetch('{api}').then(r => r.json())")["path"][-1]["role"] == "assistant":
            break
        page.wait_for_timeout(200)
    page.goto(f"{base}/conversations/{seeded['conversation']}/tree/")
    roots = page.locator("#tree [role=treeitem][aria-level='2'].user")
    expect(roots.filter(has_text="Plan the migration.")).to_have_count(1)  # the old prompt stays
    expect(roots.filter(has_text="in two steps")).to_have_count(1)
    expect(page.locator("#tree [aria-selected=true]")).to_have_class(re.compile(r"\bassistant\b"))
    screenshot(page, "tree-edited")


@pytest.mark.req("SP-6")
@pytest.mark.req("TD-15")
def _seed_log_entry(folder) -> dict:
    """A conversation whose run offloaded a 5,000-line log with an error every 1,000 lines."""
    return seed(
        folder,
        SEED.replace("print(", "seeded = (") + "from scratchpad.services import put_observation\n"
        "r = Run.objects.create(conversation=c, trigger=e2, provider='offline', model='offline-1', "
        "status='succeeded')\n"
        "log = ''.join('line %d %s\\n' % (i, 'ERROR disk full' if i % 1000 == 7 else 'ok') for i in range(5000))\n"
        "entry, _ = put_observation(turn_id=str(r.pk), step_num=1, executor_name='read_file', "
        "observation={'ok': True, 'path': 'app.log', 'content': log}, threshold=4096, run_id=r.pk, "
        "conversation_id=c.pk)\n"
        "print(json.dumps({'conversation': c.pk, 'entry': entry.pk}))\n",
    )


def test_context_view_links_the_turns_scratchpad_entries_to_a_slice_viewer(embedded_server_module, page, tmp_path):
    base, log = embedded_server_module
    seeded = _seed_log_entry(log.parent)
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/context/")
    link = page.locator(f"#scratchpad-entries a[href='/scratchpad/{seeded['entry']}/']")
    expect(link).to_be_visible()
    link.click()
    expect(page.locator("h1")).to_contain_text(seeded["entry"])
    page.select_option("#slice-mode", "grep")
    page.fill("input[name=pattern]", "ERROR")
    page.keyboard.press("Enter")  # the keyboard submits the read
    slice_text = page.locator("#slice")
    expect(slice_text).to_contain_text("8:line 7 ERROR disk full")
    expect(slice_text).to_contain_text("4008:line 4007 ERROR disk full")
    expect(page.locator("#slice-status")).to_contain_text("matches: 5")
    page.select_option("#slice-mode", "lines")
    page.fill("input[name=start]", "2")
    page.fill("input[name=end]", "3")
    page.click("#slice-form button")
    expect(slice_text).to_have_text("line 1 ok\nline 2 ok\n")
    page.fill("input[name=end]", "1")  # reversed: the API's message, nothing else
    page.click("#slice-form button")
    expect(page.locator("#slice-status.error")).to_contain_text("start <= end")
    # The slice shown before answered another question: never left under the error (QA).
    expect(slice_text).to_have_text("")
    screenshot(page, "scratchpad-viewer")


@pytest.mark.req("SP-6")
def test_the_slice_viewer_reads_what_was_asked_even_before_its_script_has_loaded(embedded_server_module, page):
    base, log = embedded_server_module
    seeded = _seed_log_entry(log.parent)
    sign_in(page, base)
    # Enter pressed before the script loaded (a slow connection) submits the form itself.
    page.route("**/cc/scratchpad.js", lambda route: route.abort())
    page.goto(f"{base}/scratchpad/{seeded['entry']}/")
    page.select_option("#slice-mode", "grep")
    page.fill("input[name=pattern]", "ERROR")
    page.keyboard.press("Enter")
    expect(page.locator("#slice")).to_contain_text("4008:line 4007 ERROR disk full")
    expect(page.locator("#slice-status")).to_contain_text("matches: 5")
    expect(page.locator("#slice-mode")).to_have_value("grep")
    expect(page.locator("input[name=pattern]")).to_have_value("ERROR")


LONG_SEED = """
c = Conversation.objects.create(owner=admin, title='long')
parent = None
ids = []
for n in range(300):
    parent = Message.objects.create(conversation=c, parent=parent, role='user' if n % 2 == 0 else 'assistant',
        content=[{'type': 'text', 'text': 'message %d' % n}])
    ids.append(parent.pk)
side = parent
for n in range(40):  # a long branch under message 250: folded beside the shown path
    side = Message.objects.create(conversation=c, parent=side if n else Message.objects.get(pk=ids[250]),
        role='assistant' if n % 2 == 0 else 'user', content=[{'type': 'text', 'text': 'side %d' % n}])
c.tip_id = ids[-1]; c.save()
print(json.dumps({'conversation': c.pk, 'ids': ids}))
"""


@pytest.mark.req("CH-7")
def test_a_long_tree_is_windowed_and_folds_open_by_keyboard_then_the_tip_moves_inside_them(
    embedded_server_module,
    page,
    tmp_path,
):
    base, log = embedded_server_module
    seeded = seed(log.parent, LONG_SEED)
    ids = seeded["ids"]
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/tree/")
    items = page.locator("#tree [role=treeitem]")
    expect(page.locator("#tree [aria-selected=true]")).to_have_attribute("data-message-id", str(ids[-1]))
    expect(page.locator("#tree [aria-selected=true]")).to_be_focused()
    expect(items).to_have_count(102)  # 100 messages of the path, the earlier path and the side branch folded
    path_fold, side_fold = page.locator("#tree li.fold").first, page.locator("#tree li.fold").last
    expect(path_fold).to_contain_text("Show 200 earlier messages")
    expect(side_fold).to_contain_text(f"Show a branch of 40 messages from #{ids[250]}")
    screenshot(page, "tree-windowed")

    page.keyboard.press("Home")  # the earlier-path fold
    expect(path_fold).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#tree-status")).to_have_text("Showing 200 more messages.")
    expect(page.locator(f"#m-{ids[199]}")).to_be_focused()  # the row next to where the fold was
    expect(items).to_have_count(301)
    expect(page.locator(f"#m-{ids[0]}")).to_have_attribute("aria-level", "1")

    page.locator("#tree li.fold").last.click()  # the side branch, by mouse
    expect(page.locator("#tree li.fold")).to_have_count(0)
    page.locator("#tree li.node", has_text="side 39").click()  # move the tip into the opened branch
    expect(page.locator("#tree-status")).to_contain_text("The tip is now #")
    selected = page.locator("#tree [aria-selected=true]")
    expect(selected).to_contain_text("side 39")
    expect(selected).to_be_focused()
    # A new window around the new tip: the old continuation (49 messages) is now the folded branch.
    expect(page.locator("#tree li.fold").last).to_contain_text(f"Show a branch of 49 messages from #{ids[250]}")
    expect(items).to_have_count(102)
    screenshot(page, "tree-windowed-moved")


@pytest.mark.req("CH-7", "UX-4")
def test_the_tree_page_draws_the_answer_once_the_run_at_the_tip_ends(embedded_server_module, page):
    """QA: its note said the answer "appears here when it ends", and it never did without a reload."""
    base, _ = embedded_server_module
    sign_in(page, base)
    page.fill("#new-conversation input[name=title]", "tree live")
    page.click("#new-conversation button")
    expect(page.locator("#conversation[data-live]")).to_have_count(1)
    page.fill("#composer-input", "please run `echo tree-live`")
    page.keyboard.press("Enter")
    approval = page.locator(".approval").last
    expect(approval).to_contain_text("echo tree-live", timeout=scaled(15_000))  # the run waits: it holds the tip

    tree = page.context.new_page()
    tree.goto(page.url.rstrip("/") + "/tree/")
    expect(tree.locator("#tree-running")).to_be_visible()
    approval.locator("button.approve").click()
    expect(tree.locator("#tree-running")).to_have_count(0, timeout=scaled(15_000))
    expect(tree.locator("#tree")).to_contain_text("exited with 0")


@pytest.mark.req("CH-7", "UX-4")
def test_the_tree_page_redraws_for_a_branch_made_elsewhere_but_not_over_an_edit_being_typed(
    embedded_server_module, page
):
    base, log = embedded_server_module
    seeded = seed(log.parent, SEED)
    sign_in(page, base)
    page.goto(f"{base}/conversations/{seeded['conversation']}/tree/")
    expect(page.locator("#tree-page[data-live]")).to_have_count(1)  # its socket is open
    tip = page.locator("#tree [aria-selected=true]")
    expect(tip).to_have_attribute("data-message-id", str(seeded["b2"]))

    branch_url = f"{base}/api/conversations/{seeded['conversation']}/branch/"

    def branch(message_id: int) -> None:
        api_call(page.context, "POST", branch_url, {"message": message_id})

    # Another tab (here the API) moves the tip: this page follows without a reload by hand.
    branch(seeded["a3"])
    expect(tip).to_have_attribute("data-message-id", str(seeded["a3"]), timeout=scaled(15_000))
    expect(page.locator("#tree-status")).to_have_text("Changed elsewhere: the tree is drawn again.")

    # An edit being typed holds the redraw until the form closes; then the tree follows.
    expect(page.locator("#tree-page[data-live]")).to_have_count(1)
    page.locator("#tree [role=treeitem]").first.focus()
    page.keyboard.press("e")
    page.fill("#edit-text", "A draft that must survive.")
    branch(seeded["b2"])
    expect(page.locator("#tree-status")).to_have_text(
        "Changed elsewhere: the tree is drawn again once this edit closes.", timeout=scaled(15_000)
    )
    expect(page.locator("#edit-text")).to_have_value("A draft that must survive.")
    page.keyboard.press("Escape")
    expect(tip).to_have_attribute("data-message-id", str(seeded["b2"]), timeout=scaled(15_000))
