"""The offload rule (SP-1) and the synthetic observation (SP-3), as pure functions.

An observation is usually a small envelope (ok, path, encoding, status…) around one
large value (`content`, `stdout`, a body). That value becomes the entry's content,
read by characters and lines; the envelope is kept beside it, so the full
observation can be rebuilt exactly for `{{stepN.field}}` references (SP-9). When no
single value dominates, the whole observation is stored as indented JSON so that
line and grep reads still make sense.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from engine.scratchpad.summary import binary_summary, text_summary

TEXT = "text"
BINARY = "binary"
# How the stored content maps back to the observation's value.
AS_TEXT = "text"  # a str
AS_BYTES = "bytes"  # bytes (decoded to text for storage when they are valid UTF-8)
AS_BASE64 = "base64"  # a base64 str; stored as the raw bytes
AS_SURROGATES = "surrogateescape"  # a str carrying undecodable bytes; stored as those bytes
AS_JSON = "json"  # the whole observation, stored as indented JSON

BINARY_ENCODINGS = {"binary", "base64", "bytes"}
_METADATA_VALUE_MAX = 400


@dataclass(frozen=True)
class Payload:
    kind: str
    content: str | bytes
    field: str
    encoding: str
    envelope: dict[str, Any] = dataclasses.field(default_factory=dict)
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return len(self.content) if isinstance(self.content, bytes) else len(self.content.encode("utf-8"))

    @property
    def summary(self) -> str:
        return binary_summary(self.content) if isinstance(self.content, bytes) else text_summary(self.content)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def observation_size(observation: Any) -> int:
    """SP-1's measure, `len(json.dumps(observation))`; bytes count as their base64 text."""
    return len(json.dumps(observation, default=_jsonable))


def needs_offload(observation: Any, threshold: int) -> bool:
    return observation_size(observation) > threshold


def jsonable_observation(observation: dict[str, Any]) -> dict[str, Any]:
    """A small observation that carries bytes, made fit for the JSON history (base64)."""
    jsonable: dict[str, Any] = json.loads(json.dumps(observation, default=_jsonable))
    return jsonable


def split_observation(observation: dict[str, Any], *, threshold: int) -> Payload:
    """Choose what becomes the entry's content and what stays in the envelope."""
    total = observation_size(observation)
    candidates = [
        (observation_size(value), key)
        for key, value in observation.items()
        if isinstance(value, str | bytes | bytearray) and key != "ok"
    ]
    if candidates:
        size, key = max(candidates)
        envelope = {k: v for k, v in observation.items() if k != key}
        envelope_size = observation_size(envelope)
        # The envelope goes into the model's history as metadata: it must stay small.
        if size * 2 >= total and envelope_size <= max(1024, threshold // 2):
            kind, content, encoding = _classify(observation[key], envelope)
            metadata = {k: v for k, v in envelope.items() if k != "ok"}
            return Payload(kind, content, key, encoding, envelope, metadata)
    text = json.dumps(observation, indent=1, ensure_ascii=False, default=_jsonable)
    metadata = {
        key: value
        for key, value in observation.items()
        if key != "ok"
        and (value is None or isinstance(value, bool | int | float | str))
        and observation_size(value) <= _METADATA_VALUE_MAX
    }
    return Payload(TEXT, text, "", AS_JSON, {}, metadata)


def _classify(value: str | bytes | bytearray, envelope: dict[str, Any]) -> tuple[str, str | bytes, str]:
    declared = str(envelope.get("encoding", "")).lower()
    if isinstance(value, bytes | bytearray):
        data = bytes(value)
        if declared in BINARY_ENCODINGS:
            return BINARY, data, AS_BYTES
        try:
            return TEXT, data.decode("utf-8"), AS_BYTES
        except UnicodeDecodeError:
            # Not valid UTF-8: keep the exact bytes rather than mangle them.
            return BINARY, data, AS_BYTES
    if declared == "base64":
        try:
            return BINARY, base64.b64decode(value, validate=True), AS_BASE64
        except (binascii.Error, ValueError):
            pass
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return BINARY, value.encode("utf-8", "surrogateescape"), AS_SURROGATES
    return TEXT, value, AS_TEXT


def rebuild_observation(*, content: str | bytes, field: str, encoding: str, envelope: dict[str, Any]) -> Any:
    """The observation exactly as the tool returned it (bytes values included)."""
    if encoding == AS_JSON:
        return json.loads(content)
    if encoding == AS_BYTES:
        value: Any = content if isinstance(content, bytes) else content.encode("utf-8")
    elif encoding == AS_BASE64:
        value = base64.b64encode(content if isinstance(content, bytes) else content.encode("utf-8")).decode("ascii")
    elif encoding == AS_SURROGATES:
        value = content.decode("utf-8", "surrogateescape") if isinstance(content, bytes) else content
    else:
        value = content
    rebuilt = dict(envelope)
    rebuilt[field] = value
    return rebuilt


def synthetic_observation(
    *, entry_id: str, step: int, payload: Payload, summary: str, ok: bool = True
) -> dict[str, Any]:
    """What the model's history holds instead of a large observation (SP-3).

    `ok` stays false for a failed tool whose output was large (a long stderr), so
    offloading never turns a failure into an apparent success.
    """
    if payload.field:
        what = f"The full {payload.field!r} of step {step}"
        reference = f"{{{{step{step}.{payload.field}}}}}"
    else:
        what = f"The full observation of step {step} (as indented JSON)"
        reference = f"{{{{step{step}.<field>}}}}"
    note = (
        f"{what} is too large for the context and was saved in the scratchpad as {entry_id}. "
        "Read parts of it with the scratchpad_read tool (head, tail, range, lines, grep); "
        f"to pass the full value to another tool, write {reference} as that argument."
    )
    return {
        "ok": ok,
        "scratchpad_id": entry_id,
        "size_bytes": payload.size_bytes,
        "kind": payload.kind,
        "summary": summary,
        "metadata": payload.metadata,
        "_note": note,
    }


def _size(n: int) -> str:
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def scratchpad_full(*, used_bytes: int, quota_bytes: int, next_expiry: str | None) -> str:
    """Why a result was not kept (its owner's scratchpad is full), how full, and what frees space."""
    expiry = f" (the next one at {next_expiry})" if next_expiry else ""
    return (
        f"this user's scratchpad is full. It holds {_size(used_bytes)} of the {_size(quota_bytes)} quota per user "
        f"(CC_SCRATCHPAD_QUOTA_MB). Space comes back as the user's scratchpad entries expire{expiry}, or when the "
        "user deletes conversations they no longer need."
    )


def unstored_observation(*, step: int, payload: Payload, summary: str, full: str, ok: bool = True) -> dict[str, Any]:
    """What the history holds instead of a large observation its owner has no room to store.

    The model gets what SP-3 shows, without an id (nothing was stored): the summary, the
    metadata, and a note that the scratchpad is full, how full, and what frees space, so the
    cut is never silent (SP-1) and the turn goes on.
    """
    what = f"The full {payload.field!r} of step {step}" if payload.field else f"The full observation of step {step}"
    note = (
        f"{what} ({_size(payload.size_bytes)}) is too large for the context and was NOT saved: {full} Only the "
        "summary above is kept; it cannot be read with scratchpad_read or passed to another tool with "
        f"{{{{step{step}.<field>}}}}. Meanwhile, ask tools for less (a range of lines, a filter) so that their "
        "results fit in the context."
    )
    return {
        "ok": ok,
        "size_bytes": payload.size_bytes,
        "kind": payload.kind,
        "summary": summary,
        "metadata": payload.metadata,
        "_note": note,
    }
