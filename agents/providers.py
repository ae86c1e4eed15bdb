"""Pick the provider a run was created with."""

from __future__ import annotations

import functools
import os

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
        if not settings.ANTHROPIC_API_KEY:
            raise UnknownProvider("Provider 'anthropic' needs ANTHROPIC_API_KEY.")
        return RetryingProvider(
            _anthropic_client(settings.ANTHROPIC_API_KEY, settings.ANTHROPIC_BASE_URL or None, os.getpid())
        )
    if name == "openai":
        if not (settings.OPENAI_API_KEY or settings.OPENAI_BASE_URL):
            raise UnknownProvider("Provider 'openai' needs OPENAI_API_KEY, or OPENAI_BASE_URL for a local server.")
        if not settings.OPENAI_BASE_URL:
            return RetryingProvider(_openai_client(settings.OPENAI_API_KEY, os.getpid()))
        # A server of the operator's own (vLLM, Ollama) gets a new client each run: what the client
        # learns of it (no token-count endpoint, no usage in the stream) may change when it restarts.
        # Deferred: the SDK's import cost (see _anthropic_client).
        from engine.providers.openai_compat import OpenAICompatProvider

        return RetryingProvider(
            OpenAICompatProvider(api_key=settings.OPENAI_API_KEY or None, base_url=settings.OPENAI_BASE_URL)
        )
    if name == "local":
        # Deferred: the SDK's import cost (see _anthropic_client).
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


# One client per process and configuration for the hosted APIs: its connection pool outlives a run,
# so a run that starts while the pool still keeps the last one's connection (httpx keeps an idle one
# 5 s) skips the TLS handshake, and every run skips the ~20 ms of CPU that building a client and its
# certificate store costs. The retrying wrapper, which holds a run's own state, stays one per run.
# The process id is part of the key: a forked process builds its own client rather than sharing its
# parent's connections, and nothing has to run at fork time.
@functools.lru_cache(maxsize=4)
def _anthropic_client(api_key: str, base_url: str | None, pid: int) -> Provider:
    # Deferred: each SDK is imported by the process that calls it (anthropic's costs about 1.3 s at
    # import, openai's 0.4 s), which a web process or a worker for another provider never pays.
    from engine.providers.anthropic import AnthropicProvider

    return AnthropicProvider(api_key=api_key, base_url=base_url)


@functools.lru_cache(maxsize=4)
def _openai_client(api_key: str, pid: int) -> Provider:
    # Deferred: the SDK's import cost (see _anthropic_client).
    from engine.providers.openai_compat import OpenAICompatProvider

    return OpenAICompatProvider(api_key=api_key)
