"""The local model's supervisor and provider when the server cannot start or goes away (LM-1):
a file that is not a model, a port another program holds, a server being restarted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlcenter.stack import free_port

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
