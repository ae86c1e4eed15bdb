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


@register.filter
def money(value: float | None) -> str:
    """USD; a model without a price is a dash, never $0 (UX-6)."""
    if value is None:
        return "—"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"
