"""The catalog-backed ToolBox the agent loop uses (TD-5, TD-6, TD-8, TD-11).

Pure Python: it is handed the run's surface, a way to get the search index, the
function that runs a tool's implementation and the approval gate; it remembers
what it activated so the service can record it at the turn boundary (TD-15).

Loaded tools count against the window's tool budget (LM-2): with `loaded_budget` set
(the tokens the resident block and the name index leave of it), loading a tool past it
first unloads loaded ones back to the name index: those never called (a search loaded
them) before those called, each the least recently used (called or loaded longest ago)
first. A search loads its matches best first while they fit and names the rest. The loop
takes an unloaded tool's `tool_reference` blocks out of what it sends.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Collection, Container, Iterable
from dataclasses import dataclass
from typing import Any

from engine.actions import LOADS_TOOLS
from engine.catalog.ranking import ToolIndex, no_match_message, query_too_long
from engine.catalog.schemas import arguments_problem
from engine.catalog.surface import Surface, ToolRecord
from engine.tokens import estimate_json_tokens
from engine.toolbox import needs_approval

Observation = dict[str, Any]
# Runs a tool's implementation; None when the catalog lists a tool this installation cannot run.
Executor = Callable[[str, dict[str, Any]], Observation | None]
# The approval decision point: None lets the call run, an observation stops it.
ApprovalGate = Callable[[ToolRecord, dict[str, Any]], Observation | None]
# Counts one call of a limited tool against a shared ledger (an MCP session's, say):
# (name, limit) -> None when the call may go ahead, else the refusal, in the ledger's own words.
# A run's own Counter needs none.
CallLimiter = Callable[[str, int], str | None]

DISCOVERY_TOOLS = ("search_tools", "describe_tool", "list_tool_groups")
# Set on an observation when the tool cannot run at all here (no implementation, its MCP server
# unreachable or the tool removed): a deferred tool called directly is then not loaded, so the
# model is not handed the schema of a tool it cannot use.
UNAVAILABLE = "_unavailable"


def approval_pending(tool: ToolRecord, arguments: dict[str, Any]) -> Observation | None:
    """Until the approval flow lands, a tool that needs approval is not run, and the model is told why."""
    return {
        "ok": False,
        "approval_required": True,
        "error": f"{tool.name} needs a person's approval before it runs, and none was given; it did not run.",
    }


@dataclass(frozen=True)
class Activation:
    tool_name: str
    trigger: str  # "direct" or "search"
    query: str = ""


class CatalogToolBox:
    def __init__(
        self,
        *,
        surface: Surface,
        index: Callable[[], ToolIndex],
        executor: Executor,
        approve: ApprovalGate = approval_pending,
        limiter: CallLimiter | None = None,
        auto_approved: Container[str] = (),
        loaded_budget: int | None = None,
    ) -> None:
        self.surface = surface
        # Tokens the loaded (activated deferred) schemas may take together; None: no limit.
        self.loaded_budget = loaded_budget
        self._index = index
        self._executor = executor
        self._approve = approve
        self._limiter = limiter
        self._auto_approved = auto_approved
        self.activated: list[str] = []
        self.activations: list[Activation] = []
        self.misses: list[str] = []
        self.calls: Counter[str] = Counter()
        # When each loaded tool was last called or loaded (a counter), and which were ever called: a tool
        # only loaded (by a search, say) unloads before any tool that was called, each the least recent first.
        self._used: dict[str, int] = {}
        self._called: set[str] = set()
        self._clock = 0
        # Tools unloaded to make room, in order (LM-2).
        self.unloaded: list[str] = []

    # -- what the model is offered ---------------------------------------------------------

    def schemas(self) -> list[dict[str, Any]]:
        # TD-11: the resident block never changes during a run. An activated schema is sent
        # with `defer_loading`, outside the cached prefix; the tool result that activated it
        # carries a tool_reference that loads it there (see `execute`).
        activated = [{**self.surface.admitted[name].definition(), "defer_loading": True} for name in self.activated]
        return [*self.surface.resident_schemas(), *activated]

    def restore_loaded(self, names: list[str], recency: list[str] | None = None, called: Collection[str] = ()) -> None:
        """Offer again the deferred tools earlier turns loaded (their references are in the history).

        Within `loaded_budget`, the last to unload first (the ones `called`, then by `recency`:
        least recent first) until one does not fit: the rule that unloads mid-turn, so a turn
        starts with what the previous one ended with. Offered in `names`' order (as loaded).
        """
        candidates = [name for name in names if name in self.surface.deferred_names and name not in self.activated]
        self._called.update(name for name in called if name in candidates)
        position = {name: index for index, name in enumerate(recency or [])}
        order = sorted(candidates, key=lambda name: (name in self._called, position.get(name, -1)))
        kept: set[str] = set()
        if self.loaded_budget is None:
            kept = set(candidates)
        else:
            room = self.loaded_budget - self.loaded_tokens()
            for name in reversed(order):
                room -= self._schema_tokens(name)
                if room < 0:
                    break
                kept.add(name)
        for name in order:
            if name in kept:
                self._touch(name)
        self.activated.extend(name for name in candidates if name in kept)

    def loaded_tokens(self, names: Iterable[str] | None = None) -> int:
        """What the loaded schemas (or `names`) cost, each estimated as the request sends it."""
        return sum(self._schema_tokens(name) for name in (self.activated if names is None else names))

    def restore_observations(self, observations: dict[int, Observation]) -> None:
        """Observations are the scratchpad layer's business; the catalog keeps none."""

    def preview_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """No references are resolved here."""
        return arguments

    def resident_count(self) -> int:
        """How many leading schemas are the resident block: the tool-block cache breakpoint goes after them (TD-13)."""
        return len(self.surface.resident)

    def requires_approval(self, name: str) -> bool:
        """Whether a call of `name` waits for a person; deferred tools answer too (TD-8)."""
        tool = self.surface.get(name)
        return tool is not None and needs_approval(tool.requires_approval, name, self._auto_approved)

    def _activate(self, name: str, trigger: str, query: str = "", keep: Container[str] = ()) -> bool:
        """Load `name`, unloading the least recently used loaded tools (never those in `keep`) to make room."""
        if name not in self.surface.deferred_names or name in self.activated:
            return False
        if not self._make_room(self._schema_tokens(name), keep):
            return False
        self.activated.append(name)
        self.activations.append(Activation(name, trigger, query))
        self._touch(name)
        return True

    def _make_room(self, tokens: int, keep: Container[str]) -> bool:
        if self.loaded_budget is None:
            return True
        kept = [name for name in self.activated if name in keep]
        if self.loaded_tokens(kept) + tokens > self.loaded_budget:
            return False  # it could not fit even alone beside what must stay: unload nothing for it
        while self.loaded_tokens() + tokens > self.loaded_budget:
            victim = min((n for n in self.activated if n not in keep), key=self._unload_order)
            self.activated.remove(victim)
            self.unloaded.append(victim)
        return True

    def _unload_order(self, name: str) -> tuple[bool, int]:
        return name in self._called, self._used.get(name, 0)

    def _touch(self, name: str) -> None:
        self._clock += 1
        self._used[name] = self._clock

    def _schema_tokens(self, name: str) -> int:
        tool = self.surface.admitted.get(name)
        return estimate_json_tokens(tool.definition()) if tool is not None else 0

    # -- running a call ------------------------------------------------------------------

    def execute_step(self, step: int, name: str, arguments: dict[str, Any]) -> Observation:
        return self.execute(name, arguments)

    def execute(self, name: str, arguments: dict[str, Any]) -> Observation:
        tool = self.surface.get(name)
        if tool is None:
            # TD-8: unknown and mode-denied names answer alike; neither runs. Suggestions come
            # from the admitted names only, so they never reveal what the mode denies.
            close = difflib.get_close_matches(name, list(self.surface.admitted), n=3, cutoff=0.7)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            search = "Use search_tools to find the right tool, or call" if self.surface.get("search_tools") else "Call"
            return {
                "ok": False,
                "error": f"There is no tool named {name!r} on this run's surface.{hint} {search} one from the "
                "tool list or the name index.",
            }
        # TD-5: a deferred name called directly is loaded here, in the same step; its result loads the schema.
        observation = self._run(tool, name, arguments)
        # A call is a use (the history's tool_use block says the same to a later turn's restore).
        self._called.add(name)
        if name in self.activated:
            self._touch(name)
        if observation.pop(UNAVAILABLE, False):
            return observation
        if self._activate(name, "direct", keep={name}):
            return {**observation, LOADS_TOOLS: [name]}
        return observation

    def _run(self, tool: ToolRecord, name: str, arguments: dict[str, Any]) -> Observation:
        if problem := arguments_problem(tool.input_schema, arguments):
            return {"ok": False, "error": f"Invalid arguments for {name}: {problem}", "input_schema": tool.input_schema}
        if tool.max_calls_per_run is not None and self.calls[name] >= tool.max_calls_per_run:
            return {"ok": False, "error": f"{name} may be called at most {tool.max_calls_per_run} times in one run."}
        if self.requires_approval(name) and (refusal := self._approve(tool, arguments)) is not None:
            return refusal
        if (
            tool.max_calls_per_run is not None
            and self._limiter is not None
            and (refused := self._limiter(name, tool.max_calls_per_run)) is not None
        ):
            return {"ok": False, "error": refused}
        self.calls[name] += 1
        if name in DISCOVERY_TOOLS:
            discovery: Callable[[dict[str, Any]], Observation] = getattr(self, f"_{name}")
            return discovery(arguments)
        observation = self._executor(name, arguments)
        if observation is None:
            return {
                "ok": False,
                "error": f"{name} is in the catalog but has no implementation in this installation.",
                UNAVAILABLE: True,
            }
        return observation

    # -- discovery tools -----------------------------------------------------------------

    def _search_tools(self, arguments: dict[str, Any]) -> Observation:
        query = str(arguments.get("query", "")).strip()
        too_long = query_too_long(query)
        if too_long:
            return {"ok": False, "error": too_long}
        limit = int(arguments.get("limit") or 5)
        matches = self._index().search(query, k=limit, allowed=self.surface.admitted)
        if not matches:
            self.misses.append(query)
            return {"ok": True, "query": query, "matches": [], "message": no_match_message(query)}
        loaded: list[str] = []
        for match in matches:
            if self._activate(match.tool.name, "search", query, keep=loaded):
                loaded.append(match.tool.name)
        # The schemas travel as tool_reference blocks (loaded where this result stands) or are
        # already in the request (resident, or loaded earlier): the text only names the matches,
        # so a search stays small and is never offloaded to the scratchpad (TD-6, TD-11).
        observation = {
            "ok": True,
            "query": query,
            "matches": [_summary(match.tool) for match in matches],
            "loaded": loaded,
            "message": "These tools are loaded; call them directly.",
        }
        left = [
            m.tool.name
            for m in matches
            if m.tool.name in self.surface.deferred_names and m.tool.name not in self.activated
        ]
        if left:
            # LM-2: the window's tool budget is full; a call by name still works and loads it in place of an older one.
            observation["not_loaded"] = left
            observation["message"] = (
                "The loaded tools are ready to call. The window has no room for the schemas of "
                f"{', '.join(left)}: call one by name to load it in place of the least recently used tool."
            )
        return {**observation, LOADS_TOOLS: loaded} if loaded else observation

    def _describe_tool(self, arguments: dict[str, Any]) -> Observation:
        found: list[dict[str, Any]] = []
        unknown: list[str] = []
        loaded: list[str] = []
        for name in arguments.get("names", []):
            tool = self.surface.get(name)
            if tool is None:
                unknown.append(name)
                continue
            if self._activate(name, "direct", keep=loaded):
                loaded.append(name)
            found.append(tool.definition())
        observation: Observation = {"ok": not unknown or bool(found), "tools": found}
        if unknown:
            then = " Try search_tools." if self.surface.get("search_tools") else ""
            observation["error"] = f"Not on this run's surface: {', '.join(unknown)}.{then}"
        if loaded:
            observation[LOADS_TOOLS] = loaded
        return observation

    def _list_tool_groups(self, arguments: dict[str, Any]) -> Observation:
        wanted = arguments.get("group")
        groups: dict[str, list[str]] = {}
        for tool in sorted(self.surface.admitted.values(), key=lambda t: (t.group_order, t.group, t.name)):
            if wanted in (None, tool.group):
                groups.setdefault(tool.group, []).append(tool.name)
        if wanted and not groups:
            return {"ok": False, "error": f"No group {wanted!r} on this run's surface.", "groups": []}
        return {"ok": True, "groups": [{"heading": h, "tools": names} for h, names in groups.items()]}


def _summary(tool: ToolRecord) -> dict[str, str]:
    return {"name": tool.name, "group": tool.group, "description": tool.description}


def search_tool_bm25(
    index: ToolIndex, query: str, *, allowed: Container[str] | None = None, limit: int = 5
) -> Observation:
    """The MCP surface's search (TD-7): the same ranking and match descriptions as
    search_tools, but nothing is loaded: MCP clients already hold every schema from
    tools/list, so nothing is activated."""
    matches = index.search(query, k=limit, allowed=allowed)
    if not matches:
        return {"ok": True, "query": query, "matches": [], "message": no_match_message(query)}
    return {
        "ok": True,
        "query": query,
        "matches": [_summary(m.tool) for m in matches],
    }
