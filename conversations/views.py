from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from agents.models import Run
from agents.services import ACTIVE_STATUSES
from controlcenter.errors import DomainError, NotFound
from conversations import selectors, services
from conversations.models import Conversation
from engine.actions import result_as_text
from toolcatalog.selectors import modes_list

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
            conversation = services.conversation_create(owner=request.user, title=request.POST.get("title", ""))
        except DomainError as exc:
            error = exc.message
        else:
            return redirect("conversation-detail", conversation_id=conversation.pk)
    search = request.GET.get("q", "").strip()
    conversations = selectors.conversations_with_activity(user=request.user, search=search)[:100]
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


def _present(path: list[selectors.PathMessage], run_by_trigger: dict[int, int]) -> list[dict[str, Any]]:
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
        conversation = selectors.conversation_for_user(user=request.user, conversation_id=conversation_id)
    except NotFound:
        raise Http404("No such conversation.") from None
    active_run = Run.objects.filter(conversation=conversation, status__in=ACTIVE_STATUSES).order_by("-id").first()
    return render(
        request,
        "conversations/detail.html",
        {
            "conversation": conversation,
            **_page_messages(request, conversation),
            "active_run": active_run,
            "slash_commands": SLASH_COMMANDS,
            "models": selectors.models_offered(),
            # A model taken off CC_MODELS since it was picked: shown as the selection, not silently
            # replaced by the default (the next message would be refused for it).
            "model_withdrawn": conversation.model not in settings.CC_MODELS if conversation.model else False,
            "modes": modes_list(),
        },
    )


def _page_messages(request: HttpRequest, conversation: Conversation) -> dict[str, Any]:
    runs = Run.objects.filter(conversation=conversation).values_list("trigger_id", "id").order_by("id")
    # Presented whole, then cut, so a call shown on the page always has its result.
    shown = _present(selectors.current_path(conversation), dict(runs))
    earlier = 0 if request.GET.get("all") == "1" else max(0, len(shown) - PAGE_MESSAGES)
    return {"messages": shown[earlier:], "earlier": earlier}


def _owned(request: HttpRequest, conversation_id: int) -> Conversation:
    try:
        return selectors.conversation_for_user(user=request.user, conversation_id=conversation_id)
    except NotFound:
        raise Http404("No such conversation.") from None


@login_required
def conversation_tree(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The tree navigator (CH-7..CH-9): the page reads; its script writes through the REST API."""
    conversation = _owned(request, conversation_id)
    tree = selectors.tree_window(conversation=conversation)
    return render(
        request,
        "conversations/tree.html",
        {
            "conversation": conversation,
            "items": tree["items"],
            "total": tree["total"],
            "checkpoints": selectors.checkpoints_for(conversation=conversation),
            "on_path": tree["on_path"],
            "rewinds": selectors.rewinds_for(conversation=conversation).order_by("-id")[:10],
        },
    )


@login_required
def conversation_tree_rows(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """One fold of the tree navigator opened: its rows as list items for the page to put in its place."""
    conversation = _owned(request, conversation_id)
    try:
        first, count = int(request.GET.get("first", "")), int(request.GET.get("count", ""))
    except ValueError:
        return HttpResponse("first and count must be message counts (integers).", status=400, content_type="text/plain")
    try:
        items = selectors.tree_slice(
            conversation=conversation, first=first, count=count, keep=request.GET.get("keep", "start")
        )
    except DomainError as exc:
        return HttpResponse(exc.message, status=400, content_type="text/plain")
    return render(request, "conversations/_tree_rows.html", {"conversation": conversation, "items": items})


@login_required
def conversation_context(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The Context view (TD-15): the same composition `GET /api/conversations/<id>/context` returns."""
    conversation = _owned(request, conversation_id)
    view = selectors.conversation_context(conversation=conversation)
    window = view["window_tokens"] or 1
    categories = [{**category, "percent": 100 * category["tokens"] / window} for category in view["categories"]]
    compaction = selectors.compactions_for(conversation=conversation).order_by("-id").first()
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
