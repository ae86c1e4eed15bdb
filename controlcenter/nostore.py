"""No answer of the app is kept in the browser's cache: pages, fragments and API answers alike.

Every answer carries live data (a conversation, a run's event log, figures) for one signed-in
person. Without `Cache-Control`, a browser's Back took a page from its HTTP cache and showed a
transcript from before the person left; and the page's own `fetch` of a run's log was answered
from the disk cache after Back, with the events of the first read only: a live reply missing its
start, an approval missing for good. `no-store` makes every read ask the server again, and keeps
a person's data out of the cache after they sign out. Static files never reach this middleware
(WhiteNoise answers them first, with their own long cache headers); an answer that set its own
`Cache-Control` keeps it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers


class NoStoreMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "Cache-Control" not in response:
            add_never_cache_headers(response)
        return response
