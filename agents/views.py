"""Pages: a conversation with its runs (list, conversation, Context view), a run, the dashboard (owner-scoped)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from agents import chat, selectors, turns
from agents.dashboard import dashboard_snapshot
from agents.models import Run
from controlcenter.errors import DomainError, NotFound
from conversations import selectors as conversation_selectors
from conversations import services as conversation_services
from conversations.models import Conversation
from conversations.views import owned_conversation
from engine.actions import result_as_text
from engine.tokens import cache_ratio
from toolcatalog.selectors import modes_list


@login_required
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        run = selectors.run_for_user(user=request.user, run_id=run_id)
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
    totals["cache_ratio"] = cache_ratio(
        uncached=totals["uncached"], cache_write=totals["cache_write"], cache_read=totals["cache_read"]
    )
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
    return render(request, "agents/dashboard.html", {"snapshot": dashboard_snapshot(user=request.user)})


@login_required
def dashboard_data(request: HttpRequest) -> JsonResponse:
    """The same figures as JSON: the page refetches them after a websocket reconnect."""
    return JsonResponse(dashboard_snapshot(user=request.user))


# The composer's slash menu (CH-10); the commands are dispatched server-side when sent.
SLASH_COMMANDS = [
    ("/compact", "Run the context recovery ladder now"),
    ("/shake", "Free rungs only: elide old tool output, drop old images"),
    ("/context", "What fills the context window, by category"),
    ("/tree", "Open the tree navigator"),
    ("/branch", "Move the branch tip to another message"),
    ("/fork", "Copy this path into a new conversation"),
    ("/checkpoint", "Mark this turn boundary with a label"),
    ("/rewind", "Return to a checkpoint, keeping a digest"),
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
                owner=request.user, title=request.POST.get("title", "")
            )
        except DomainError as exc:
            error = exc.message
        else:
            return redirect("conversation-detail", conversation_id=conversation.pk)
    search = request.GET.get("q", "").strip()
    conversations = chat.conversations_with_activity(user=request.user, search=search)[:100]
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


def _present(path: list[conversation_selectors.PathMessage], run_by_trigger: dict[int, int]) -> list[dict[str, Any]]:
    """The path as the page shows it: each tool call carries its result, so a message
    holding only tool results is folded into the call that asked for them."""
    results: dict[str, dict[str, Any]] = {}
    for message in path:
        for block in message.content:
            if block.get("type") == "tool_result":
                results[block.get("tool_use_id", "")] = block
    shown = []
    for message in path:
        blocks = []
        for block in message.content:
            kind = block.get("type")
            if kind == "text":
                blocks.append({"type": "text", "text": block.get("text", "")})
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
            shown.append({"message": message, "blocks": blocks, "run_id": run_by_trigger.get(message.pk)})
    return shown


@login_required
def conversation_detail(request: HttpRequest, conversation_id: int) -> HttpResponse:
    try:
        conversation = conversation_selectors.conversation_for_user(user=request.user, conversation_id=conversation_id)
    except NotFound:
        raise Http404("No such conversation.") from None
    active_run = Run.objects.filter(conversation=conversation).active().order_by("-id").first()
    return render(
        request,
        "conversations/detail.html",
        {
            "conversation": conversation,
            **_page_messages(request, conversation),
            "active_run": active_run,
            "slash_commands": SLASH_COMMANDS,
            "models": conversation_selectors.models_offered(),
            # A model taken off CC_MODELS since it was picked: shown as the selection, not silently
            # replaced by the default (the next message would be refused for it).
            "model_withdrawn": conversation.model not in settings.CC_MODELS if conversation.model else False,
            "modes": modes_list(),
        },
    )


def _page_messages(request: HttpRequest, conversation: Conversation) -> dict[str, Any]:
    runs = Run.objects.filter(conversation=conversation).values_list("trigger_id", "id").order_by("id")
    # Presented whole, then cut, so a call shown on the page always has its result.
    shown = _present(conversation_selectors.current_path(conversation), dict(runs))
    earlier = 0 if request.GET.get("all") == "1" else max(0, len(shown) - PAGE_MESSAGES)
    return {"messages": shown[earlier:], "earlier": earlier}


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
