"""`bench pages`: server time to render the conversation page, the run page and the dashboard
for a conversation of 1,000 messages (target: under 300 ms each).

python manage.py bench pages --json [--messages 1000] [--repeat 20]

The conversation is a realistic mix: user prompts, assistant text with tool calls, tool
results, one run per prompt with two recorded model requests and its event log. Pages are
fetched through Django's test client (middleware, view, queries, template) in this process,
so the figure is server time without network. The data is deleted afterwards.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client

from agents.models import ModelRequest, Run, RunEvent
from bench._options import positive
from conversations.models import Conversation, Message

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True


def add_arguments(parser: Any) -> None:
    parser.add_argument("--messages", type=positive, default=1000, help="messages on the conversation's path")
    parser.add_argument("--repeat", type=positive, default=20, help="requests per page")
    parser.add_argument("--events", type=positive, default=400, help="events in the measured run's log")


@transaction.atomic
def _build(user: Any, messages: int, events: int) -> tuple[Conversation, Run]:
    conversation = Conversation.objects.create(owner=user, title="bench pages")
    parent = None
    runs = []
    observation = json.dumps({"ok": True, "entries": [{"name": f"file{n}.py", "size": n * 100} for n in range(20)]})
    index = 0
    while index < messages:
        turn = index // 4
        shapes = [
            ("user", [{"type": "text", "text": f"Step {turn}: please look at the files and summarise them. " * 3}]),
            (
                "assistant",
                [
                    {"type": "text", "text": f"Looking at the workspace for step {turn}."},
                    {"type": "tool_use", "id": f"tu{turn}", "name": "list_dir", "input": {"path": f"src/{turn}"}},
                ],
            ),
            ("user", [{"type": "tool_result", "tool_use_id": f"tu{turn}", "content": observation}]),
            ("assistant", [{"type": "text", "text": "Twenty files; the largest is file19.py. " * 5}]),
        ]
        for role, content in shapes[: messages - index]:
            parent = Message.objects.create(conversation=conversation, parent=parent, role=role, content=content)
            if index % 4 == 0:
                runs.append(Run(conversation=conversation, trigger=parent, provider="offline", model="offline-1"))
            index += 1
    conversation.tip = parent
    conversation.save(update_fields=["tip"])
    for run in runs:
        run.status = Run.Status.SUCCEEDED
    Run.objects.bulk_create(runs)
    runs = list(Run.objects.filter(conversation=conversation).order_by("id"))
    ModelRequest.objects.bulk_create(
        ModelRequest(
            run=run,
            owner_id=conversation.owner_id,
            step=step,
            model="offline-1",
            input_tokens=200 + step,
            cache_creation_input_tokens=1000 if step == 1 else 0,
            cache_read_input_tokens=5000 * step,
            output_tokens=80,
            breakpoints=["tools", "system", "previous_turn", "current_turn"],
            duration_ms=150,
        )
        for run in runs
        for step in (1, 2)
    )
    measured = runs[-1]
    kinds = ["text_delta"] * 6 + ["tool_call", "tool_result", "usage"]
    RunEvent.objects.bulk_create(
        RunEvent(
            run=measured,
            seq=seq,
            type=kinds[seq % len(kinds)],
            payload={"step": seq // len(kinds) + 1, "text": "word ", "name": "list_dir", "input": {}, "output": {}},
        )
        for seq in range(1, events + 1)
    )
    return conversation, measured


def _measure(client: Client, url: str, repeat: int) -> dict[str, Any]:
    response = client.get(url)  # warm: template loading, first queries
    assert response.status_code == 200, (url, response.status_code)
    queries: list[str] = []

    def count(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        queries.append(sql)
        return execute(sql, params, many, context)

    # A query wrapper, not CaptureQueriesContext: each request resets Django's query log.
    with connection.execute_wrapper(count):
        client.get(url)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 1),
        "p90_ms": round(samples[int(0.9 * (len(samples) - 1))], 1),
        "max_ms": round(samples[-1], 1),
        "queries": len(queries),
        "bytes": len(response.content),
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    user = get_user_model().objects.create_user(username=f"bench-pages-{uuid.uuid4().hex[:6]}")
    try:
        started = time.perf_counter()
        conversation, measured = _build(user, options["messages"], options["events"])
        build_s = time.perf_counter() - started
        client = Client(HTTP_HOST="localhost")
        client.force_login(user)
        repeat = options["repeat"]
        return {
            "database": connection.vendor,
            "messages": options["messages"],
            "runs": Run.objects.filter(conversation=conversation).count(),
            "run_events": options["events"],
            "build_seconds": round(build_s, 1),
            "conversation_page": _measure(client, f"/conversations/{conversation.pk}/", repeat),
            "conversation_page_all_messages": _measure(client, f"/conversations/{conversation.pk}/?all=1", repeat),
            "run_page": _measure(client, f"/runs/{measured.pk}/", repeat),
            "dashboard": _measure(client, "/dashboard/", repeat),
            "dashboard_data": _measure(client, "/dashboard/data/", repeat),
            "conversation_list": _measure(client, "/", repeat),
            "tree_page": _measure(client, f"/conversations/{conversation.pk}/tree/", repeat),
            "context_page": _measure(client, f"/conversations/{conversation.pk}/context/", repeat),
        }
    finally:
        Conversation.objects.filter(owner=user).delete()
        user.delete()
