"""An MCP server that logs every call, for the forwarding tests (MC-2, MC-4).

stdio by default; `--http PORT --token TOKEN` serves Streamable HTTP and refuses any request
without `Authorization: Bearer TOKEN`. Every call appends one JSON line to $PROBE_CALL_LOG
(relative: to the working directory, the workspace of a sandboxed server) with the tool, its
arguments and this process's `instance` (a random id: inside the sandbox every server is pid 2).
`--tag TAG` is ignored: it marks the process's command line for the lifetime tests.
`--die-at-start SIGNAL` writes an error to stderr and dies by that signal before serving.
`--extra-tools FILE` names more tools (a JSON list), as an upgrade of the server would add them.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context, Image
from mcp.server.mcpserver.exceptions import ToolError

# A 1x1 red PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)

server = MCPServer("probe")
INSTANCE = os.urandom(6).hex()
EXTRA_TOOLS: Path | None = None


def _log(tool: str, arguments: dict) -> None:
    path = os.environ.get("PROBE_CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"tool": tool, "arguments": arguments, "instance": INSTANCE}) + "\n")


@server.tool()
def echo(text: str) -> str:
    """Repeat the text back, prefixed with echo:."""
    _log("echo", {"text": text})
    return f"echo: {text}"


@server.tool()
def whoami() -> dict:
    """This server's process id and how long the secret it was given is."""
    _log("whoami", {})
    return {"instance": INSTANCE, "secret_length": len(os.environ.get("PROBE_SECRET", ""))}


@server.tool()
def peek(paths: list[str]) -> dict:
    """What this process can see: each path's first bytes or the error, its parent's environment,
    its own environment's names, its network interfaces and whether 127.0.0.1:PORT answers."""
    _log("peek", {"paths": paths})

    def read(path: str) -> str:
        try:
            with open(path, "rb") as file:
                return "read: " + file.read(200).decode(errors="replace")
        except OSError as exc:
            return f"refused: {exc.strerror}"

    def connect(port: int) -> str:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return "connected"
        except OSError as exc:
            return f"refused: {exc}"

    with open("/proc/net/dev", encoding="utf-8") as dev:
        interfaces = sorted(line.split(":")[0].strip() for line in dev.readlines()[2:])
    return {
        "files": {path: read(path) for path in paths},
        "parent_environ": read(f"/proc/{os.getppid()}/environ"),
        "init_environ": read("/proc/1/environ"),
        "env": sorted(os.environ),
        "cwd": str(Path.cwd()),
        "interfaces": interfaces,
        "postgres": connect(5432),
        "redis": connect(6379),
    }


@server.tool()
def detach(tag: str) -> str:
    """Start a process in a session of its own that would outlive this server if nothing stopped it."""
    _log("detach", {"tag": tag})
    subprocess.Popen(["/bin/sh", "-c", f"sleep 4747; : {tag}"], start_new_session=True)  # noqa: S603
    return "detached"


@server.tool()
def picture() -> Image:
    """A one-pixel PNG."""
    _log("picture", {})
    return Image(data=PIXEL, format="png")


@server.tool()
def drawings() -> list:
    """An SVG, a PNG labelled image/jpeg, an image that is no image, and the PNG again."""
    _log("drawings", {})
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'
    return [
        Image(data=svg, format="svg+xml"),
        Image(data=PIXEL, format="jpeg"),
        Image(data=b"not an image", format="png"),
        "drawn",
    ]


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the given reason."""
    _log("fail", {"reason": reason})
    # As real servers log their errors: a later failure must not quote this one.
    sys.stderr.write(f"fail: {reason}\n")
    sys.stderr.flush()
    raise ToolError(f"refused on purpose: {reason}")


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after the given number of seconds."""
    _log("slow", {"seconds": seconds})
    await anyio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def crash() -> str:
    """Kill this server process."""
    _log("crash", {})
    sys.stderr.write("crash: giving up\n")
    sys.stderr.flush()
    os._exit(3)


def _add(name: str) -> None:
    def added() -> str:
        return f"{name} answers"

    if name not in {tool.name for tool in server._tool_manager.list_tools()}:
        server.add_tool(added, name=name, description=f"A tool added at run time: {name}.")


def _add_installed() -> None:
    """The tools of `--extra-tools FILE` (a JSON list of names): what an upgrade of the server adds."""
    if EXTRA_TOOLS is not None and EXTRA_TOOLS.exists():
        for name in json.loads(EXTRA_TOOLS.read_text()):
            _add(name)


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool named NAME to this process alone, take the installed extra tools, and tell the
    client that the tool list changed."""
    _log("grow", {"name": name})
    _add(name)
    _add_installed()
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


def _http(port: int, token: str) -> None:
    import uvicorn

    app = server.streamable_http_app()

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"bad token"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=0)
    parser.add_argument("--token", default="")
    parser.add_argument("--without", nargs="*", default=[])
    parser.add_argument("--tag", default="")
    parser.add_argument("--v2", action="store_true", help="a new version: echo's schema changed, a tool added")
    parser.add_argument("--die-at-start", default="", help="a signal name: die by it before serving")
    parser.add_argument("--extra-tools", type=Path, help="a JSON list of tool names this installation adds")
    options = parser.parse_args()
    EXTRA_TOOLS = options.extra_tools
    _add_installed()
    if options.die_at_start:
        # The secret the server was given, printed as a careless server's start-up error would.
        sys.stderr.write(f"cannot start: bad token {os.environ.get('PROBE_SECRET', '')}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), getattr(signal, options.die_at_start))
    for name in options.without:
        server.remove_tool(name)
    if options.v2:

        def echo_v2(text: str, times: int = 1) -> str:
            _log("echo", {"text": text, "times": times})
            return " ".join([f"echo: {text}"] * times)

        def novel() -> str:
            return "new in v2"

        server.remove_tool("echo")
        server.add_tool(echo_v2, name="echo", description="Repeat the text back, TIMES times (v2).")
        server.add_tool(novel, name="novel", description="A tool version 2 added.")
    if options.http:
        _http(options.http, options.token)
    else:
        server.run()
    sys.exit(0)
