"""What the agent loop talks to: one ToolBox protocol, and the base of every layer stacked over it.

A run's toolbox is a stack, outermost first: approvals (which calls wait for a person),
scratchpad (offload, `scratchpad_read`, `{{stepN.field}}` references), subagents
(`spawn_agents`), catalog (resident set, deferred activation, implementations). Each
layer overrides what it changes and forwards the rest explicitly, so every method the
loop may call is declared here and nothing passes through unseen.
"""

from __future__ import annotations

from collections.abc import Collection, Container
from typing import Any, Protocol

Observation = dict[str, Any]


class ToolBox(Protocol):
    def schemas(self) -> list[dict[str, Any]]:
        """Tool definitions to offer the model on the next request."""
        ...

    def execute(self, name: str, arguments: dict[str, Any]) -> Observation:
        """Run a tool outside a numbered step; failures are observations, not exceptions."""
        ...

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> Observation:
        """Run the turn's `step`-th tool call (numbered for `{{stepN.field}}` references, SP-9)."""
        ...

    def requires_approval(self, name: str) -> bool:
        """Whether a call of `name` waits for a person before it runs (RN-4)."""
        ...

    def resident_count(self) -> int | None:
        """How many leading schemas form the cached resident block (the tools breakpoint, TD-13);
        None when the last schema not marked `defer_loading` closes it."""
        ...

    def restore_loaded(self, names: list[str], recency: list[str] | None = None, called: Collection[str] = ()) -> None:
        """Offer again the deferred tools that `tool_reference` blocks in the history loaded (TD-11);
        `recency` orders the tools the history used, least recently first, and `called` names the
        ones it called, for a budget of loaded tools (LM-2). A tool not offered again has its
        references taken out by the loop."""
        ...

    def restore_observations(self, observations: dict[int, Observation]) -> None:
        """The observations of the turn's earlier calls, by step, when a paused turn resumes (SP-9)."""
        ...

    def preview_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments a call would really receive now (`{{stepN.field}}` resolved, SP-9), for
        the approval prompt; unchanged where nothing resolves."""
        ...


def needs_approval(requires_approval: bool, name: str, auto_approved: Container[str]) -> bool:
    """The one approval rule (RN-4): a tool flagged as requiring approval waits for a person,
    unless the operator listed it as auto-approved (CC_TOOL_AUTO_APPROVE)."""
    return requires_approval and name not in auto_approved


class ToolBoxLayer:
    """A layer over `inner`: forwards every method of the protocol; subclasses override what they change."""

    def __init__(self, inner: ToolBox) -> None:
        self.inner = inner

    def schemas(self) -> list[dict[str, Any]]:
        return self.inner.schemas()

    def execute(self, name: str, arguments: dict[str, Any]) -> Observation:
        return self.inner.execute(name, arguments)

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> Observation:
        return self.inner.execute_step(step, name, arguments)

    def requires_approval(self, name: str) -> bool:
        return self.inner.requires_approval(name)

    def resident_count(self) -> int | None:
        return self.inner.resident_count()

    def restore_loaded(self, names: list[str], recency: list[str] | None = None, called: Collection[str] = ()) -> None:
        self.inner.restore_loaded(names, recency, called)

    def restore_observations(self, observations: dict[int, Observation]) -> None:
        self.inner.restore_observations(observations)

    def preview_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.inner.preview_arguments(arguments)
