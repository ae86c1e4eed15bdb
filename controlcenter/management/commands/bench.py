from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

import bench


def _available() -> list[str]:
    return sorted(module.name for module in pkgutil.iter_modules(bench.__path__) if not module.name.startswith("_"))


class _BenchParser(argparse.ArgumentParser):
    """A bad option is a CommandError naming it; --help still prints and exits 0."""

    def error(self, message: str) -> NoReturn:
        raise CommandError(f"{self.prog}: {message}")


@contextmanager
def _scratch_database() -> Iterator[str]:
    """A migrated database of its own beside the configured one, dropped afterwards.

    A bench makes users, conversations and runs, imports catalogs and fills the scratchpad;
    none of that belongs in an operator's database, and a bench that fails half-way would
    leave it there. Its workers and servers are pointed at this one (`connection.settings_dict`).
    """
    test = connection.settings_dict.setdefault("TEST", {})
    name = connection.settings_dict["NAME"]
    # Not Django's default test_<name>: that is the test suite's, and autoclobber would drop it.
    test["NAME"] = f"{name}-bench" if connection.vendor == "sqlite" else f"{name}_bench"
    configured = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        yield connection.settings_dict["NAME"]
    finally:
        connection.creation.destroy_test_db(configured, verbosity=0)


# `timeout`, `kill`, systemd and a closed terminal stop a process with these.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _stopped_like_ctrl_c() -> Iterator[None]:
    """A stop signal unwinds the bench as Ctrl+C does: its `finally` blocks stop the servers,
    workers and Redis it started and drop its scratch database. With the default action the
    process died on the spot and left all of them running, orphaned (QA: `timeout 40 ... bench
    load`). Later signals are ignored so that the cleanup runs to its end; SIGKILL still works."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        for each in STOP_SIGNALS:
            signal.signal(each, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = {each: signal.signal(each, stop) for each in STOP_SIGNALS}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


class Command(BaseCommand):
    help = (
        "Run a benchmark from bench/ and print its figures (one JSON object with --json). "
        "Benchmarks that write run in a scratch database (NAME_bench), created and dropped for the run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", choices=_available(), help="which benchmark to run")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark itself")

    def handle(self, *args: Any, **options: Any) -> None:
        module = importlib.import_module(f"bench.{options['name']}")
        own = _BenchParser(prog=f"bench {options['name']}")
        if hasattr(module, "add_arguments"):
            module.add_arguments(own)
        rest = list(options["rest"])
        # `--json` may come after the benchmark's own options; it is ours either way.
        as_json = options["json"] or "--json" in rest
        rest = [arg for arg in rest if arg != "--json"]
        bench_options = vars(own.parse_args(rest))
        # Rules between options, checked like the rest before anything starts.
        problem = module.check(bench_options) if hasattr(module, "check") else None
        if problem:
            own.error(problem)
        try:
            with _stopped_like_ctrl_c():
                if getattr(module, "WRITES_DATABASE", False):
                    with _scratch_database():
                        figures = module.run(bench_options)
                else:
                    figures = module.run(bench_options)
        except (OSError, ValueError) as exc:
            # A data file named on the command line that is missing, unreadable, not JSON or not
            # of the shape the benchmark reads (json.JSONDecodeError is a ValueError).
            raise CommandError(f"bench {options['name']}: {exc}") from exc
        if as_json:
            self.stdout.write(json.dumps(figures, sort_keys=True))
        else:
            for key, value in sorted(figures.items()):
                self.stdout.write(f"{key}: {value}")
