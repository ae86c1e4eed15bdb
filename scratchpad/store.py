"""The Django-backed ObservationStore for one run (one turn)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from engine.observations import ScratchpadToolBox
from engine.scratchpad.read_tool import run_read
from engine.toolbox import ToolBox
from scratchpad import selectors, services


class DjangoObservationStore:
    def __init__(
        self,
        *,
        turn_id: str,
        run_id: int | None = None,
        conversation_id: int | None = None,
        threshold: int | None = None,
        clock: Callable[[], datetime] = timezone.now,
    ) -> None:
        self.turn_id = str(turn_id)
        self.run_id = run_id
        self.conversation_id = conversation_id
        self.threshold = settings.SCRATCHPAD_THRESHOLD_BYTES if threshold is None else threshold
        self.clock = clock

    def has_live_entries(self) -> bool:
        return selectors.entries_visible_to_turn(
            turn_id=self.turn_id, conversation_id=self.conversation_id, now=self.clock()
        ).exists()

    def offload(self, *, step: int, tool: str, observation: dict[str, Any]) -> dict[str, Any]:
        _entry, synthetic = services.put_observation(
            turn_id=self.turn_id,
            step_num=step,
            executor_name=tool,
            observation=observation,
            threshold=self.threshold,
            run_id=self.run_id,
            conversation_id=self.conversation_id,
            now=self.clock(),
        )
        return synthetic

    def full_observation(self, entry_id: str) -> Any:
        entry = selectors.entry_for_turn(
            entry_id=entry_id, turn_id=self.turn_id, conversation_id=self.conversation_id, now=self.clock()
        )
        if entry is None:
            raise KeyError(entry_id)
        return services.full_observation(entry)

    def read(self, arguments: dict[str, Any]) -> dict[str, Any]:
        entry_id = arguments.get("scratchpad_id") if isinstance(arguments, dict) else None
        if not isinstance(arguments, dict) or not isinstance(entry_id, str):
            return run_read(arguments, lambda _id: None)
        return services.read(
            entry_id=entry_id,
            turn_id=self.turn_id,
            arguments=arguments,
            conversation_id=self.conversation_id,
            now=self.clock(),
        )


def turn_toolbox(
    *,
    inner: ToolBox,
    run_id: int,
    conversation_id: int,
    turn_id: str | None = None,
    clock: Callable[[], datetime] = timezone.now,
) -> ScratchpadToolBox:
    """The tools of one run, with the scratchpad in front of them (SP-1, SP-7, SP-9).

    `turn_id` scopes the entries (default: the run); a subagent has its own under its parent run.
    """
    turn = str(run_id) if turn_id is None else turn_id
    store = DjangoObservationStore(turn_id=turn, run_id=run_id, conversation_id=conversation_id, clock=clock)
    return ScratchpadToolBox(inner, store, threshold=store.threshold)
