"""A faithful stand-in for the Anthropic Messages API (and an OpenAI-compatible route).

There is no network in tests and benchmarks, so every cache figure the product
shows comes through here. It is built to the documented rules, never kinder:

- the prompt is the blocks in the order tools -> system -> messages; each block
  position carries a cumulative prefix hash (seeded by the model); `cache_control`
  is not part of the hash;
- at most four breakpoints; TTL "5m" (default) or "1h", counted from the start of
  the request that wrote or read the entry, refreshed by each read; a longer TTL
  must not follow a shorter one;
- a read looks back from each breakpoint over at most `lookback` (20) block
  positions; a run of consecutive tool_use blocks is one position, and so is a run
  of tool_result blocks; a write is one entry per breakpoint beyond the deepest
  hit, and nothing is cached below the model's minimum prefix length;
- an entry becomes readable only once the response that writes it starts
  streaming, so concurrent identical requests all miss and all write;
- usage as the API reports it: cache reads, cache writes (split 5m / 1h), and
  `input_tokens` after the last breakpoint; the three add up to the prompt;
- `defer_loading` tools are outside the prefix; a `tool_reference` block inside a
  tool result expands to that tool's definition where it stands;
- errors with the API's status codes and wording; injected faults (429 with
  retry-after, 529, a stream cut mid-response) for retry tests.

Pure Python, no Django: tests, benchmarks and the offline provider use it in
process; `EmulatorServer` (in `engine.emulator.server`) serves it over HTTP for
the official SDKs.

Modules: `validation` (request checks, error shapes), `cache` (layout, prefix
hashes, breakpoints, TTLs), `accounting` (tokens, usage), `sse` (Messages
responses and stream events), `openai_route` (chat completions), `policy`
(clocks, replies, faults), `core` (the `Emulator`), `server` (HTTP).
"""

from engine.emulator.accounting import Usage
from engine.emulator.cache import MAX_BREAKPOINTS, analyse
from engine.emulator.core import DEFAULT_CONTEXT_WINDOW, Emulator
from engine.emulator.openai_route import OpenAIPendingResponse, openai_to_anthropic
from engine.emulator.policy import Clock, Fault, Policy, ScriptedPolicy, SystemClock, TestClock, default_policy
from engine.emulator.sse import PendingResponse
from engine.emulator.validation import ApiError, StreamCut, invalid_request

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "MAX_BREAKPOINTS",
    "ApiError",
    "Clock",
    "Emulator",
    "Fault",
    "OpenAIPendingResponse",
    "PendingResponse",
    "Policy",
    "ScriptedPolicy",
    "StreamCut",
    "SystemClock",
    "TestClock",
    "Usage",
    "analyse",
    "default_policy",
    "invalid_request",
    "openai_to_anthropic",
]
