"""Time limits that follow the machine: how much slower this machine's cores are than the ones the
suite's limits were written on, measured once per run.

The suite's limits (a wait's cap, "healthz answers within a second", a browser's 15 s) were set on
2-core machines where a Django process started in 1.3 CPU-s. A machine of the same kind came with
cores half as fast (2.6 CPU-s for the same start): under the suite's five workers, /healthz during
the regex attack took 1.6 s, and a cap that held with margin elsewhere ran out, while everything
the tests check still happened. A limit here is scaled by the measured slowness, never below its
written value; each one stays far from what the defect it guards against would take (the regex
attack held /healthz 20 s before its fix).
"""

from __future__ import annotations

import os
import time

ENV = "CC_TEST_SLOWNESS"
# The calibration below took 0.055 s (best of 7) on the cores the limits were written on.
REFERENCE_SECONDS = 0.055
# A machine slower than this is not one the suite can vouch for by scaling: its limits stop at 4×.
MOST = 4.0


def _calibration() -> float:
    """A few dict and string operations, the kind of work that dominates Python start-up and Django."""
    table: dict[str, int] = {}
    for i in range(200_000):
        key = f"k{i % 997}"
        table[key] = table.get(key, 0) + len(key)
    return float(len(table))


def measure_slowness() -> float:
    """This machine's slowness against the reference, between 1 and MOST (best of 7: the machine's
    speed, not what else it was doing at that moment)."""
    best = float("inf")
    for _ in range(7):
        started = time.perf_counter()
        _calibration()
        best = min(best, time.perf_counter() - started)
    return round(min(MOST, max(1.0, best / REFERENCE_SECONDS)), 2)


def slowness() -> float:
    """The run's slowness: measured once by the controller before its workers start (tests/conftest.py),
    read from the environment in every worker; measured here when a test module runs on its own."""
    value = os.environ.get(ENV)
    if value is None:
        value = str(measure_slowness())
        os.environ[ENV] = value
    return float(value)


def scaled(seconds: float) -> float:
    """`seconds` on the reference machine: the same limit on this one."""
    return seconds * slowness()
