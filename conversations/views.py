from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from agents.models import Run
from controlcenter.errors import DomainError, NotFound
from conversations import selectors, services


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
    conversations = selectors.conversations_for_user(user=request.user, search=search)[:100]
    return render(
        request,
        "conversations/list.html",
        {"conversations": conversations, "search": search, "error": error},
        status=400 if error else 200,
    )


@login_required
def conversation_detail(request: HttpRequest, conversation_id: int) -> HttpResponse:
    try:
        conversation = selectors.conversation_for_user(user=request.user, conversation_id=conversation_id)
    except NotFound:
        raise Http404("No such conversation.") from None
    active_run = (
        Run.objects.filter(
            conversation=conversation, status__in=[Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING]
        )
        .order_by("-id")
        .first()
    )
    return render(
        request,
        "conversations/detail.html",
        {
            "conversation": conversation,
            "path": selectors.current_path(conversation),
            "active_run": active_run,
        },
    )
