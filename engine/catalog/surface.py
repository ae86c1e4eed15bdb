"""A run's tool surface: mode filter first, deferral second (TD-2, TD-4, TD-8, TD-10).

Pure Python. The caller hands in plain tool records, the mode and the deferral
flag; the result says which schemas go into every request (resident), which names
are only listed in the grouped index (deferred), and the index text itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

INDEX_HEADER = "Deferred tools (call one by name, or find one with search_tools):"
# A mode that does not admit search_tools: the index never sends the model to a tool it lacks (QA).
INDEX_HEADER_NO_SEARCH = "Deferred tools (call one by name):"
SEARCH_TOOL = "search_tools"


@dataclass(frozen=True)
class ToolRecord:
    name: str  # qualified: MCP tools carry their server's prefix
    group: str
    description: str
    input_schema: dict[str, Any]
    resident: bool = False
    requires_approval: bool = False
    max_calls_per_run: int | None = None
    group_order: int = 0
    source: str = "built-in"
    side_effects: str = ""  # "none" marks a read-only tool (the MCP listing's read_only_hint)

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    @property
    def sort_key(self) -> str:
        # By name, as the built-in toolbox always sent them: with deferral off the
        # tool block is byte-identical to a server without deferral (TD-10).
        return self.name


@dataclass(frozen=True)
class ModeSpec:
    name: str = "default"
    allow: tuple[str, ...] = ("*",)
    deny: tuple[str, ...] = ()
    output_action: str | None = None
    # The mode's own changes to the catalog's resident flags (TS-3): names made resident,
    # names made deferred. Deferral only: with deferral off every admitted tool is resident.
    resident_add: frozenset[str] = frozenset()
    resident_remove: frozenset[str] = frozenset()

    def with_resident(self, add: Iterable[str] = (), remove: Iterable[str] = ()) -> ModeSpec:
        """This mode with more names made resident (`add`) or deferred (`remove`); the latest word wins."""
        add, remove = frozenset(add), frozenset(remove)
        return replace(
            self,
            resident_add=(self.resident_add | add) - remove,
            resident_remove=(self.resident_remove | remove) - add,
        )

    def resident(self, tool: ToolRecord) -> bool:
        if tool.name == self.output_action:
            return True
        return (tool.resident or tool.name in self.resident_add) and tool.name not in self.resident_remove

    def admits(self, tool_name: str) -> bool:
        # The output action is what the mode exists to call; it is admitted by definition.
        if tool_name == self.output_action:
            return True
        if any(fnmatchcase(tool_name, pattern) for pattern in self.deny):
            return False
        return any(fnmatchcase(tool_name, pattern) for pattern in self.allow)


@dataclass(frozen=True)
class Surface:
    mode: ModeSpec
    deferral: bool
    resident: tuple[ToolRecord, ...]
    deferred: tuple[ToolRecord, ...]
    index_text: str
    admitted: dict[str, ToolRecord] = field(repr=False, default_factory=dict)

    @property
    def deferred_names(self) -> frozenset[str]:
        return frozenset(tool.name for tool in self.deferred)

    def resident_schemas(self) -> list[dict[str, Any]]:
        return [tool.definition() for tool in self.resident]

    def system_blocks(self) -> list[dict[str, Any]]:
        """The name index as a system block; nothing at all when no tool is deferred (TD-10)."""
        return [{"type": "text", "text": self.index_text}] if self.index_text else []

    def get(self, name: str) -> ToolRecord | None:
        return self.admitted.get(name)


def build_surface(
    records: Iterable[ToolRecord], mode: ModeSpec, *, deferral: bool, unindexed: frozenset[str] = frozenset()
) -> Surface:
    """`unindexed`: deferred names left out of the name index (tools added to the catalog after a
    conversation began, MC-4); they are admitted, so search_tools finds and activates them."""
    # TD-8: the mode decides what exists for this run; deferral only decides how it is shown.
    admitted = sorted((tool for tool in records if mode.admits(tool.name)), key=lambda tool: tool.sort_key)
    if not deferral:
        # Without deferral every admitted tool is resident; one added mid-conversation would
        # change the prefix, so it waits for the next conversation.
        admitted = [tool for tool in admitted if tool.name not in unindexed]
        return Surface(mode, False, tuple(admitted), (), "", {tool.name: tool for tool in admitted})
    resident = tuple(tool for tool in admitted if mode.resident(tool) and tool.name not in unindexed)
    resident_names = {tool.name for tool in resident}
    deferred = tuple(tool for tool in admitted if tool.name not in resident_names)
    searchable = any(tool.name == SEARCH_TOOL for tool in admitted)
    index = name_index((tool for tool in deferred if tool.name not in unindexed), searchable=searchable)
    return Surface(mode, True, resident, deferred, index, {tool.name: tool for tool in admitted})


def name_index(deferred: Iterable[ToolRecord], *, searchable: bool = True) -> str:
    """Deferred names grouped under their headings (TD-2): a few hundred tokens for a whole catalog.

    Names are separated by single spaces (a snake_case name has none of its own): a comma
    each was a fifth of a token per name on every request. Every name stays whole, as the
    model must call it; folding shared prefixes (`git_{blame,branch}`) would save more, but
    a name the model has to rebuild is one it can get wrong.
    """
    groups: dict[tuple[int, str], list[str]] = {}
    for tool in deferred:
        groups.setdefault((tool.group_order, tool.group), []).append(tool.name)
    if not groups:
        return ""
    lines = [INDEX_HEADER if searchable else INDEX_HEADER_NO_SEARCH]
    for (_, heading), names in sorted(groups.items()):
        lines.append(f"{heading}: {' '.join(sorted(names))}")
    return "\n".join(lines)
