"""There is no Docker engine here: parse the deployment files and check what they name exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from controlcenter.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_web_worker_postgres_redis_with_healthchecks_and_a_database_volume():
    compose = _compose()
    services = compose["services"]
    assert set(services) >= {"web", "worker", "postgres", "redis"}
    for name in ("web", "worker", "postgres", "redis"):
        assert "test" in services[name]["healthcheck"], name
    assert any(volume.startswith("pgdata:") for volume in services["postgres"]["volumes"])
    assert "pgdata" in compose["volumes"]
    for name in ("web", "worker"):
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == depends["redis"]["condition"] == "service_healthy"
    # A worker restarted as compose does it (SIGTERM, then SIGKILL) gets time to finish its tool calls.
    assert services["worker"]["stop_grace_period"] == "2m"


def test_compose_commands_are_real_cli_commands():
    parser = build_parser()
    services = _compose()["services"]
    worker_args = services["worker"]["command"][1:]
    assert parser.parse_args(worker_args).command == "worker"
    web_shell = services["web"]["command"][-1]
    for invocation in re.findall(r"controlcenter ([^&]+)", web_shell):
        args = invocation.split()
        if args[0] == "manage":
            listed = subprocess.run(
                [sys.executable, "manage.py", "help", args[1]], cwd=ROOT, capture_output=True, text=True
            )
            assert listed.returncode == 0, listed.stderr
        else:
            assert parser.parse_args(args).command == args[0]


def test_dockerfile_copies_every_app_and_runs_the_cli():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for folder in (
        "controlcenter",
        "engine",
        "agents",
        "conversations",
        "scratchpad",
        "toolcatalog",
        "templates",
        "static",
    ):
        assert f"COPY {folder} " in dockerfile and (ROOT / folder).is_dir(), folder
    assert '"controlcenter", "serve"' in dockerfile
