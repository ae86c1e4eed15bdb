"""The emulator as a provider in this process: the real cache rules without a socket.

For tests and benchmarks that drive many requests (bench cache). `on_stream_start`
is called when the response starts streaming, which is when what it wrote becomes
readable (TD-14 releases a fan-out's siblings at that moment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from engine.emulator import ApiError, Emulator
from engine.providers.protocol import MessageDone, ProviderEvent, TextDelta, ToolUseBlock, Usage, error_for_status
from engine.request import ModelRequestSpec


class EmulatorProvider:
    name = "emulator"
    defers_tool_loading = True
    # The Messages API continues a final assistant message (a reply cut by max_tokens, EM-4).
    supports_prefill = True

    def __init__(self, emulator: Emulator, *, on_stream_start: Callable[[], None] | None = None) -> None:
        self.emulator = emulator
        self.on_stream_start = on_stream_start

    def stream(self, request: ModelRequestSpec) -> Iterator[ProviderEvent]:
        try:
            pending = self.emulator.begin(request.as_payload())
        except ApiError as exc:
            raise error_for_status(exc.status, exc.message) from exc
        pending.start()
        if self.on_stream_start is not None:
            self.on_stream_start()
        message = pending.message()
        for block in message["content"]:
            if block["type"] == "text":
                yield TextDelta(block["text"])
            elif block["type"] == "tool_use":
                yield ToolUseBlock(id=block["id"], name=block["name"], input=block["input"])
        usage = message["usage"]
        yield MessageDone(
            content=message["content"],
            stop_reason=message["stop_reason"],
            usage=Usage(
                input_tokens=usage["input_tokens"],
                cache_creation_input_tokens=usage["cache_creation_input_tokens"],
                cache_read_input_tokens=usage["cache_read_input_tokens"],
                output_tokens=usage["output_tokens"],
                cache_creation_5m_input_tokens=usage["cache_creation"]["ephemeral_5m_input_tokens"],
                cache_creation_1h_input_tokens=usage["cache_creation"]["ephemeral_1h_input_tokens"],
            ),
            request_id=message["id"],
        )
