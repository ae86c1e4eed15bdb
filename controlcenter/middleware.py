"""Refuse oversized request bodies with 413 before anything reads them."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from controlcenter.api import error_body


class RequestSizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse(error_body("invalid", "Content-Length is not a number."), status=400)
        if length > limit:
            message = f"The request body has {length} bytes; the limit is {limit} bytes (CC_MAX_REQUEST_BYTES)."
            return JsonResponse(error_body("request_too_large", message), status=413)
        return self.get_response(request)
