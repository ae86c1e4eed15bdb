"""A second stdio MCP server for the import tests.

`get_forecast` collides with the weather server's tool of the same name; `tide.table`
has a name no provider accepts; `--without NAME` leaves a tool out, as a server that
dropped it would.
"""

from __future__ import annotations

import sys

from mcp.server import MCPServer

server = MCPServer("almanac")
without = set(sys.argv[sys.argv.index("--without") + 1 :]) if "--without" in sys.argv else set()


def get_forecast(region: str) -> str:
    """Long-range seasonal forecast for a region from the farmer's almanac."""
    return f"{region}: a mild winter"


def moon_phase(date: str) -> str:
    """Phase of the moon on a date (YYYY-MM-DD)."""
    return f"{date}: waxing gibbous"


def tide_table(port: str) -> str:
    """High and low tides for a port."""
    return f"{port}: high 06:10"


for function, name in [(get_forecast, "get_forecast"), (moon_phase, "moon_phase"), (tide_table, "tide.table")]:
    if name not in without:
        server.tool(name=name)(function)


if __name__ == "__main__":
    server.run()
