"""Secrets kept out of every log line (RN-3).

Our own messages never print a secret, but libraries do: httpx logs every request's full URL
("HTTP Request: POST http://host/mcp?token=…"), the MCP client logs the endpoint with its user
info, and an exception's text can carry either. A handler filter would not reach Celery's and
uvicorn's own handlers, so the redaction sits in the log record factory, which every record of
every logger passes through once it is known to be emitted.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

# A password in a URL's user info: scheme://user:PASSWORD@host.
_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^:/@\s'\"]*:)([^@/\s'\"]+)(@)")
# A query parameter whose name says it is a credential: ?token=…, &api_key=…, &password=….
_CREDENTIAL_QUERY = re.compile(
    r"(?i)([?&][\w.-]*(?:token|key|secret|pass|auth|sig|credential|session)[\w.-]*=)([^&#\s'\"]+)"
)
HIDDEN = "***"


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with URL passwords, credential query values and the given secret values hidden."""
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, HIDDEN)
    text = _USERINFO.sub(rf"\1{HIDDEN}\3", text)
    return _CREDENTIAL_QUERY.sub(rf"\1{HIDDEN}", text)


def configured_secrets() -> list[str]:
    """The secret values in the settings; any of them appearing in a log line is replaced."""
    values = [
        settings.SECRET_KEY,
        getattr(settings, "ANTHROPIC_API_KEY", None),
        getattr(settings, "OPENAI_API_KEY", None),
        settings.DATABASES["default"].get("PASSWORD"),
    ]
    if settings.REDIS_URL:
        values.append(urlsplit(settings.REDIS_URL).password)
    # Short values (a password "pw") would blank out ordinary words; the patterns still cover URLs.
    return sorted({value for value in values if value and len(value) >= 8}, key=len, reverse=True)


_known: list[str] = []


def register_secrets(values: Iterable[str]) -> None:
    """Secrets learnt at run time (an MCP server's env and header values): hidden from every later log line."""
    fresh = {value for value in values if value and len(value) >= 4} - set(_known)
    if fresh:
        _known[:] = sorted({*_known, *fresh}, key=len, reverse=True)


def install_log_redaction(secrets: Iterable[str]) -> None:
    """Make every log record created from now on carry its message, arguments and traceback redacted.

    An argument is replaced by its redacted text only when redaction changes it; otherwise it
    stays as it was (an object, a number), for the handler to format as usual.
    """
    known = _known
    known[:] = sorted(set(secrets), key=len, reverse=True)
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacts", False):
        previous = previous.wrapped  # type: ignore[attr-defined]  # settings reloaded: replace, never stack

    def clean(value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value  # may be formatted with %d; holds no text
        text = value if isinstance(value, str) else str(value)  # e.g. httpx logs a URL object
        redacted = redact_text(text, known)
        return value if redacted == text else redacted

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        # The message and each argument on their own: formatters such as uvicorn's access log
        # unpack `record.args`, so its shape must stay (a URL's query is one argument there).
        record.msg = clean(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(clean(value) for value in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: clean(value) for key, value in record.args.items()}
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact_text("".join(traceback.format_exception(*record.exc_info)).rstrip(), known)
        return record

    factory.redacts = True  # type: ignore[attr-defined]
    factory.wrapped = previous  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
