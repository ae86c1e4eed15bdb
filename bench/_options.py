"""Argument types the benches share, so a bad option is refused by name before a bench starts.

argparse reports an `ArgumentTypeError` as "argument --NAME: message", and `manage.py bench`
turns that into a `CommandError`; a count of zero would otherwise end in a median of nothing,
a negative one in a figure that means nothing.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable
from pathlib import Path

from controlcenter.cli import whole_number
from toolcatalog.catalogfile import parse_catalog

# CC_CONTEXT_WINDOW_TOKENS's own minimum in controlcenter/settings.py.
MIN_WINDOW_TOKENS = 1024


positive = whole_number(1)
non_negative = whole_number(0)
window_tokens = whole_number(MIN_WINDOW_TOKENS)


def number(minimum: float, *, inclusive: bool) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            parsed = float(value)
        except ValueError:
            raise ArgumentTypeError(f"{value!r} is not a number") from None
        if not (parsed >= minimum if inclusive else parsed > minimum):
            raise ArgumentTypeError(f"must be {'at least' if inclusive else 'above'} {minimum:g}, not {value}")
        return parsed

    return parse


# Durations and timeouts.
positive_number = number(0, inclusive=False)
# Delays that may be none at all.
non_negative_number = number(0, inclusive=True)


def window_list(value: str) -> list[int]:
    """Comma-separated context windows, each at least CC_CONTEXT_WINDOW_TOKENS's minimum."""
    return [window_tokens(item.strip()) for item in value.split(",")]


def catalog_file(value: str) -> str:
    """The path of a catalog file (the format of `catalog import`) that parses without errors."""
    try:
        text = Path(value).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ArgumentTypeError(f"cannot read {value}: {exc}") from None
    errors = parse_catalog(text).errors
    if errors:
        raise ArgumentTypeError(f"{value} is not a tool catalog: {errors[0]}")
    return value
