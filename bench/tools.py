"""Built-in tool costs: per-call latency of file tools, bash overhead, search_tool_bm25 ranking.

python manage.py bench tools --json [--files 500] [--repeat 50] [--catalog FILE]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._options import catalog_file, non_negative, positive
from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.mcp_server import mcp_tool_list, rank_tools


def add_arguments(parser: Any) -> None:
    parser.add_argument("--files", type=non_negative, default=500, help="files in the synthetic workspace")
    parser.add_argument("--repeat", type=positive, default=50, help="calls per measurement")
    parser.add_argument(
        "--catalog", type=catalog_file, default=None, help="a toolcatalog.json to rank with search_tool_bm25"
    )


def _timed(call: Callable[[], Any], repeat: int) -> dict[str, float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"p50_ms": round(statistics.median(samples), 3), "p99_ms": round(samples[int(0.99 * (len(samples) - 1))], 3)}


def run(options: dict[str, Any]) -> dict[str, Any]:
    repeat = options["repeat"]
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for index in range(options["files"]):
            folder = root / f"pkg{index % 20}"
            folder.mkdir(exist_ok=True)
            (folder / f"mod{index}.py").write_text("".join(f"def f{n}(): return {n}\n" for n in range(200)))
        (root / "big.txt").write_text("".join(f"line {n}\n" for n in range(100_000)))
        box = WorkspaceToolBox(root, approve=lambda name, arguments: True)
        figures: dict[str, Any] = {"workspace_files": options["files"], "repeat": repeat}
        figures["read_file_page_of_100k_lines"] = _timed(
            lambda: box.execute("read_file", {"path": "big.txt", "offset": 50_000, "limit": 200}), repeat
        )
        figures["search_files_regex"] = _timed(
            lambda: box.execute("search_files", {"pattern": r"return 19\d$", "output": "count"}), max(3, repeat // 10)
        )
        figures["glob_all_py"] = _timed(lambda: box.execute("glob", {"pattern": "**/*.py"}), repeat)
        figures["bash_true"] = _timed(lambda: box.execute("bash", {"command": "true"}), repeat)
    if options["catalog"]:
        tools = json.loads(Path(options["catalog"]).read_text(encoding="utf-8"))["tools"]
    else:
        tools = mcp_tool_list()  # the installation's catalog: needs a migrated database
    figures["rank_tools_catalog_size"] = len(tools)
    figures["rank_tools"] = _timed(lambda: rank_tools("edit a file by replacing text", tools), repeat)
    return figures
