"""Tree benchmark: load a deep path, branch, fork (CH-7, CH-8).

    python manage.py bench tree --json [--messages 100000 --depth 10000 --fork-depth 1000]

Builds one conversation of `--messages` messages whose tip sits at `--depth`, times
`history_view` for the tip (what a turn loads: `conversations.turns.turn_context`
calls it; the path plus the compaction lookup, decoded to the messages a request sends),
`conversation_branch` and `conversation_fork` of a `--fork-depth` path, then deletes
everything it made. `path_load_ms` is the median of `--repeat` loads, with every sample
in `path_load_samples_ms`.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.color import no_style
from django.db import connection, transaction
from django.db.models import Max

from bench._options import positive
from conversations import selectors, services
from conversations.models import Conversation, Message

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=positive, default=100_000)
    parser.add_argument("--depth", type=positive, default=10_000)
    parser.add_argument("--fork-depth", type=positive, default=1_000)
    parser.add_argument("--repeat", type=positive, default=9)


def check(options: dict[str, Any]) -> str | None:
    if options["depth"] > options["messages"]:
        return f"argument --depth: must be at most --messages ({options['messages']}), not {options['depth']}"
    return None


def _chains(conversation: Conversation, total: int, depth: int) -> list[int]:
    """`total` messages as chains of `depth` (side branches hang off the main chain's root); their ids."""
    base = (Message.objects.aggregate(top=Max("id"))["top"] or 0) + 1
    rows = []
    for index in range(total):
        chain, position = divmod(index, depth)
        parent = None if index == 0 else (base if position == 0 else base + index - 1)
        role = "user" if position % 2 == 0 else "assistant"
        text = f"chain {chain} message {position}: " + "lorem ipsum dolor sit amet " * 4
        rows.append(
            Message(
                pk=base + index,
                conversation=conversation,
                parent_id=parent,
                role=role,
                content=[{"type": "text", "text": text}],
            )
        )
    for start in range(0, len(rows), 5_000):
        Message.objects.bulk_create(rows[start : start + 5_000])
    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(no_style(), [Message]):
            cursor.execute(sql)
    # Ids only: 100,000 model instances kept alive would make every garbage collection
    # during the timings scan them, which a worker never carries.
    return [row.pk for row in rows]


def _times_ms(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(round((time.perf_counter() - started) * 1000, 2))
    return times


def _median_ms(fn, repeat: int) -> float:
    return round(statistics.median(_times_ms(fn, repeat)), 2)


def run(options: dict[str, Any]) -> dict[str, Any]:
    user, _ = get_user_model().objects.get_or_create(username="bench-tree")
    Conversation.objects.filter(owner=user).delete()
    try:
        with transaction.atomic():
            big = Conversation.objects.create(owner=user, title="bench tree")
            ids = _chains(big, options["messages"], options["depth"])
            tip_id = ids[options["depth"] - 1]
            Conversation.objects.filter(pk=big.pk).update(tip_id=tip_id)
            small = Conversation.objects.create(owner=user, title="bench fork")
            chain = _chains(small, options["fork_depth"], options["fork_depth"])
            Conversation.objects.filter(pk=small.pk).update(tip_id=chain[-1])
        big.refresh_from_db()
        small.refresh_from_db()

        def load() -> list[dict[str, Any]]:
            return selectors.history_view(conversation_id=big.pk, tip_id=big.tip_id)

        loaded = load()
        tip_content = Message.objects.get(pk=tip_id).content
        assert len(loaded) == options["depth"] and loaded[-1]["content"] == tip_content, len(loaded)
        del loaded
        gc.collect()  # start from a clean heap, not the setup's garbage
        path_samples = _times_ms(load, options["repeat"])
        targets = [ids[options["depth"] // 2], tip_id]
        flip = iter(targets * 100)
        branch_ms = _median_ms(
            lambda: services.conversation_branch(conversation=big, message_id=next(flip)), options["repeat"] * 4
        )
        fork_ms = _median_ms(lambda: services.conversation_fork(conversation=small), max(3, options["repeat"] // 2))
        return {
            "database": connection.vendor,
            "messages": options["messages"],
            "depth": options["depth"],
            "path_load_ms": round(statistics.median(path_samples), 2),
            "path_load_samples_ms": path_samples,
            "branch_ms": branch_ms,
            f"fork_ms_{options['fork_depth']}": fork_ms,
            "targets_ms": {"path_load_ms": 100, "branch_ms": 5, "fork_ms_1000": 1000},
        }
    finally:
        Conversation.objects.filter(owner=user).delete()
        user.delete()
