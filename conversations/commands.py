"""Slash commands (CH-10): a pure parser; `services.command_run` dispatches what it returns.

A message whose first word is a known command (`/compact`, `/branch 12`, ...) is that
command, never a prompt: a bad argument is a clear error that lists the valid forms.
Any other text starting with '/' ("/usr/bin/python3 crashes on start") is a prompt,
sent as it is with a note saying so; '//' at the start sends a literal '/'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# ASCII digits only (str.isdigit() takes '²', which int() refuses) and at most 18 of them, so the
# id fits PostgreSQL's bigint and a lookup never fails as a database error.
MESSAGE_ID_PATTERN = re.compile(r"^#?([0-9]{1,18})$", re.ASCII)

USAGE: dict[str, str] = {
    "compact": "/compact [summary]  run the context ladder now (elision, image dropping, snapshots); "
    "with summary, a worker climbs on to a summary by the conversation's model",
    "shake": "/shake  the free rungs only: elision and image dropping",
    "context": "/context  what fills the context window, by category, with token counts",
    "tree": "/tree  the conversation's message tree",
    "branch": "/branch <message id>  move the branch tip to that message",
    "fork": "/fork  copy the current path into a new conversation",
    "checkpoint": "/checkpoint <label>  label the current turn boundary",
    "rewind": "/rewind [label]  go back to a checkpoint (the latest one without a label)",
}


class CommandError(ValueError):
    """The text is not a valid command; the message says what is."""


@dataclass(frozen=True)
class Command:
    name: str
    message_id: int | None = None
    label: str | None = None
    # `/compact summary`: the last rung, a model call (CH-14).
    summary: bool = False


def is_command(text: str) -> bool:
    """The text names a known command: '/name' as its first word (case-insensitive)."""
    words = text.split(maxsplit=1)
    return bool(words) and words[0].startswith("/") and words[0][1:].lower() in USAGE


def as_prompt(text: str) -> tuple[str, str]:
    """The prompt a non-command text sends, and a note when a leading '/' was not a command.

    '//' escapes: '//compact' sends '/compact' as a prompt.
    """
    stripped = text.lstrip()
    if stripped.startswith("//"):
        return text.replace("//", "/", 1), ""
    if stripped.startswith("/"):
        word = stripped.split(maxsplit=1)[0]
        return text, f"{word[:40]} is not a command, so it was sent as a message. " + usage()
    return text, ""


def usage() -> str:
    return "Valid commands:\n" + "\n".join(f"  {line}" for line in USAGE.values())


def parse(text: str) -> Command:
    words = text.strip().split()
    if not words or not words[0].startswith("/") or words[0] == "/":
        raise CommandError("A command starts with '/' followed by its name. " + usage())
    name, args = words[0][1:].lower(), words[1:]
    if name not in USAGE:
        raise CommandError(f"Unknown command /{name[:40]}. " + usage())
    if name == "compact" and args:
        if len(args) != 1 or args[0].lower() != "summary":
            raise CommandError(f"/compact takes no argument or 'summary'. Usage: {USAGE[name]}")
        return Command(name, summary=True)
    if name in ("compact", "shake", "context", "tree", "fork"):
        if args:
            raise CommandError(f"/{name} takes no arguments. Usage: {USAGE[name]}")
        return Command(name)
    if name == "branch":
        match = MESSAGE_ID_PATTERN.match(args[0]) if len(args) == 1 else None
        if match is None:
            raise CommandError(
                f"/branch needs one message id (a number of at most 18 digits, as /tree shows it). Usage: {USAGE[name]}"
            )
        return Command(name, message_id=int(match.group(1)))
    if name == "checkpoint":
        if len(args) != 1:
            raise CommandError(f"/checkpoint needs one label. Usage: {USAGE[name]}")
        return Command(name, label=_label_argument(name, args[0]))
    if len(args) > 1:
        raise CommandError(f"/rewind takes at most one label. Usage: {USAGE[name]}")
    return Command(name, label=_label_argument(name, args[0]) if args else None)


def _label_argument(name: str, label: str) -> str:
    try:
        return validate_label(label)
    except CommandError as exc:
        raise CommandError(f"{exc} Usage: {USAGE[name]}") from None


def validate_label(label: str) -> str:
    if not LABEL_PATTERN.fullmatch(label):
        raise CommandError(
            f"{label[:80]!r} is not a valid label: use 1 to 64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit."
        )
    return label
