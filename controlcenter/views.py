"""Site-wide error pages: JSON in the error shape under /api/, HTML elsewhere."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found

from controlcenter.api import error_body


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", f"There is no API endpoint at {request.path}."), status=404)
    return page_not_found(request, exception)
