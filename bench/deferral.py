"""The tool block with and without deferral (TD-3), measured with the Context view's own code."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench._options import catalog_file
from engine.catalog.surface import ModeSpec, build_surface
from engine.tokens import estimate_text_tokens
from toolcatalog.catalogfile import records_from_catalog
from toolcatalog.selectors import surface_context


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--catalog", type=catalog_file, required=True, help="a catalog file (shared/data/toolcatalog.json)"
    )


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
        # TS-4 asks for a ratio of 0.15. The resident schemas alone set its floor, and what is
        # left of 0.15 is all the index may take for every deferred name.
        "resident_only_ratio": round(deferred["resident_tokens"] / full["tool_block_tokens"], 4),
        "index_budget_at_0_15": int(0.15 * full["tool_block_tokens"]) - deferred["resident_tokens"],
        "deferred_count": len(deferred["deferred"]),
        "deferred_name_tokens": estimate_text_tokens(", ".join(item["name"] for item in deferred["deferred"])),
    }
