"""AR-1: the engine imports no Django piece and the apps form a DAG, as import-linter reads the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.req("AR-1")
def test_the_engine_is_pure_and_the_apps_import_only_downwards():
    checked = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))], cwd=ROOT, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 kept, 0 broken" in checked.stdout
