"""`bench local`: the product's model path against the bare llama.cpp server, in one run (LM-1).

`python manage.py bench local --json [--repeats 5] [--max-tokens 48]`

Starts the local model server (SmolLM2-135M from the `[local]` extra, n_ctx 8192) with the
supervisor `serve`/`worker` use, then alternates two clients on the same prompt:

- `product`: the provider the registry builds for `CC_PROVIDER=local` (retries, the
  OpenAI-compatible adapter with prompted tools, usage counted with the server's tokenizer);
- `bare`: one streamed POST of the exact payload the product sends, read with httpx.

Figures: first-token and full-reply latency (medians) and tokens per second for each, the
ratios product / bare, and `first_token_added_ms` (target: under 50 ms). The full reply of
the product includes counting its usage (`/extras/tokenize/count`), which the bare client
does not do; `usage_ms` says what that costs.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

import httpx

from bench._options import positive
from controlcenter.localmodel import LocalModelConfig, LocalModelSupervisor, default_model_path
from controlcenter.stack import free_port
from engine.providers.openai_compat import OpenAICompatProvider, to_chat_payload, with_prompted_tools
from engine.providers.protocol import MessageDone, TextDelta
from engine.providers.retry import RetryingProvider
from engine.request import ModelRequestSpec

TOOL = {
    "name": "list_dir",
    "description": "List the files and folders in a directory of the workspace.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--repeats", type=positive, default=5)
    parser.add_argument("--max-tokens", type=positive, default=48)
    parser.add_argument("--threads", type=positive, default=2)


def run(options: dict[str, Any]) -> dict[str, Any]:
    path = default_model_path()
    if path is None:
        raise SystemExit("bench local needs the [local] extra: pip install -e '.[local]'")
    config = LocalModelConfig(model_path=path, port=free_port(), threads=options["threads"])
    with tempfile.TemporaryDirectory() as folder:
        supervisor = LocalModelSupervisor(config, log_path=Path(folder) / "server.log").start()
        try:
            supervisor.wait_ready(timeout=120)
            return _measure(config.base_url, options)
        finally:
            supervisor.stop()


def _measure(base_url: str, options: dict[str, Any]) -> dict[str, Any]:
    inner = OpenAICompatProvider(api_key=None, base_url=base_url, tool_results_as_text=True, prompted_tools=True)
    product = RetryingProvider(inner)
    request = ModelRequestSpec(
        model="smollm2-135m-instruct",
        system=[{"type": "text", "text": "You are a concise assistant working in a software project."}],
        tools=[TOOL],
        messages=[{"role": "user", "content": "Describe what a README file is for, in two sentences."}],
        max_tokens=options["max_tokens"],
    )
    payload = with_prompted_tools(to_chat_payload(request))
    samples: dict[str, list[dict[str, float]]] = {"product": [], "bare": []}
    _bare(base_url, payload)  # warm-up: the prompt enters the server's cache for both
    for index in range(options["repeats"]):
        for name in ("product", "bare") if index % 2 == 0 else ("bare", "product"):
            samples[name].append(_product(product, request) if name == "product" else _bare(base_url, payload))
    figures: dict[str, Any] = {"repeats": options["repeats"], "max_tokens": options["max_tokens"]}
    for name, runs in samples.items():
        for key in ("first_token_ms", "full_reply_ms", "tokens_per_second"):
            figures[f"{name}_{key}"] = round(statistics.median(run[key] for run in runs), 1)
    figures["usage_ms"] = round(statistics.median(run["usage_ms"] for run in samples["product"]), 1)
    for key in ("first_token_ms", "full_reply_ms", "tokens_per_second"):
        figures[f"ratio_{key}"] = round(figures[f"product_{key}"] / max(figures[f"bare_{key}"], 1e-9), 3)
    figures["first_token_added_ms"] = round(figures["product_first_token_ms"] - figures["bare_first_token_ms"], 1)
    return figures


def _product(provider: RetryingProvider, request: ModelRequestSpec) -> dict[str, float]:
    started = time.perf_counter()
    first = last = None
    pieces = 0
    for event in provider.stream(request):
        if isinstance(event, TextDelta):
            first = first or time.perf_counter()
            last = time.perf_counter()
            pieces += 1
        elif isinstance(event, MessageDone):
            done = time.perf_counter()
    return _sample(started, first, last or done, done, pieces)


def _bare(base_url: str, payload: dict[str, Any]) -> dict[str, float]:
    started = time.perf_counter()
    first = last = None
    pieces = 0
    with httpx.stream("POST", f"{base_url}/chat/completions", json={**payload, "stream": True}, timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    first = first or time.perf_counter()
                    last = time.perf_counter()
                    pieces += 1
    done = time.perf_counter()
    return _sample(started, first, last or done, done, pieces)


def _sample(started: float, first: float | None, last: float, done: float, pieces: int) -> dict[str, float]:
    first = first or done
    return {
        "first_token_ms": (first - started) * 1000,
        "full_reply_ms": (done - started) * 1000,
        "tokens_per_second": (pieces - 1) / (last - first) if pieces > 1 and last > first else 0.0,
        "usage_ms": (done - last) * 1000,
    }
