"""Scratchpad benchmark: put throughput, slice reads on 1 MB vs 100 MB, grep time and memory.

Runs against whatever database the settings point at (PostgreSQL in services mode)
and removes its entries afterwards. Times are medians in milliseconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from bench._options import positive
from scratchpad import services
from scratchpad.models import Entry

# `manage.py bench` runs it in a scratch database (NAME_bench) and drops that afterwards.
WRITES_DATABASE = True

MB = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size-mb", type=positive, default=100, help="size of the large entry (default 100)")
    parser.add_argument("--repeats", type=positive, default=21, help="repetitions of each read (default 21)")
    parser.add_argument("--put-repeats", type=positive, default=3, help="repetitions of the large put (default 3)")


def typical_log(target_bytes: int, seed: int = 7) -> str:
    """An application server log: timestamps, levels, loggers, requests, the odd error and stack line."""
    rnd = random.Random(seed)
    levels = ["INFO"] * 10 + ["DEBUG"] * 5 + ["WARN", "ERROR"]
    events = [
        ("web.request", "{method} {path} -> {status} in {ms}ms (user={user})"),
        ("web.request", "{method} {path} -> {status} in {ms}ms (user={user}, cache=hit)"),
        ("db.pool", "acquired connection {conn} after {ms}ms (pool size 20, in use {inuse})"),
        ("worker.jobs", "job {job} finished: sent {n} notification(s) in {ms}ms"),
        ("auth", "session refreshed for user={user} from 10.0.{a}.{b}"),
        ("cache", "miss for key orders:{user}:summary, recomputed in {ms}ms"),
    ]
    paths = ["/api/v1/orders", "/api/v1/orders/{id}", "/api/v1/users/{id}", "/healthz", "/api/v1/cart", "/login"]
    lines: list[str] = []
    size = 0
    second = 0
    while size < target_bytes:
        second += rnd.randint(0, 2)
        logger, template = rnd.choice(events)
        level = rnd.choice(levels)
        message = template.format(
            method=rnd.choice(["GET", "GET", "POST", "PUT"]),
            path=rnd.choice(paths).format(id=rnd.randint(1, 5000)),
            status=rnd.choice([200, 200, 200, 201, 304, 404]),
            ms=rnd.randint(1, 900),
            user=rnd.randint(1, 20_000),
            conn=rnd.randint(1, 20),
            inuse=rnd.randint(1, 20),
            job=rnd.randint(100_000, 999_999),
            n=rnd.randint(1, 9),
            a=rnd.randint(0, 255),
            b=rnd.randint(0, 255),
        )
        clock = f"{second // 3600 % 24:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        stamp = f"2026-12-02 {clock},{rnd.randint(0, 999):03d}"
        line = f"{stamp} {level:<5} [{logger}] {message}\n"
        if level == "ERROR":
            line += (
                "Traceback (most recent call last):\n"
                '  File "/srv/app/orders/views.py", line 214, in create_order\n'
                "    order = service.place(cart, user)\n"
                "TimeoutError: upstream payment gateway did not answer within 5s\n"
            )
        lines.append(line)
        size += len(line)
    # The one line grep looks for sits at the very end, so grep reads everything.
    lines.append("2026-12-02 23:59:59,999 FATAL [storage] disk full on /var/lib/app, refusing writes\n")
    return "".join(lines)


def _median_ms(action: Callable[[], Any], repeats: int) -> float:
    action()  # warm caches the way a live worker has them
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 3)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


GREP_ARGUMENTS = {"mode": "grep", "pattern": r"FATAL .*disk full", "context": 2}


def grep_rss_child(entry_id: str, turn_id: str) -> None:
    """Run in a fresh process: grep once and print how much resident memory grew meanwhile."""
    entry = Entry.objects.get(pk=entry_id)
    services.read(entry_id=entry_id, turn_id=turn_id, arguments={"mode": "head", "n": 10})  # warm imports
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
    baseline = _status_kb("VmRSS")
    result = _read(entry, **GREP_ARGUMENTS)
    assert result["matches"] == 1, result
    sys.stdout.write(json.dumps({"growth_mb": (_status_kb("VmHWM") - baseline) / 1024}) + "\n")


def _grep_peak_rss_mb(entry: Entry) -> float:
    """Measured in a fresh process, so memory freed earlier by this one cannot hide the growth."""
    code = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'controlcenter.settings'); "
        f"django.setup(); from bench.scratchpad import grep_rss_child; grep_rss_child({entry.pk!r}, {entry.turn_id!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=settings.BASE_DIR, capture_output=True, text=True, check=True
    )
    return round(json.loads(done.stdout.strip().splitlines()[-1])["growth_mb"], 1)


def _read(entry: Entry, **arguments: Any) -> dict[str, Any]:
    result = services.read(entry_id=entry.pk, turn_id=entry.turn_id, arguments=arguments)
    if not result["ok"]:
        raise RuntimeError(f"bench read failed: {result['error']}")
    return result


def run(options: dict[str, Any]) -> dict[str, Any]:
    size = options["size_mb"] * MB
    turn_id = f"bench-{uuid.uuid4().hex[:12]}"
    text = typical_log(size)
    small_text = text[: MB + text[MB:].index("\n") + 1]
    try:
        put_seconds = []
        big = None
        for _ in range(options["put_repeats"]):
            if big is not None:
                Entry.objects.filter(pk=big.pk).delete()
            started = time.perf_counter()
            big = services.put(turn_id=turn_id, content=text)
            put_seconds.append(time.perf_counter() - started)
        assert big is not None
        small = services.put(turn_id=turn_id, content=small_text)
        del text, small_text
        gc.collect()

        def middle_range(entry: Entry) -> Callable[[], Any]:
            return lambda: _read(entry, mode="range", start=entry.length // 2, end=entry.length // 2 + 2000)

        def middle_lines(entry: Entry) -> Callable[[], Any]:
            first = entry.line_count // 2
            return lambda: _read(entry, mode="lines", start=first, end=first + 49)

        repeats = options["repeats"]
        figures: dict[str, Any] = {
            "put_mb_per_s_100mb": round(big.size_bytes / MB / statistics.median(put_seconds), 1),
            "read_range_ms_1mb": _median_ms(middle_range(small), repeats),
            "read_range_ms_100mb": _median_ms(middle_range(big), repeats),
            "read_lines_ms_1mb": _median_ms(middle_lines(small), repeats),
            "read_lines_ms_100mb": _median_ms(middle_lines(big), repeats),
            "read_tail_ms_100mb": _median_ms(lambda: _read(big, mode="tail", n=2000), repeats),
            "compression_ratio_log": round(big.size_bytes / big.stored_bytes, 2),
        }

        figures["grep_peak_rss_mb"] = _grep_peak_rss_mb(big)
        figures["grep_ms_100mb"] = _median_ms(lambda: _read(big, **GREP_ARGUMENTS), 3)
        figures["range_ratio_100mb_vs_1mb"] = round(figures["read_range_ms_100mb"] / figures["read_range_ms_1mb"], 2)
        figures["lines_ratio_100mb_vs_1mb"] = round(figures["read_lines_ms_100mb"] / figures["read_lines_ms_1mb"], 2)
        return figures
    finally:
        Entry.objects.filter(turn_id=turn_id).delete()
