"""A stdio MCP server whose tools/list never ends: every page names the same next cursor. Written by
hand, as a broken server would be; an import must refuse it, not cut its list short."""

from __future__ import annotations

import json
import sys


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    ident, method = request.get("id"), request.get("method")
    if method == "initialize":
        version = request["params"]["protocolVersion"]
        info = {"name": "looping", "version": "1"}
        result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
        send({"jsonrpc": "2.0", "id": ident, "result": result})
    elif method == "tools/list":
        page = {"tools": [{"name": "again", "inputSchema": {"type": "object"}}], "nextCursor": "again"}
        send({"jsonrpc": "2.0", "id": ident, "result": page})
    elif ident is not None:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"Method not found: {method}"}})
