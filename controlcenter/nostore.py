"""No HTML page of the app is kept in the browser's cache.

Every page draws live data (a conversation, runs, figures) for one signed-in person. Without
`Cache-Control`, a browser's Back took the page from its HTTP cache and showed a transcript
from before the person left (messages sent meanwhile missing); `no-store` makes Back ask the
server again, and keeps a person's pages out of the cache after they sign out. Static files
and API answers are left alone.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers


class NoStoreHtmlMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html") and "Cache-Control" not in response:
            add_never_cache_headers(response)
        return response
