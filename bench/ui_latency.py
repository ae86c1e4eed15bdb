"""`bench ui_latency`: what a person waits for on the conversation page (UX-1), in Chromium.

python manage.py bench ui_latency --json [--sends 20]

Starts a served embedded instance (its own SQLite and in-process worker in a temporary folder,
the offline model), opens the conversation page in Debian's headless Chromium, and sends
`--sends` messages from the composer with Enter. The page itself timestamps, with
`performance.now()`:

- `first_token_ms`: from the Enter key to the first text of the reply drawn on the page (the
  streamed text, or the stored reply if the run ended before its first delta was drawn);
- `reply_ms`: from the Enter key to the finished reply drawn as Markdown (the live article
  replaced by the stored one, which carries the prompt's echo).

Medians and p90 over the sends. The offline model answers at once, so the figures are the
product's own path: the POST, the worker thread, the event log, the websocket, the fragment.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

import httpx

from bench._options import positive
from controlcenter.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "bench-ui-latency-1"
# Installed in the page: the Enter that sends starts a clock; a MutationObserver notes the
# first drawn reply text and the finished reply (no live article, the echo in a stored one).
PROBE = """() => {
  const input = document.getElementById("composer-input");
  const root = document.getElementById("conversation");
  window.ccLatency = null;
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      window.ccLatency = { marker: input.value.trim(), start: performance.now(), first: null, done: null };
    }
  }, true);
  const check = () => {
    const probe = window.ccLatency;
    if (!probe || probe.done !== null) return;
    const now = performance.now();
    const live = document.querySelector("#messages article.live .text");
    const stored = [...document.querySelectorAll("#messages article.assistant:not(.live)")]
      .some((article) => article.textContent.includes(probe.marker));
    if (probe.first === null && ((live && live.textContent) || stored)) probe.first = now;
    if (stored && !document.querySelector("#messages article.live")) probe.done = now;
  };
  new MutationObserver(check).observe(root, { subtree: true, childList: true, characterData: true });
}"""


def add_arguments(parser: ArgumentParser) -> None:
    parser.add_argument("--sends", type=positive, default=20, help="messages sent, one after the other")


def _serve(folder: Path) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(CC_VAR_DIR=str(folder / "var"), CC_ADMIN_PASSWORD=PASSWORD, PYTHONPATH=str(ROOT))
    cli = [sys.executable, "-m", "controlcenter.cli"]
    subprocess.run([*cli, "manage", "bootstrap"], env=env, cwd=ROOT, check=True, capture_output=True)
    port = free_port()
    with (folder / "server.log").open("wb") as log:
        server = subprocess.Popen([*cli, "serve", "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return server, base
        except httpx.HTTPError:
            time.sleep(0.3)
    server.kill()
    raise SystemExit(f"the embedded server did not start: {(folder / 'server.log').read_text()[-2000:]}")


def _figures(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "max_ms": round(ordered[-1], 1),
    }


def run(options: dict[str, Any]) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright  # a dev dependency: only this benchmark needs it

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as tmp:
        server, base = _serve(Path(tmp))
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_context(viewport={"width": 1100, "height": 800}).new_page()
                page.goto(base + "/login/")
                page.fill("input[name=username]", "admin")
                page.fill("input[name=password]", PASSWORD)
                page.keyboard.press("Enter")
                page.fill("#new-conversation input[name=title]", "ui latency")
                page.click("#new-conversation button")
                page.wait_for_selector("#conversation[data-live]")
                page.evaluate(PROBE)
                first, done = [], []
                for n in range(options["sends"]):
                    page.fill("#composer-input", f"latency probe {n} {uuid.uuid4().hex[:8]}")
                    page.keyboard.press("Enter")
                    page.wait_for_function("() => window.ccLatency && window.ccLatency.done !== null", timeout=60_000)
                    probe = page.evaluate("window.ccLatency")
                    first.append(probe["first"] - probe["start"])
                    done.append(probe["done"] - probe["start"])
                    # Settled before the next send: no request of the page in flight.
                    page.wait_for_function("() => !document.getElementById('conversation').dataset.busy")
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    return {
        "sends": options["sends"],
        "model": "offline",
        "first_token": _figures(first),
        "finished_reply": _figures(done),
    }
