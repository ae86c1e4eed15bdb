"""The scratchpad slice viewer: an entry's metadata and a slice of it.

Its script reads slices through the REST API. The form is a plain GET form too, which this view
answers with the same read: a person who presses Enter before the script has loaded (or without
it) gets the slice they asked for, not the page again with their question dropped.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from controlcenter.api import request_user
from controlcenter.errors import DomainError
from engine.scratchpad import read_tool
from scratchpad import selectors, services
from scratchpad.models import Entry

# The form's fields and what they hold before any read.
FORM_DEFAULTS = {"mode": "head", "n": "2000", "start": "1", "end": "50", "pattern": "", "context": "0"}
TEXT_MODES = ["head", "tail", "lines", "grep", "range"]
BINARY_MODES = ["head", "tail", "range"]
_NOT_FACTS = {"content", "text", "content_base64", "ok"}


@login_required
def entry_viewer(request: HttpRequest, entry_id: str) -> HttpResponse:
    entry = selectors.entry_for_user(user=request_user(request), entry_id=entry_id)
    if entry is None:
        raise Http404("No such scratchpad entry.")
    asked = {name: value for name, value in request.GET.items() if name in {*FORM_DEFAULTS, "ignore_case"}}
    context: dict[str, Any] = {
        "entry": entry,
        # What the tool said of its own output (a cut, bytes omitted): the slice is only what it kept (QA).
        "tool_note": _tool_note(entry),
        "modes": TEXT_MODES if entry.kind == Entry.Kind.TEXT else BINARY_MODES,
        "form": {**FORM_DEFAULTS, **asked},
    }
    status = 200
    if "mode" in request.GET:
        # Empty fields, and those of other modes (a form sent without its script sends them all),
        # are left out, as the script leaves them out.
        wanted = {"mode", *read_tool.mode_arguments(request.GET["mode"])}
        params = {name: str(value) for name, value in request.GET.items() if value != "" and name in wanted}
        try:
            result = services.read_slice(entry=entry, params=params)
        except DomainError as error:
            context["slice_error"], status = error.message, error.status
        else:
            context["slice"], context["slice_facts"] = _shown(result)
    return render(request, "scratchpad/viewer.html", context, status=status)


def _tool_note(entry: Entry) -> str:
    envelope = entry.envelope if isinstance(entry.envelope, dict) else {}
    omitted = [f"{name.removesuffix('_omitted').replace('_', ' ')}: {value:,}" for name, value in envelope.items()
               if name.endswith("_omitted") and isinstance(value, int)]  # fmt: skip
    note = str(envelope.get("_note", ""))
    return " ".join(part for part in (note, f"({'; '.join(omitted)} omitted)" if omitted else "") if part)


def _shown(result: dict[str, Any]) -> tuple[str, str]:
    """The slice's text and its facts line, as the script shows them."""
    text = result.get("content", result.get("content_base64"))
    if not isinstance(text, str):
        text = json.dumps(result if text is None else text, indent=2)
    facts = [f"{name}: {value}" for name, value in result.items() if name not in _NOT_FACTS and _scalar(value)]
    return text, " · ".join(facts)


def _scalar(value: Any) -> bool:
    return value is not None and not isinstance(value, dict | list)
