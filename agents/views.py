"""Pages: a conversation with its runs (list, conversation, Context view), a run, the dashboard (owner-scoped)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Max, Sum
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotModified, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_http_methods

from agents import chat, costs, selectors, turns
from agents.dashboard import dashboard_snapshot
from agents.models import ModelRequest, Run
from agents.rendering import markdown_html, messages_html
from agents.usage import ratio_sums, requests_ratio
from controlcenter.api import request_user
from controlcenter.errors import DomainError, NotFound
from conversations import selectors as conversation_selectors
from conversations import services as conversation_services
from conversations.models import Conversation, Message
from conversations.views import owned_conversation
from engine.actions import result_as_text
from toolcatalog.selectors import modes_list


@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        run = selectors.run_for_user(user=request_user(request), run_id=run_id)
    except NotFound:
        raise Http404("No such run.") from None
    requests = selectors.run_model_requests(run=run)
    totals = {
        key: sum(getattr(row["request"], field) for row in requests)
        for key, field in (
            ("uncached", "input_tokens"),
            ("cache_write", "cache_creation_input_tokens"),
            ("cache_read", "cache_read_input_tokens"),
            ("output", "output_tokens"),
            ("duration_ms", "duration_ms"),
        )
    }
    totals["cache_ratio"] = requests_ratio(row["request"] for row in requests)
    return render(
        request,
        "agents/run_detail.html",
        {
            "run": run,
            "requests": requests,
            "totals": totals,
            "timeline": selectors.run_timeline(run=run),
            **selectors.run_context_activity(run=run),
        },
    )


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(request, "agents/dashboard.html", {"snapshot": dashboard_snapshot(user=request_user(request))})


@login_required
def dashboard_data(request: HttpRequest) -> JsonResponse:
    """The same figures as JSON: the page refetches them after a websocket reconnect."""
    return JsonResponse(dashboard_snapshot(user=request_user(request)))


# The composer's slash menu (CH-10); the commands are dispatched server-side when sent.
SLASH_COMMANDS = [
    ("/compact", "[summary]", "Run the context recovery ladder now"),
    ("/shake", "", "Free rungs only: elide old tool output, drop old images"),
    ("/context", "", "What fills the context window, by category"),
    ("/tree", "", "Open the tree navigator"),
    ("/branch", "<message id>", "Move the branch tip to another message (or a message's Branch here)"),
    ("/fork", "", "Copy this path into a new conversation"),
    ("/checkpoint", "<label>", "Mark this turn boundary with a label"),
    ("/rewind", "[label]", "Return to a checkpoint (the latest without a label), keeping a digest"),
]
# The page renders the latest messages of a long path; "show all" renders every one. The
# template is most of a page's server time (a 1,000-message path costs ~130 ms and 600 KB
# of HTML rendered whole, see bench/pages.py), and the latest turns are what a person reads.
PAGE_MESSAGES = 200


@login_required
@require_http_methods(["GET", "POST"])
def conversation_list(request: HttpRequest) -> HttpResponse:
    error = ""
    if request.method == "POST":
        try:
            conversation = conversation_services.conversation_create(
                owner=request_user(request), title=request.POST.get("title", "")
            )
        except DomainError as exc:
            error = exc.message
        else:
            return redirect("conversation-detail", conversation_id=conversation.pk)
    search = request.GET.get("q", "").replace("\x00", "").strip()  # PostgreSQL refuses a NUL in a query
    conversations = chat.conversations_with_activity(user=request_user(request), search=search)[:100]
    return render(
        request,
        "conversations/list.html",
        {"conversations": conversations, "search": search, "error": error},
        status=400 if error else 200,
    )


def _compact(raw: Any) -> str:
    """Tool input and output as compact JSON; the page indents it when a call is opened.

    Indenting here would use the pure-Python JSON encoder on every result of the path
    (a third of the render time of a 1,000-message page); results are stored as JSON text
    already, so they pass through untouched.
    """
    if isinstance(raw, str):
        return raw
    return json.dumps(raw, ensure_ascii=False, sort_keys=True)


# The blocks that draw something; a message of only tool results draws nothing of its own.
_DRAWN = frozenset({"text", "tool_use", "image"})


def _present(
    path: list[conversation_selectors.PathMessage], run_by_trigger: dict[int, int], *, first: int = 0
) -> list[dict[str, Any]]:
    """The path from `first` on as the page shows it: each tool call carries its result, so a
    message holding only tool results is folded into the call that asked for them; text is
    rendered Markdown (UX-1)."""
    results: dict[str, dict[str, Any]] = {}
    for message in path:
        for block in message.content:
            if block.get("type") == "tool_result":
                results[block.get("tool_use_id", "")] = block
    shown = []
    for message in path[first:]:
        blocks = []
        for block in message.content:
            kind = block.get("type")
            if kind == "text":
                text = block.get("text", "")
                blocks.append({"type": "text", "html": markdown_html(text), "raw": text})
            elif kind == "tool_use":
                result = results.get(block.get("id", ""))
                blocks.append(
                    {
                        "type": "tool",
                        "name": block.get("name", ""),
                        "input": _compact(block.get("input")),
                        "result": result_as_text(result) if result else None,
                        "is_error": bool(result and result.get("is_error")),
                    }
                )
            elif kind == "image":
                blocks.append({"type": "image"})
        if blocks:
            # A reply stopping on a tool call is mid-turn: no branching to it, no regenerating from it.
            mid_turn = any(block["type"] == "tool" for block in blocks) and message.role == Message.Role.ASSISTANT
            shown.append(
                {"message": message, "blocks": blocks, "run_id": run_by_trigger.get(message.pk), "mid_turn": mid_turn}
            )
    return shown


def _page_messages(request: HttpRequest, conversation: Conversation) -> dict[str, Any]:
    """Everything the messages fragment draws: the same on the first load and on every refresh."""
    # What the cards draw: not the paused turns (`pending_turn`) of 250 runs, and only the turns
    # that answer prompts (a compaction run, CH-14, answers none).
    rows = (
        Run.objects.filter(conversation=conversation, compact_rungs__isnull=True)
        .only("id", "trigger_id", "status", "error")
        .order_by("id")
    )
    runs = {run.trigger_id: run for run in rows}
    path = conversation_selectors.current_path(conversation)
    # Only the messages that draw an article count (a message of tool results folds into its
    # call); only the latest of them are presented, with every result of the path at hand.
    drawn = [
        index for index, message in enumerate(path) if any(_DRAWN.intersection(b.get("type") for b in message.content))
    ]
    earlier = 0 if request.GET.get("all") == "1" else max(0, len(drawn) - PAGE_MESSAGES)
    first = drawn[earlier] if earlier < len(drawn) else len(path)
    shown = _present(path, {trigger: run.pk for trigger, run in runs.items()}, first=first)
    # A prompt's turn runs up to the next prompt. Its latest run (started by the prompt, or by a
    # retry going on from where a cancelled run stopped, OP-3) gets a card after the turn's last
    # drawn message unless the turn ends in a reply: in flight (the page replays its event log
    # into it) or ended without one (failed, or cancelled with at most a tool call kept: its card
    # and Retry). A cancelled run's kept tool call is part of the turn, not its answer.
    by_id = {item["message"].pk: item for item in shown}
    turns: list[dict[str, Any]] = []
    for message in path[first:]:
        item = by_id.get(message.pk)
        if item is not None and message.role == Message.Role.USER:
            turns.append({"last": item, "run": None})
        if not turns:
            continue
        turn = turns[-1]
        if item is not None:
            turn["last"] = item
        run = runs.get(message.pk)
        if run is not None and (turn["run"] is None or run.pk > turn["run"].pk):
            turn["run"] = run
    active_run = None
    for number, turn in enumerate(turns):
        last, run = turn["last"], turn["run"]
        answered = last["message"].role == Message.Role.ASSISTANT and not last["mid_turn"]
        if run is None or answered:
            continue
        if not run.is_finished:
            last["live_run"] = run
            active_run = run
        elif run.retryable:
            last["ended_run"] = run
            # Only the path's last turn: a retry answers at the tip.
            last["retry"] = number == len(turns) - 1
    if active_run is None:
        # A run whose prompt is off the current path (someone branched away) can still be cancelled.
        active_run = Run.objects.filter(conversation=conversation).active().order_by("-id").first()
    if turns and active_run is None:
        _unanswered_tip(conversation, turns[-1]["last"])
    _siblings(conversation, shown)
    usage = _usage(conversation, shown)
    return {
        "messages_html": messages_html(shown),
        "earlier": earlier,
        "active_run": active_run,
        "tip": conversation.tip_id,
        **usage,
    }


def _usage(conversation: Conversation, shown: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens, cache ratio and money per run (on its prompt's card) and for the whole
    conversation, and how full the window was at the latest request (UX-6). One query."""
    rows = list(
        ModelRequest.objects.filter(run__conversation=conversation)
        .values("run_id", "model")
        # The ratio's sums first: the others take their fields' names.
        .annotate(**ratio_sums(), **{field: Sum(field) for field in costs.COST_FIELDS}, last=Max("id"))
        .order_by()
    )
    by_run: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        # The stubs type the row without the `**` sums annotated above.
        by_run.setdefault(row["run_id"], []).append(row)  # type: ignore[arg-type]
    for item in shown:
        if item["run_id"] in by_run:
            item["usage"] = costs.usage_summary(by_run[item["run_id"]])
    # The conversation's own turns: not a child's context (`<fan-out>/<i>`) nor a summary call's prompt.
    latest = ModelRequest.objects.filter(run__conversation=conversation, subagent="").order_by("-id").first()
    window = settings.CC_CONTEXT_WINDOW_TOKENS
    used = (
        latest.input_tokens + latest.cache_creation_input_tokens + latest.cache_read_input_tokens + latest.output_tokens
        if latest
        else None
    )
    return {
        "conversation_usage": costs.usage_summary(rows) if rows else None,
        "context_meter": {"used": used, "window": window, "percent": min(100, 100 * used / window)} if used else None,
        "conversation_id": conversation.pk,
    }


def _unanswered_tip(conversation: Conversation, last: dict[str, Any]) -> None:
    """The tip is a prompt with no answer on this path and no run to show (moved there by Branch
    here, or its run's card already says how it ended): say where its answers are, if any, and
    offer to answer it, instead of a silent dead end."""
    message = last["message"]
    if message.role != Message.Role.USER or message.pk != conversation.tip_id or last.get("ended_run"):
        return
    end = _newest_end(conversation)(message.pk)
    last["unanswered"] = {"answered_at": end if end != message.pk else None}


def _newest_end(conversation: Conversation) -> Callable[[int], int]:
    """`newest_end(pk)`: the message a branch from `pk` ends in, following each newest child. One query."""
    newest_child: dict[int, int] = {}
    for pk, parent_id in (
        Message.objects.filter(conversation=conversation).order_by("id").values_list("id", "parent_id")
    ):
        if parent_id is not None:
            newest_child[parent_id] = pk

    def newest_end(pk: int) -> int:
        while pk in newest_child:
            pk = newest_child[pk]
        return pk

    return newest_end


def _siblings(conversation: Conversation, shown: list[dict[str, Any]]) -> None:
    """‹ i/n › on a message with siblings of its role (regenerated answers, edited prompts, UX-2).

    Each arrow moves the tip to the newest end of that sibling's branch, so switching shows the
    whole conversation that continued from it. Two queries, the second only when a message has
    siblings at all.
    """
    parents = {item["message"].parent_id for item in shown}
    rows = Message.objects.filter(conversation=conversation)
    groups: dict[tuple[int | None, str], list[int]] = {}
    query = rows.filter(parent_id__in=[p for p in parents if p is not None])
    if None in parents:
        query = query | rows.filter(parent_id__isnull=True)
    for pk, parent_id, role in query.order_by("id").values_list("id", "parent_id", "role"):
        groups.setdefault((parent_id, role), []).append(pk)
    if not any(len(group) > 1 for group in groups.values()):
        return
    newest_end = _newest_end(conversation)
    for item in shown:
        message = item["message"]
        group = groups.get((message.parent_id, message.role), [])
        if len(group) > 1 and message.pk in group:
            index = group.index(message.pk)
            item["siblings"] = {
                "index": index + 1,
                "count": len(group),
                "previous": newest_end(group[index - 1]) if index > 0 else None,
                "next": newest_end(group[index + 1]) if index + 1 < len(group) else None,
            }


def _fragment(request: HttpRequest, conversation: Conversation) -> tuple[dict[str, Any], str, str]:
    """The messages fragment's context, HTML and ETag: the page carries the tag of the drawing it
    shows, so its first refetch is answered 304 when nothing changed meanwhile."""
    page = _page_messages(request, conversation)
    html = render_to_string("conversations/_messages.html", page, request)
    return page, html, f'"{hashlib.blake2b(html.encode(), digest_size=16).hexdigest()}"'


@login_required
def conversation_detail(request: HttpRequest, conversation_id: int) -> HttpResponse:
    try:
        conversation = conversation_selectors.conversation_for_user(
            user=request_user(request), conversation_id=conversation_id
        )
    except NotFound:
        raise Http404("No such conversation.") from None
    page, fragment, tag = _fragment(request, conversation)
    return render(
        request,
        "conversations/detail.html",
        {
            "conversation": conversation,
            **page,
            "fragment": fragment,
            "fragment_tag": tag,
            "slash_commands": SLASH_COMMANDS,
            "models": conversation_selectors.models_offered(),
            # A model taken off CC_MODELS since it was picked: shown as the selection, not silently
            # replaced by the default (the next message would be refused for it).
            "model_withdrawn": conversation.model not in settings.CC_MODELS if conversation.model else False,
            "modes": modes_list(),
        },
    )


@login_required
def conversation_messages(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The messages fragment the conversation page swaps in after every change it hears of:
    one template for the first load and for live updates, so the two never differ (UX-1)."""
    try:
        conversation = conversation_selectors.conversation_for_user(
            user=request_user(request), conversation_id=conversation_id
        )
    except NotFound:
        raise Http404("No such conversation.") from None
    _, fragment, tag = _fragment(request, conversation)
    if request.headers.get("If-None-Match") == tag:
        return HttpResponseNotModified(headers={"ETag": tag})
    return HttpResponse(fragment, headers={"ETag": tag})


@login_required
def conversation_usage(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The usage bar and context meter alone: the page swaps them in after each model request of a
    run in flight (each is stored as its reply comes in), without redrawing the live messages."""
    return render(request, "conversations/_usage.html", _usage(owned_conversation(request, conversation_id), []))


@login_required
def conversation_context(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The Context view (TD-15): the same composition `GET /api/conversations/<id>/context` returns."""
    conversation = owned_conversation(request, conversation_id)
    view = turns.context_view(conversation=conversation)
    window = view["window_tokens"] or 1
    categories = [{**category, "percent": 100 * category["tokens"] / window} for category in view["categories"]]
    compaction = conversation_selectors.compactions_for(conversation=conversation).order_by("-id").first()
    return render(
        request,
        "conversations/context.html",
        {
            "conversation": conversation,
            "view": view,
            "categories": categories,
            "segments": [category for category in categories if category["tokens"] > 0],
            "last_compaction": compaction,
        },
    )
