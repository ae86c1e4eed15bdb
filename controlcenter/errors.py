"""Domain errors raised by services; the API and pages map them in one place."""

from __future__ import annotations


class DomainError(Exception):
    code = "invalid"
    status = 400

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Machine-readable help beside the sentence, e.g. the values that would have been accepted.
        self.details = details


class NotFound(DomainError):
    code = "not_found"
    status = 404


class Conflict(DomainError):
    code = "conflict"
    status = 409


class RunInProgress(Conflict):
    """The conversation's run holds it: the request may be sent again once the run ends."""

    code = "run_in_progress"


class ServiceUnavailable(DomainError):
    """A service the request needs (the run queue) is down; nothing was changed, try again later."""

    code = "unavailable"
    status = 503
