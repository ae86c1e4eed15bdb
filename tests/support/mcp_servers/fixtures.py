"""A real uvicorn server running the project's ASGI app, for the MCP tests."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import uvicorn


@pytest.fixture
def workspaces(settings, tmp_path) -> Path:
    settings.CC_WORKSPACE_ROOT = tmp_path / "workspaces"
    return settings.CC_WORKSPACE_ROOT


@pytest.fixture
def server_url(workspaces):
    from controlcenter.asgi import application

    config = uvicorn.Config(application, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(10)
