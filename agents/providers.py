"""Pick the provider a run was created with."""

from __future__ import annotations

from django.conf import settings

from controlcenter.localmodel import NamesAForeignServer, RestartWait
from engine.providers.offline import OfflineProvider
from engine.providers.protocol import Provider
from engine.providers.retry import RetryingProvider


class UnknownProvider(ValueError):
    pass


def get_provider(name: str) -> Provider:
    """The named provider, configured from settings; network providers retry transient failures.

    The model name is not read here: a run records its conversation's model (from
    CC_MODELS, CC_MODEL by default) and that model's provider when it is created, and the
    request carries it, so an old run keeps the model it started with.
    """
    if name == "offline":
        return OfflineProvider()
    if name == "anthropic":
        # Each SDK is imported by the process that calls it: anthropic's costs about 1.3 s at import,
        # openai's 0.4 s, which a web process or a worker for another provider never needs to pay.
        from engine.providers.anthropic import AnthropicProvider

        if not settings.ANTHROPIC_API_KEY:
            raise UnknownProvider("Provider 'anthropic' needs ANTHROPIC_API_KEY.")
        return RetryingProvider(
            AnthropicProvider(api_key=settings.ANTHROPIC_API_KEY, base_url=settings.ANTHROPIC_BASE_URL or None)
        )
    if name == "openai":
        # The SDK's import cost, as above.
        from engine.providers.openai_compat import OpenAICompatProvider

        if not (settings.OPENAI_API_KEY or settings.OPENAI_BASE_URL):
            raise UnknownProvider("Provider 'openai' needs OPENAI_API_KEY, or OPENAI_BASE_URL for a local server.")
        return RetryingProvider(
            OpenAICompatProvider(api_key=settings.OPENAI_API_KEY or None, base_url=settings.OPENAI_BASE_URL or None)
        )
    if name == "local":
        # The SDK's import cost, as above.
        from engine.providers.openai_compat import OpenAICompatProvider

        # LM-1: the llama.cpp server `serve`/`worker` supervise; its chat format drops `tool` messages
        # and cannot stream (or cap) a call the model chose itself: the tools are prompted instead.
        local = OpenAICompatProvider(
            api_key=None,
            base_url=settings.CC_LOCAL_MODEL_URL,
            tool_results_as_text=True,
            prompted_tools=True,
            context_window=settings.CC_LOCAL_MODEL_CONTEXT,
        )
        # A server being restarted (by this host's supervisor) is waited for, not a failed run.
        return RetryingProvider(
            NamesAForeignServer(local, settings.CC_LOCAL_MODEL_URL), sleep=RestartWait(settings.CC_LOCAL_MODEL_URL)
        )
    raise UnknownProvider(f"Provider {name!r} is not available in this installation.")
