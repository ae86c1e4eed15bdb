from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlcenter.api import request_user
from controlcenter.errors import DomainError, NotFound
from conversations import selectors
from conversations.models import Conversation


def owned_conversation(request: HttpRequest, conversation_id: int) -> Conversation:
    try:
        return selectors.conversation_for_user(user=request_user(request), conversation_id=conversation_id)
    except NotFound:
        raise Http404("No such conversation.") from None


@login_required
def conversation_tree(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """The tree navigator (CH-7..CH-9): the page reads; its script writes through the REST API."""
    conversation = owned_conversation(request, conversation_id)
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
            # Through the reverse relation: runs are a layer above this app, which never imports them.
            "running": conversation.runs.active().values_list("pk", flat=True).first(),
        },
    )


@login_required
def conversation_tree_rows(request: HttpRequest, conversation_id: int) -> HttpResponse:
    """One fold of the tree navigator opened: its rows as list items for the page to put in its place."""
    conversation = owned_conversation(request, conversation_id)
    try:
        first, count = int(request.GET.get("first", "")), int(request.GET.get("count", ""))
    except ValueError:
        return HttpResponse("first and count must be message counts (integers).", status=400, content_type="text/plain")
    try:
        items = selectors.tree_slice(
            conversation=conversation, first=first, count=count, keep=request.GET.get("keep", "start")
        )
    except DomainError as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    return render(request, "conversations/_tree_rows.html", {"conversation": conversation, "items": items})
