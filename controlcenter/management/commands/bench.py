from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import bench


def _available() -> list[str]:
    return sorted(module.name for module in pkgutil.iter_modules(bench.__path__) if not module.name.startswith("_"))


class Command(BaseCommand):
    help = "Run a benchmark from bench/ and print its figures (one JSON object with --json)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", choices=_available(), help="which benchmark to run")
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark itself")

    def handle(self, *args: Any, **options: Any) -> None:
        module = importlib.import_module(f"bench.{options['name']}")
        own = argparse.ArgumentParser(prog=f"bench {options['name']}")
        if hasattr(module, "add_arguments"):
            module.add_arguments(own)
        rest = list(options["rest"])
        # `--json` may come after the benchmark's own options; it is ours either way.
        as_json = options["json"] or "--json" in rest
        rest = [arg for arg in rest if arg != "--json"]
        try:
            bench_options = vars(own.parse_args(rest))
        except SystemExit as exc:
            raise CommandError(f"bad options for bench {options['name']}") from exc
        try:
            figures = module.run(bench_options)
        except (OSError, json.JSONDecodeError) as exc:
            # A data file named on the command line that is missing, unreadable or not JSON.
            raise CommandError(f"bench {options['name']}: {exc}") from exc
        if as_json:
            self.stdout.write(json.dumps(figures, sort_keys=True))
        else:
            for key, value in sorted(figures.items()):
                self.stdout.write(f"{key}: {value}")
