"""The Content-Security-Policy of every response (SB-6).

Every script, style, image and font comes from the app's own origin (the API docs' Swagger UI
too, through drf-spectacular-sidecar), and nothing inline runs: a message that slipped past the
Markdown sanitizer still could not execute, and a page cannot be framed. The other headers of
SB-6 come from Django's SecurityMiddleware and XFrameOptionsMiddleware (`SECURE_*`,
`X_FRAME_OPTIONS` in the settings).
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


def policy_header(directives: dict[str, str]) -> str:
    return "; ".join(f"{name} {value}".strip() for name, value in directives.items())


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.header = policy_header(settings.CC_CONTENT_SECURITY_POLICY)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", self.header)
        return response
