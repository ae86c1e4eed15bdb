"""A scripted session through real runs, for the benches that need one (`cache`, `small_window`).

Imports a catalog into the database the command runs against (the scratch database
`manage.py bench` makes for benches that write, so never the operator's), starts an
`EmulatorServer` around the bench's emulator and a Celery worker on a queue of its own whose
Anthropic adapter points at it, and opens a conversation for a user made for the bench. On the
way out the worker stops; what the session wrote goes with the scratch database.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from engine.emulator import Emulator
from engine.emulator.server import EmulatorServer

MODEL = "claude-sonnet-4-5"


@dataclass
class Session:
    conversation: Any
    timeout: float

    def turn(self, text: str) -> Any:
        """Send `text` as the user and wait for the run it starts to finish; returns that run."""
        from agents.chat import message_send

        run = message_send(conversation=self.conversation, text=text).run
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.is_finished:
                return run
            time.sleep(0.05)
        raise SystemExit(f"run {run.pk} did not finish within {self.timeout}s (still {run.status})")


@contextmanager
def emulated_session(
    *,
    bench: str,
    emulator: Emulator,
    catalog: str,
    workspace: Callable[[Path], None],
    timeout: float,
    env: dict[str, str] | None = None,
    concurrency: int = 1,
) -> Iterator[Session]:
    """A conversation whose turns run on a worker started for `bench`, against `emulator` over HTTP.

    `workspace` fills the conversation's workspace; `env` adds to the worker's environment.
    """
    from django.contrib.auth import get_user_model
    from django.db import connection

    from controlcenter.processes import WorkerProcess, services_env
    from conversations.services import conversation_create
    from toolcatalog.services import catalog_import
    from toolcatalog.workspace import workspace_root

    if settings.CC_MODE != "services":
        raise SystemExit(f"bench {bench} needs DATABASE_URL and REDIS_URL: it runs its turns on a Celery worker")
    catalog_import(text=Path(catalog).read_text(encoding="utf-8"))
    tag = f"bench-{bench}-{uuid.uuid4().hex[:8]}"
    user, _ = get_user_model().objects.get_or_create(username=tag)
    with tempfile.TemporaryDirectory() as folder, EmulatorServer(emulator) as server:
        settings.CC_WORKSPACE_ROOT = Path(folder)
        # What the runs are created with (run_start takes the model and its provider from CC_MODELS).
        settings.CC_PROVIDER, settings.CC_MODEL, settings.CC_MODELS = "anthropic", MODEL, {MODEL: "anthropic"}
        settings.CC_RUN_QUEUE = tag
        worker_env = services_env(connection.settings_dict["NAME"])
        worker_env.update(
            ANTHROPIC_API_KEY="bench", ANTHROPIC_BASE_URL=server.base_url, CC_WORKSPACE_ROOT=folder,
            CC_RUN_QUEUE=tag, CC_SERVER_TOOL_DEFERRAL="on", **(env or {}),
        )  # fmt: skip
        worker = WorkerProcess(worker_env, f"{tag}@%h", Path(folder) / "worker.log", concurrency=concurrency)
        try:
            # A loaded machine can take a while to start Celery; the bench measures turns, not this.
            worker.wait_ready(timeout=120)
            conversation = conversation_create(owner=user, title=f"bench {bench}")
            workspace(workspace_root(conversation.pk))
            yield Session(conversation, timeout)
        finally:
            worker.stop()
