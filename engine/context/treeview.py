"""The tree navigator's window over a message tree (CH-7): pure, no Django.

The tree is laid out depth-first, as the navigator draws it: a chain of single children stays
at one level, each fork indents its branches. A long conversation is not drawn whole: the
window holds the path around the tip and the small branches beside it; everything else
becomes folds, each a contiguous stretch of the depth-first order (a subtree is always
contiguous in it), so a fold is named by its first message and its length and can be opened
later, a slice at a time, by `expand`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Messages of the path shown up to and including the tip; the earlier part of the path is a fold.
PATH_WINDOW = 100
# A branch beside the shown path (or under the tip) is drawn inline up to this many messages.
INLINE_BRANCH = 20
# Rows one expansion returns; a longer fold leaves a fold for the rest.
EXPAND_ROWS = 200


@dataclass(frozen=True)
class Layout:
    """Every message's place: depth-first order, level, subtree size, and the path to the tip."""

    order: list[int]
    index: dict[int, int]
    parent: dict[int, int | None]
    level: dict[int, int]
    branch_start: dict[int, bool]
    children: dict[int, int]
    size: dict[int, int]
    path: list[int]
    on_path: frozenset[int]
    tip: int | None


@dataclass(frozen=True)
class Row:
    id: int


@dataclass(frozen=True)
class Fold:
    """`count` messages from `first` on, in depth-first order, not drawn yet."""

    first: int
    count: int
    level: int
    kind: Literal["path", "branch", "more"]
    on_path: int
    # Where a branch fold hangs: the message it answers (None for a root).
    parent: int | None
    # Which end an expansion opens first: the end nearest the tip for the earlier path.
    keep: Literal["start", "end"]


def layout(structure: list[tuple[int, int | None]], tip: int | None) -> Layout:
    """Lay out `structure` ((id, parent id) in id order) depth-first, iteratively (deep chains are fine)."""
    kids: dict[int | None, list[int]] = {}
    parent: dict[int, int | None] = {}
    for message_id, parent_id in structure:
        parent[message_id] = parent_id
        kids.setdefault(parent_id, []).append(message_id)
    roots = kids.get(None, [])
    order: list[int] = []
    level: dict[int, int] = {}
    branch_start: dict[int, bool] = {}
    forked = len(roots) > 1
    stack = [(root, 1 if forked else 0, forked) for root in reversed(roots)]
    while stack:
        message_id, depth, starts = stack.pop()
        order.append(message_id)
        level[message_id] = depth
        branch_start[message_id] = starts
        children = kids.get(message_id, [])
        if len(children) == 1:
            stack.append((children[0], depth, False))
        else:
            stack.extend((child, depth + 1, True) for child in reversed(children))
    size = dict.fromkeys(order, 1)
    for message_id in reversed(order):
        above = parent[message_id]
        if above is not None:
            size[above] += size[message_id]
    path: list[int] = []
    current = tip if tip in parent else None
    while current is not None:
        path.append(current)
        current = parent[current]
    path.reverse()
    return Layout(
        order=order,
        index={message_id: position for position, message_id in enumerate(order)},
        parent=parent,
        level=level,
        branch_start=branch_start,
        children={message_id: len(kids.get(message_id, [])) for message_id in order},
        size=size,
        path=path,
        on_path=frozenset(path),
        tip=tip if tip in parent else None,
    )


def window(tree: Layout, *, path_window: int = PATH_WINDOW, inline_branch: int = INLINE_BRANCH) -> list[Row | Fold]:
    """What the page draws: the last `path_window` messages of the path to the tip, every branch
    beside them (and under the tip) of at most `inline_branch` messages, and folds for the rest."""
    shown_path = tree.path[-path_window:] if tree.path else []
    shown: set[int] = set(shown_path)
    anchors: list[int | None] = [*shown_path]
    if len(tree.path) <= path_window:
        anchors.append(None)  # the roots beside the path are beside shown messages too
    kids: dict[int | None, list[int]] = {}
    for message_id in tree.order:
        kids.setdefault(tree.parent[message_id], []).append(message_id)
    for anchor in anchors:
        for child in kids.get(anchor, []):
            if child not in tree.on_path and tree.size[child] <= inline_branch:
                start = tree.index[child]
                shown.update(tree.order[start : start + tree.size[child]])
    if not tree.path:
        # Without a tip nothing anchors the window: draw from the start, one expansion's worth.
        shown.update(tree.order[:EXPAND_ROWS])
    return _fold_hidden(tree, 0, len(tree.order), shown)


def expand(
    tree: Layout, first: int, count: int, keep: Literal["start", "end"], *, limit: int = EXPAND_ROWS
) -> list[Row | Fold]:
    """The rows of a fold (`count` messages from `first`), at most `limit` of them; the rest stays
    a fold before them (`keep="end"`) or after them (`keep="start"`)."""
    start = tree.index[first]
    end = min(len(tree.order), start + count)
    if end - start <= limit:
        return [Row(message_id) for message_id in tree.order[start:end]]
    if keep == "end":
        return [_fold(tree, start, end - limit, "more", "end"), *map(Row, tree.order[end - limit : end])]
    return [*map(Row, tree.order[start : start + limit]), _fold(tree, start + limit, end, "more", "start")]


def _fold_hidden(tree: Layout, start: int, end: int, shown: set[int]) -> list[Row | Fold]:
    items: list[Row | Fold] = []
    position = start
    while position < end:
        message_id = tree.order[position]
        if message_id in shown:
            items.append(Row(message_id))
            position += 1
        elif message_id not in tree.on_path:
            # A hidden branch: its whole subtree is the next stretch of the order.
            stop = min(end, position + tree.size[message_id])
            items.append(_fold(tree, position, stop, "branch", "start"))
            position = stop
        else:
            # The earlier path, with the branches beside it, up to the first shown message.
            stop = position
            while stop < end and tree.order[stop] not in shown:
                stop += 1
            items.append(_fold(tree, position, stop, "path", "end"))
            position = stop
    return items


def _fold(
    tree: Layout, start: int, stop: int, kind: Literal["path", "branch", "more"], keep: Literal["start", "end"]
) -> Fold:
    first = tree.order[start]
    return Fold(
        first=first,
        count=stop - start,
        level=tree.level[first],
        kind=kind,
        on_path=sum(1 for message_id in tree.order[start:stop] if message_id in tree.on_path),
        parent=tree.parent[first],
        keep=keep,
    )
