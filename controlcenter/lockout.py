"""Lockout after repeated failed sign-ins (SB-5), on top of django-axes.

Passwords (the login form, the admin login) go through Django's `authenticate`, which axes
watches by itself. API tokens do not: `record_token_failure` and `token_locked_out` count a
wrong token against the pair (TOKEN_USERNAME, client IP), so one address cannot guess tokens
without bound, for REST (`ThrottledTokenAuthentication`) and `/mcp` alike. The lock refuses
guesses, never a valid token: the pair is shared by every token user behind the address (a
proxy, a NAT), and a token names its user and cannot be guessed.
"""

from __future__ import annotations

from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled

# Token attempts carry no username; they share one pseudo-user per client address.
# Too Many Requests: the attempt is refused for a while, whatever the credentials.
LOCKED_OUT_STATUS = 429
TOKEN_USERNAME = "(api token)"
_TOKEN_CREDENTIALS = {"username": TOKEN_USERNAME}


def lockout_message() -> str:
    minutes = int(settings.AXES_COOLOFF_TIME.total_seconds() // 60)
    return (
        f"Too many failed sign-in attempts from this address: locked out for {minutes} minutes "
        f"(after {settings.AXES_FAILURE_LIMIT} failures). Wait, or ask an administrator to run "
        "`manage.py axes_reset`."
    )


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """The answer to a locked-out attempt: the API's JSON error shape, or the login page."""
    # Imported here: DRF loads this module while rest_framework.views (which api needs) is loading.
    from controlcenter.api import error_body

    status = LOCKED_OUT_STATUS
    if request.path.startswith(("/api/", "/mcp")):
        return JsonResponse(error_body("locked_out", lockout_message()), status=status)
    return render(request, "registration/login.html", {"locked_out": lockout_message()}, status=status)


def token_locked_out(request: HttpRequest) -> bool:
    AxesProxyHandler.update_request(request)
    return AxesProxyHandler.is_locked(request, _TOKEN_CREDENTIALS)


def record_token_failure(request: HttpRequest) -> None:
    AxesProxyHandler.update_request(request)
    user_login_failed.send(sender=__name__, credentials=_TOKEN_CREDENTIALS, request=request)


def request_for_scope(scope: dict) -> HttpRequest:
    """A bare HttpRequest carrying an ASGI scope's client address, for axes' bookkeeping."""
    request = HttpRequest()
    client = scope.get("client") or ("", 0)
    request.META["REMOTE_ADDR"] = client[0]
    for name, value in scope.get("headers", []):
        if name == b"user-agent":
            request.META["HTTP_USER_AGENT"] = value.decode("latin-1")
    request.path = request.path_info = scope.get("path", "")
    request.method = scope.get("method", "POST")
    return request


class ThrottledTokenAuthentication(TokenAuthentication):
    """DRF's token authentication, counting wrong tokens per client address (SB-5)."""

    def authenticate(self, request: Any) -> Any:
        if not request.META.get("HTTP_AUTHORIZATION"):
            return None
        django_request = request._request
        try:
            return super().authenticate(request)
        except AuthenticationFailed:
            if token_locked_out(django_request):
                # The code the attempt that locked the address out got, not DRF's generic "throttled".
                raise Throttled(detail=lockout_message(), code="locked_out") from None
            record_token_failure(django_request)
            raise
