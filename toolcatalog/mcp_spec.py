"""What the catalog knows of an MCP server and of the tools it lists, without the MCP SDK.

The SDK (`mcp`, `mcp_types`, httpx2) costs about 0.7 s of CPU to import. Every process that loads
the catalog's services would pay it at start (each Celery worker, each management command), and
only the ones that connect to a server need it: they import `mcp_import` or `mcp_client`, which
hold the SDK; everything else names servers and tools through this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_TIMEOUT_SECONDS = 30.0


class McpImportError(Exception):
    """The server could not be reached or did not answer tools/list; the message says why."""


@dataclass(frozen=True)
class McpServerSpec:
    """How to reach one MCP server. `stdio`: `command` + `args`; `http`: `url` (+ `headers`)."""

    name: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    # stdio: outbound network for the sandboxed server (its config's `network: true`).
    network: bool = False


@dataclass(frozen=True)
class ImportedTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    server: str
