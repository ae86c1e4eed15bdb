"""Site-wide pages: the error pages (JSON in the error shape under /api/, HTML elsewhere) and the icon."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.views.defaults import page_not_found
from django.views.defaults import server_error as html_server_error

from controlcenter.api import SERVER_ERROR_MESSAGE, error_body


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", f"There is no API endpoint at {request.path}."), status=404)
    return page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    # Errors DRF's handler never sees (a middleware, a non-DRF view) are JSON under /api/ too (SB-5).
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("server_error", SERVER_ERROR_MESSAGE), status=500)
    return html_server_error(request)


def favicon(request: HttpRequest) -> HttpResponse:
    # Pages without our <link rel="icon"> (the admin's, the API's JSON) make browsers ask for
    # /favicon.ico; the answer is the app's icon, not a 404 in every log.
    return HttpResponsePermanentRedirect(static("cc/favicon.svg"))
