"""Two tabs on one conversation in Debian's headless Chromium: a move of the tip that queues no run
(a sibling arrow, a branch, a rewind) made in one tab or through the API redraws the other at once
(UX-4, CH-7, CH-9). One embedded server and one browser serve the module.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.support.browser import api_call, open_conversation, seed, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# The live cue arrives within a second on a quiet machine. Without it the page never learns of these
# moves (it redraws on socket events, a reconnect or its own actions), so the cap is only for a
# loaded CI host, where a fetch and a redraw have taken seconds.
LIVE_MS = 15_000

# Two finished turns whose second prompt was edited: two branches under the first answer, the tip
# on the edited one; a checkpoint marks the first answer.
SEED = """
def add(parent, role, t):
    return Message.objects.create(conversation=c, parent=parent, role=role, content=[{'type': 'text', 'text': t}])
from conversations.models import Checkpoint
c = Conversation.objects.create(owner=admin, title='two tabs')
p1 = add(None, 'user', 'Plan the migration.')
a1 = add(p1, 'assistant', 'Here is the plan.')
p2 = add(a1, 'user', 'List the files.')
a2 = add(p2, 'assistant', 'There are 3000 files.')
e2 = add(a1, 'user', 'List only the text files.')
b2 = add(e2, 'assistant', 'Only text files here.')
c.tip = b2; c.save()
Checkpoint.objects.create(conversation=c, label='planned', message=a1)
print(json.dumps({'conversation': c.pk, 'b2': b2.pk}))
"""


@pytest.fixture
def context(browser, embedded_server_module):
    base, _ = embedded_server_module
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    sign_in(context.new_page(), base)
    yield context
    context.close()


@pytest.mark.req("UX-4", "CH-7", "CH-9")
def test_a_branch_switch_or_rewind_elsewhere_redraws_the_other_tab_within_a_moment(context, embedded_server_module):
    base, log = embedded_server_module
    seeded = seed(log.parent, SEED)
    conversation = seeded["conversation"]
    tab_a = open_conversation(context, base, conversation)
    tab_b = open_conversation(context, base, conversation)
    last_b = tab_b.locator("#messages > article").last
    expect(last_b).to_contain_text("Only text files here.")

    # Tab A's sibling arrow on the edited prompt: tab B follows to the other branch.
    tab_a.locator("article.user button[aria-label='Previous version']").click()
    expect(tab_a.locator("#messages > article").last).to_contain_text("There are 3000 files.")
    expect(last_b).to_contain_text("There are 3000 files.", timeout=LIVE_MS)
    expect(tab_b.locator("article.user .sibling-count")).to_have_text("1/2")

    # A branch through the API (the tree page's action): back to the edited branch.
    api_call(context, "POST", f"{base}/api/conversations/{conversation}/branch/", {"message": seeded["b2"]})
    expect(last_b).to_contain_text("Only text files here.", timeout=LIVE_MS)

    # A rewind to the checkpoint: both tabs end at the first answer.
    api_call(context, "POST", f"{base}/api/conversations/{conversation}/rewind/", {"label": "planned"})
    expect(last_b).to_contain_text("Here is the plan.", timeout=LIVE_MS)
    expect(tab_a.locator("#messages > article").last).to_contain_text("Here is the plan.", timeout=LIVE_MS)
    assert not tab_a.js_errors and not tab_b.js_errors
