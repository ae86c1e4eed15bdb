"""The tree navigator's window (CH-7): the path around the tip and small branches drawn, the rest
folded and opened on demand, so the page stays small for 1,000 and 10,000 messages."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from conversations.models import Conversation, Message
from conversations.services import _reserve_message_ids
from engine.context import treeview
from engine.context.treeview import Fold, Row

# --- the pure window ---------------------------------------------------------------


def _chain(first: int, count: int, parent: int | None) -> list[tuple[int, int | None]]:
    return [(first + n, parent if n == 0 else first + n - 1) for n in range(count)]


def _rows(items) -> list[int]:
    return [item.id for item in items if isinstance(item, Row)]


def _folds(items) -> list[Fold]:
    return [item for item in items if isinstance(item, Fold)]


@pytest.mark.req("CH-7")
def test_a_long_chain_shows_the_last_hundred_messages_and_folds_the_earlier_path():
    tree = treeview.layout(_chain(1, 1000, None), tip=1000)
    items = treeview.window(tree)
    assert items[0] == Fold(first=1, count=900, level=0, kind="path", on_path=900, parent=None, keep="end")
    assert _rows(items) == list(range(901, 1001))


@pytest.mark.req("CH-7")
def test_opening_the_earlier_path_reveals_the_end_nearest_the_tip_a_slice_at_a_time():
    tree = treeview.layout(_chain(1, 1000, None), tip=1000)
    opened = treeview.expand(tree, 1, 900, "end")
    assert opened[0] == Fold(first=1, count=700, level=0, kind="more", on_path=700, parent=None, keep="end")
    assert _rows(opened) == list(range(701, 901))
    assert _rows(treeview.expand(tree, 1, 700, "end")[1:]) == list(range(501, 701))
    assert _rows(treeview.expand(tree, 1, 150, "end")) == list(range(1, 151))  # a short fold opens whole


@pytest.mark.req("CH-7")
def test_small_branches_beside_the_path_are_drawn_large_ones_folded_with_their_size():
    structure = _chain(1, 300, None)
    structure += _chain(1001, 5, 250)  # small, beside the shown path
    structure += _chain(2001, 50, 260)  # large, beside the shown path
    structure += _chain(3001, 3, 10)  # beside the folded earlier path
    structure += _chain(4001, 30, 300)  # under the tip
    tree = treeview.layout(sorted(structure), tip=300)
    items = treeview.window(tree)
    rows = set(_rows(items))
    assert set(range(201, 301)) <= rows and set(range(1001, 1006)) <= rows
    assert not rows & ({*range(2001, 2051), *range(3001, 3004), *range(4001, 4031)})
    folds = {fold.first: fold for fold in _folds(items)}
    assert (folds[1].kind, folds[1].count, folds[1].on_path) == ("path", 200, 200)
    # A branch after the path's own child in the order is a fold of its own, where it hangs.
    assert (folds[3001].kind, folds[3001].count, folds[3001].parent) == ("branch", 3, 10)
    assert (folds[2001].kind, folds[2001].count, folds[2001].parent) == ("branch", 50, 260)
    assert folds[2001].level == tree.level[260] + 1 == 3  # forks at 10, 250 and 260 indent
    assert (folds[4001].kind, folds[4001].count, folds[4001].parent) == ("branch", 30, 300)
    assert folds[2001].keep == "start"
    # Every message is in exactly one row or fold: nothing is lost by the window.
    assert len(rows) + sum(fold.count for fold in folds.values()) == len(structure)
    assert _rows(treeview.expand(tree, 2001, 50, "start")) == list(range(2001, 2051))


@pytest.mark.req("CH-7")
def test_a_large_branch_opens_from_its_start_and_leaves_the_rest_folded():
    tree = treeview.layout(_chain(1, 10, None) + _chain(11, 500, 5), tip=10)
    opened = treeview.expand(tree, 11, 500, "start")
    assert _rows(opened) == list(range(11, 211))
    assert opened[-1] == Fold(first=211, count=300, level=1, kind="more", on_path=0, parent=210, keep="start")


@pytest.mark.req("CH-7")
def test_other_first_prompts_are_drawn_beside_a_short_path_and_a_tipless_tree_starts_at_the_top():
    structure = [(1, None), (2, 1), (3, None), (4, 3)]  # the first prompt was edited: two roots
    tree = treeview.layout(structure, tip=4)
    assert _rows(treeview.window(tree)) == [1, 2, 3, 4]
    assert tree.level[1] == tree.level[3] == 1 and tree.branch_start[1]
    tipless = treeview.layout(_chain(1, 500, None), tip=None)
    items = treeview.window(tipless)
    assert _rows(items) == list(range(1, 201)) and items[-1].count == 300


@pytest.mark.req("CH-7")
def test_ten_thousand_messages_lay_out_without_recursion_and_window_to_a_hundred_rows():
    tree = treeview.layout(_chain(1, 10_000, None), tip=10_000)
    items = treeview.window(tree)
    assert len(items) == 101 and items[0].count == 9_900


# --- the page and its rows endpoint -------------------------------------------------


def _long(owner, count: int) -> Conversation:
    conversation = Conversation.objects.create(owner=owner, title="long")
    ids = _reserve_message_ids(count)
    Message.objects.bulk_create(
        Message(
            pk=message_id,
            conversation=conversation,
            parent_id=ids[n - 1] if n else None,
            role="user" if n % 2 == 0 else "assistant",
            content=[{"type": "text", "text": f"message {n} " + "words " * 30}],
        )
        for n, message_id in enumerate(ids)
    )
    Conversation.objects.filter(pk=conversation.pk).update(tip_id=ids[-1])
    conversation.refresh_from_db()
    return conversation


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
@pytest.mark.req("CH-7")
@pytest.mark.parametrize("count", [1_000, 10_000])
def test_the_tree_page_stays_small_and_draws_the_tip(alice, count):
    conversation = _long(alice, count)
    client = _client(alice)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/conversations/{conversation.pk}/tree/")
    html = response.content.decode()
    assert response.status_code == 200
    assert len(response.content) < 80_000  # was 610 KB at 1,000 messages
    assert len(queries) <= 10
    assert html.count('role="treeitem"') == 101  # 100 messages and one fold
    assert f'id="m-{conversation.tip_id}" role="treeitem" aria-level="1" aria-selected="true"' in html
    first = Message.objects.filter(conversation=conversation).order_by("id").first()
    assert f'data-first="{first.pk}" data-count="{count - 100}" data-keep="end"' in html
    assert f"Show {count - 100} earlier messages" in html
    assert f"{count} in the tree; the path around the tip is drawn, the rest is folded" in html


@pytest.mark.django_db
@pytest.mark.req("CH-7")
def test_the_rows_endpoint_opens_a_fold_for_its_owner_only_and_refuses_bad_input(alice, bob):
    conversation = _long(alice, 1_000)
    first = Message.objects.filter(conversation=conversation).order_by("id").first().pk
    url = f"/conversations/{conversation.pk}/tree/rows/"
    response = _client(alice).get(url, {"first": first, "count": 900, "keep": "end"})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.count('role="treeitem"') == 201  # one fold for the 700 before, 200 rows
    assert f'id="f-{first}"' in html and 'data-count="700"' in html and "Show 700 more messages" in html
    assert f'id="m-{first + 700}"' in html and f'id="m-{first + 899}"' in html and f'id="m-{first + 900}"' not in html

    assert _client(bob).get(url, {"first": first, "count": 900}).status_code == 404
    assert Client().get(url, {"first": first, "count": 900}).status_code == 302  # to the sign-in page
    other = _long(bob, 3)
    for params, message, status in [
        ({"first": "x", "count": 5}, "integers", 400),
        ({"first": first}, "integers", 400),
        ({"first": first, "count": 0}, "count >= 1", 400),
        ({"first": first, "count": 5, "keep": "middle"}, "keep 'start' or 'end'", 400),
        ({"first": other.tip_id, "count": 5}, "is not part of conversation", 404),  # UX-8
    ]:
        refused = _client(alice).get(url, params)
        assert refused.status_code == status and message in refused.content.decode()
