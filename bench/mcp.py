"""Cost of calling an imported stdio MCP tool, cold (process start) and warm (reused), against a built-in.

The server runs in the tool sandbox, as in a run (bubblewrap start-up is part of the cold figure).

python manage.py bench mcp --json [--repeat 50] [--command mcp-server-time]

The server is `mcp-server-time` (dev extra) unless --command names another stdio server
with a `get_current_time {"timezone": "UTC"}` tool. All figures come from one run.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._options import positive
from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.mcp_client import McpConnections, observation_of
from toolcatalog.mcp_spec import McpServerSpec


def add_arguments(parser: Any) -> None:
    parser.add_argument("--repeat", type=positive, default=50, help="warm calls (and built-in calls) measured")
    parser.add_argument("--cold", type=positive, default=3, help="cold starts measured")
    parser.add_argument("--command", default="", help="the stdio server's executable (default: mcp-server-time)")


def _p50(samples: list[float]) -> float:
    return round(statistics.median(samples), 3)


def run(options: dict[str, Any]) -> dict[str, Any]:
    beside_python = str(Path(sys.executable).parent / "mcp-server-time")
    command = options["command"] or shutil.which("mcp-server-time") or beside_python
    if not Path(command).exists() and not shutil.which(command):
        raise SystemExit(f"bench mcp: {command!r} not found; install the dev extra (mcp-server-time) or pass --command")
    spec = McpServerSpec(name="time", transport="stdio", command=command, timeout_seconds=60)
    arguments = {"timezone": "UTC"}
    connections = McpConnections()
    workspace = Path(tempfile.mkdtemp(prefix="bench-mcp-"))

    def call() -> dict[str, Any]:
        result = connections.call_tool(spec, "get_current_time", arguments, workspace=workspace)
        return observation_of("time", "get_current_time", result)

    cold: list[float] = []
    for _ in range(options["cold"]):
        connections.close()
        started = time.perf_counter()
        assert call()["ok"]
        cold.append((time.perf_counter() - started) * 1000)
    warm: list[float] = []
    for _ in range(options["repeat"]):
        started = time.perf_counter()
        call()
        warm.append((time.perf_counter() - started) * 1000)
    connections.close()
    shutil.rmtree(workspace, ignore_errors=True)

    builtin: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        box = WorkspaceToolBox(Path(directory), approve=lambda name, arguments: True)
        for _ in range(options["repeat"]):
            started = time.perf_counter()
            box.execute("list_dir", {"path": "."})
            builtin.append((time.perf_counter() - started) * 1000)

    return {
        "server": command,
        "repeat": options["repeat"],
        "cold_p50_ms": _p50(cold),
        "warm_p50_ms": _p50(warm),
        "builtin_p50_ms": _p50(builtin),
        "warm_added_ms": round(_p50(warm) - _p50(builtin), 3),
        "cold_over_warm": round(_p50(cold) / _p50(warm), 1),
        "warm_over_builtin": round(_p50(warm) / max(_p50(builtin), 0.001), 1),
        "target": "warm_added_ms < 10",
    }
