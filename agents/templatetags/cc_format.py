"""Number formatting shared by the run page and the dashboard."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def percent(value: float | None) -> str:
    """A ratio as a percentage; no data is a dash, never 0 %."""
    return "—" if value is None else f"{value * 100:.1f}%"


@register.filter
def tokens(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"
