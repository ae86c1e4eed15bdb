"""The tool block with and without deferral (TD-3), measured with the Context view's own code."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engine.catalog.surface import ModeSpec, build_surface
from toolcatalog.catalogfile import records_from_catalog
from toolcatalog.selectors import surface_context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", required=True, help="a catalog file (shared/data/toolcatalog.json)")


def run(options: dict[str, Any]) -> dict[str, Any]:
    records = records_from_catalog(json.loads(Path(options["catalog"]).read_text(encoding="utf-8")))
    full = surface_context(build_surface(records, ModeSpec(), deferral=False))
    deferred = surface_context(build_surface(records, ModeSpec(), deferral=True))
    return {
        "n_tools": len(records),
        "full_tool_tokens": full["tool_block_tokens"],
        "deferred_tool_tokens": deferred["tool_block_tokens"],
        "ratio": round(deferred["tool_block_tokens"] / full["tool_block_tokens"], 4),
        "index_tokens": deferred["index"]["tokens"],
        "resident_count": len(deferred["resident"]),
        "resident_tokens": deferred["resident_tokens"],
        "withheld_tokens": deferred["withheld_tokens"],
    }
