"""A small stdio MCP server for the import tests: two tools, one with a name our built-ins also use."""

from __future__ import annotations

from mcp.server import MCPServer

server = MCPServer("weather")


@server.tool()
def get_forecast(city: str, days: int = 3) -> str:
    """Weather forecast for a city, day by day."""
    return f"{city}: sunny for {days} days"


@server.tool()
def read_file(path: str) -> str:
    """Read a file from the weather station's archive."""
    return f"archive {path}"


if __name__ == "__main__":
    server.run()
