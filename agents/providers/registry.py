"""Pick the provider a run was created with."""

from __future__ import annotations

from agents.providers.base import Provider
from agents.providers.offline import OfflineProvider


class UnknownProvider(ValueError):
    pass


def get_provider(name: str) -> Provider:
    if name == "offline":
        return OfflineProvider()
    # The Anthropic and OpenAI-compatible adapters arrive with the provider-layer issue.
    raise UnknownProvider(f"Provider {name!r} is not available in this installation.")
