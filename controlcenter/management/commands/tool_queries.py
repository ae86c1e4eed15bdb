"""Real tool-search queries from recorded runs, as a query file for `bench search` (TS-1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.resident import DEFAULT_DAYS, recorded_tool_queries
from controlcenter.cli import whole_number


class Command(BaseCommand):
    help = (
        "Write the tool searches runs recorded, each with the tools its run then called, as JSON lines: "
        "measure the ranker on them with `bench search --catalog CATALOG --queries FILE` "
        "(CATALOG from `catalog export`)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--days", type=whole_number(1, 3650), default=DEFAULT_DAYS, help=f"default {DEFAULT_DAYS}")
        parser.add_argument("--output", "-o", default="", help="a file to write (default: standard output)")

    def handle(self, *args: Any, **options: Any) -> None:
        queries = recorded_tool_queries(days=options["days"])
        text = "".join(json.dumps(query, ensure_ascii=False) + "\n" for query in queries)
        if not options["output"]:
            sys.stdout.write(text)
            return
        path = Path(options["output"])
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from exc
        misses = sum(1 for query in queries if query["source"] == "miss")
        self.stdout.write(
            f"{path}: {len(queries)} queries ({misses} that found nothing first) from the last {options['days']} days."
        )
