"""Serve the provider emulator on 127.0.0.1 for SDKs and tools to point at."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from engine.emulator import DEFAULT_CONTEXT_WINDOW, Emulator
from engine.emulator.server import EmulatorServer


class Command(BaseCommand):
    help = "Serve the Anthropic Messages API emulator (and an OpenAI-compatible route) on 127.0.0.1."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (0 picks a free one).")
        parser.add_argument("--context-window", type=int, default=DEFAULT_CONTEXT_WINDOW)
        parser.add_argument(
            "--min-cache-tokens", type=int, default=None, help="Minimum cacheable prefix (default: per model)."
        )
        parser.add_argument("--verbose-requests", action="store_true", help="Log every request line.")
        parser.add_argument("--first-token-ms", type=float, default=0.0, help="Latency before a stream starts.")
        parser.add_argument("--delta-ms", type=float, default=0.0, help="Latency before each streamed text delta.")

    def handle(self, *args: Any, **options: Any) -> None:
        emulator = Emulator(context_window=options["context_window"], min_cache_tokens=options["min_cache_tokens"])
        server = EmulatorServer(
            emulator,
            port=options["port"],
            verbose=options["verbose_requests"],
            first_token_ms=options["first_token_ms"],
            delta_ms=options["delta_ms"],
        )
        # The Anthropic SDK appends /v1/messages itself; the OpenAI SDK appends only /chat/completions.
        self.stdout.write(
            f"emulator listening on {server.base_url} "
            f"(ANTHROPIC_BASE_URL={server.base_url} OPENAI_BASE_URL={server.base_url}/v1)"
        )
        self.stdout.flush()
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
