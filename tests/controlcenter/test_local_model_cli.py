"""`controlcenter local-model` as a user runs it (LM-1): the console script on a free port, an
answer from its OpenAI-compatible endpoint, and a clean stop that leaves no llama.cpp process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from controlcenter.localmodel import MODEL_ALIAS, server_ready
from controlcenter.stack import free_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # The command name is in parentheses and may hold spaces: the fields after it are fixed.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.req("LM-1")
@pytest.mark.timeout(300)
def test_the_local_model_command_answers_on_its_port_and_stops_without_an_orphan(tmp_path):
    port = free_port()
    # Its own temporary folder: the one-server-per-host lock and the log are named after the port there.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "CC_LOCAL_MODEL_THREADS": "2"}
    script = Path(sys.executable).parent / "controlcenter"
    cli = subprocess.Popen(
        [str(script), "local-model", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until(lambda: cli.poll() is not None or server_ready(base_url), timeout=240, what="the local model")
        assert cli.poll() is None, cli.stdout.read() if cli.stdout else ""
        reply = httpx.post(
            f"{base_url}/chat/completions",
            json={"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
        servers = _children(cli.pid)
        assert servers, "the command's llama.cpp server is not its child"
    finally:
        cli.send_signal(signal.SIGTERM)
        output, _ = cli.communicate(timeout=60)
    assert cli.returncode == 0, output
    assert f"on {base_url}" in output
    for pid in servers:
        wait_until(lambda pid=pid: _gone(pid), timeout=20, what=f"llama.cpp server {pid} to exit")
    assert not server_ready(base_url)
