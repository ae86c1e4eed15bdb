"""Pages for runs and the observability dashboard (reads only; owner-scoped)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from agents import selectors
from agents.dashboard import dashboard_snapshot
from controlcenter.errors import NotFound


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
    prompt = totals["uncached"] + totals["cache_write"] + totals["cache_read"]
    totals["cache_ratio"] = totals["cache_read"] / prompt if prompt else None
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
