"""The scratchpad slice viewer: an entry's metadata; its script reads slices through the REST API."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlcenter.api import request_user
from scratchpad import selectors


@login_required
def entry_viewer(request: HttpRequest, entry_id: str) -> HttpResponse:
    entry = selectors.entry_for_user(user=request_user(request), entry_id=entry_id)
    if entry is None:
        raise Http404("No such scratchpad entry.")
    return render(request, "scratchpad/viewer.html", {"entry": entry})
