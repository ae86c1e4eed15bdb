"""Large observations in the pure core: offload, references, scratchpad_read (SP-1, SP-7, SP-9).

`ScratchpadToolBox` wraps any ToolBox. For every tool call it resolves
`{{stepN.field}}` references from the full observations of the turn, runs the
tool, and hands an observation larger than the threshold to an `ObservationStore`,
which keeps it and returns the synthetic observation the model sees instead. It also
offers and runs `scratchpad_read` while the turn has live entries. The store is a
protocol: the Django-backed one lives in `scratchpad/store.py`.

Step N is the turn's N-th tool call, numbered by the loop (`execute_step`), so
`{{step2.content}}` is the observation of the second call whatever happened to it.

Deferred tools a call loaded (`LOADS_TOOLS`, TD-11) stay on the observation the model
sees, offloaded or not, so its tool_result still carries their tool_reference blocks.
"""

from __future__ import annotations

from typing import Any, Protocol

from engine.actions import ATTACHED_IMAGES, LOADS_TOOLS, storable, without_loads
from engine.scratchpad import read_tool as scratchpad_tool
from engine.scratchpad.offload import jsonable_observation, needs_offload
from engine.scratchpad.references import UnresolvableReference, has_references, resolve
from engine.toolbox import ToolBox, ToolBoxLayer


class ObservationStore(Protocol):
    def has_live_entries(self) -> bool:
        """Whether the turn can read anything (its own entries or pinned ones)."""
        ...

    def offload(self, *, step: int, tool: str, observation: dict[str, Any]) -> dict[str, Any]:
        """Keep the full observation; return the synthetic one for the history (SP-3).

        With no room to keep it (the owner's quota), the observation returned has no
        `scratchpad_id`: the summary and a note that says why.
        """
        ...

    def full_observation(self, entry_id: str) -> Any:
        """The stored observation as the tool returned it; KeyError once it is gone."""
        ...

    def read(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Run `scratchpad_read` in the turn's scope."""
        ...


class ScratchpadToolBox(ToolBoxLayer):
    def __init__(self, inner: ToolBox, store: ObservationStore, *, threshold: int) -> None:
        super().__init__(inner)
        self.store = store
        self.threshold = threshold
        # step -> the inline observation, or the id of the entry holding it.
        self._inline: dict[int, Any] = {}
        self._offloaded: dict[int, str] = {}
        self._last_step = 0

    def schemas(self) -> list[dict[str, Any]]:
        schemas = [schema for schema in self.inner.schemas() if schema.get("name") != scratchpad_tool.NAME]
        if self.store.has_live_entries():
            schemas.append(scratchpad_tool.SCHEMA)
        return schemas

    def resident_count(self) -> int | None:
        # scratchpad_read (offered while entries are live) and whatever inner layers append
        # close the cached block with the resident tools, as they always have.
        return None

    def execute(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.execute_step(self._last_step + 1, name, arguments)

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self._last_step = max(self._last_step, step)
        if name == scratchpad_tool.NAME:
            # Reads are not offloaded again: their size is capped by the read itself,
            # and an oversized request is an error that says how to ask for less.
            return self._keep(step, self.store.read(arguments))
        if has_references(arguments):
            try:
                arguments = resolve(arguments, self._lookup)
            except UnresolvableReference as exc:
                return self._keep(step, {"ok": False, "error": f"{name} was not run: {exc}"})
        raw = self.inner.execute(name, arguments)
        observation = storable(raw)
        # What goes to the scratchpad keeps a field that is not UTF-8 (bytes escaped as lone
        # surrogates) as those exact bytes, a binary entry (SP-2, SP-5); only NULs in text change.
        stored = without_loads(storable(raw, keep_undecodable=True))
        # Loaded schemas and attached images travel beside the text, offloaded or not: the
        # model sees an image itself, so its bytes do not count towards the threshold.
        beside = {key: observation[key] for key in (LOADS_TOOLS, ATTACHED_IMAGES) if observation.get(key)}
        if needs_offload(stored, self.threshold):
            synthetic = self.store.offload(step=step, tool=name, observation=stored)
            entry_id = synthetic.get("scratchpad_id")
            if isinstance(entry_id, str):
                self._offloaded[step] = entry_id
            else:
                # Not stored (its owner's scratchpad is full): references see what the model saw.
                self._inline[step] = synthetic
            # The fields left beside the entry go to the history as text, like any observation.
            shown: dict[str, Any] = storable({**synthetic, **beside})
            return shown
        return self._keep(step, observation)

    def restore_observations(self, observations: dict[int, dict[str, Any]]) -> None:
        # A resumed turn has a new toolbox: what the model saw of each earlier call is in the
        # paused messages; an offloaded one is read back from the scratchpad when referenced.
        for step, observation in observations.items():
            entry_id = observation.get("scratchpad_id")
            if isinstance(entry_id, str) and "_note" in observation and "size_bytes" in observation:
                self._offloaded[step] = entry_id
            else:
                self._inline[step] = observation
            self._last_step = max(self._last_step, step)
        self.inner.restore_observations(observations)

    def preview_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if not has_references(arguments):
            return self.inner.preview_arguments(arguments)
        try:
            resolved = resolve(arguments, self._lookup)
        except UnresolvableReference:
            return arguments  # the call will fail with that error; the person sees what was asked
        return self.inner.preview_arguments(resolved)

    def _keep(self, step: int, observation: dict[str, Any]) -> dict[str, Any]:
        self._inline[step] = observation
        # The history is JSON: bytes in a small observation travel as base64 text.
        return jsonable_observation(observation) if _has_bytes(observation) else observation

    def _lookup(self, step: int) -> Any:
        if step in self._inline:
            return self._inline[step]
        if step in self._offloaded:
            entry_id = self._offloaded[step]
            try:
                return self.store.full_observation(entry_id)
            except KeyError:
                raise KeyError(f"the observation of step {step} ({entry_id}) has expired from the scratchpad") from None
        done = f"steps so far: 1..{self._last_step - 1}" if self._last_step > 1 else "no earlier step in this turn"
        raise KeyError(f"step {step} does not exist ({done})")


def _has_bytes(value: Any) -> bool:
    if isinstance(value, bytes | bytearray):
        return True
    if isinstance(value, dict):
        return any(_has_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(_has_bytes(item) for item in value)
    return False
