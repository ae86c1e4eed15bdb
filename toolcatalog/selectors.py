"""Reads of the tool catalog: plain records for the pure core, the run surface, the Context view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from engine.catalog.fit import fit_to_window, tool_block_tokens
from engine.catalog.pins import pinned_records
from engine.catalog.surface import ModeSpec, Surface, ToolRecord, build_surface
from engine.catalog.toolbox import DISCOVERY_TOOLS, CatalogToolBox
from engine.scratchpad.read_tool import SCHEMA as READ_TOOL_SCHEMA
from engine.tokens import estimate_json_tokens, estimate_text_tokens
from toolcatalog.builtins import builtin_records
from toolcatalog.models import McpServer, Mode, Tool, ToolGroup

DEFAULT_MODE = "default"


def tools_enabled() -> QuerySet[Tool]:
    return (
        Tool.objects.filter(enabled=True)
        .filter(Q(server__isnull=True) | Q(server__enabled=True))
        .select_related("group", "server")
    )


def tool_record(tool: Tool) -> ToolRecord:
    return ToolRecord(
        name=tool.qualified_name,
        group=tool.group.heading,
        description=tool.description,
        input_schema=tool.input_schema,
        resident=tool.resident,
        requires_approval=tool.requires_approval,
        max_calls_per_run=tool.max_calls_per_run,
        group_order=tool.group.order,
        source=tool.source,
        side_effects=tool.side_effects,
    )


def catalog_records() -> list[ToolRecord]:
    records = [tool_record(tool) for tool in tools_enabled()]
    if records:
        return records
    # A fresh installation has an empty catalog; its built-in tools still work.
    return builtin_records()


def mode_spec(mode: Mode | None) -> ModeSpec:
    if mode is None:
        mode = Mode.objects.filter(name=DEFAULT_MODE).first()
    if mode is None:
        return ModeSpec()
    return ModeSpec(
        name=mode.name,
        allow=tuple(mode.allow),
        deny=tuple(mode.deny),
        output_action=mode.output_action or None,
        resident_add=frozenset(mode.resident_add),
        resident_remove=frozenset(mode.resident_remove),
    )


def run_surface(
    *, mode: Mode | None = None, deferral: bool | None = None, pins: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[Surface, list[ToolRecord]]:
    """The surface a run gets: the one code path for runs, the Context view and benchmarks (TD-15).

    `pins`: the imported tools as the conversation first saw them (MC-4); None outside a conversation.
    """
    records = catalog_records()
    deferral = settings.CC_SERVER_TOOL_DEFERRAL if deferral is None else deferral
    unindexed: frozenset[str] = frozenset()
    if pins is not None:
        records, unindexed = pinned_records(records, pins)
    return build_surface(records, mode_spec(mode), deferral=deferral, unindexed=unindexed), records


def fit_surface_to_window(
    catalog: CatalogToolBox, offered: list[dict[str, Any]], *, uses: Mapping[str, int] | None = None
) -> None:
    """LM-2: the tools every request carries, the ones it loads included, keep to CC_TOOL_WINDOW_PERCENT
    of the window.

    `offered` is what the whole toolbox stack offers: the runtime's own tools (spawn_agents,
    scratchpad_read, which is reserved for even before it is offered, so the surface stays the
    same all turn) come out of the same budget. So do the deferred tools a run loads: the
    resident block and the name index keep to the budget less a reserve for them (a quarter, at
    least the largest schema, so any one tool can be loaded), the least used catalog tools deferred
    (`uses`: call counts; default the latest ones, `tool_use_counts`). What the block leaves is the
    catalog's `loaded_budget`: a load past it unloads the least recently used loaded tools.
    """
    budget = settings.CC_CONTEXT_WINDOW_TOKENS * settings.CC_TOOL_WINDOW_PERCENT // 100
    surface = catalog.surface
    runtime = {s["name"]: s for s in [*offered, READ_TOOL_SCHEMA] if s["name"] not in surface.admitted}
    budget -= estimate_json_tokens(list(runtime.values())) if runtime else 0
    if not surface.deferral:
        return  # nothing is deferred, so nothing is loaded
    largest = max((estimate_json_tokens(tool.definition()) for tool in surface.admitted.values()), default=0)
    resident_budget = budget - max(budget // 4, largest)
    if tool_block_tokens(surface.resident, surface.deferred) > resident_budget:
        uses = tool_use_counts() if uses is None else uses
        catalog.surface = fit_to_window(surface, budget_tokens=resident_budget, uses=uses)
    catalog.loaded_budget = max(0, budget - tool_block_tokens(catalog.surface.resident, catalog.surface.deferred))


def tool_use_counts(recent_calls: int = 2000, *, before_event: int | None = None) -> dict[str, int]:
    """How often each tool was called in the most recent tool calls: what a small window keeps resident.

    One query over the latest `recent_calls` events of that type, newest first along the primary
    key, so its cost does not grow with the event log (it runs once per turn in a small window).
    `before_event`: only events before that one (counts as they were then, whatever ran since).
    """
    # Looked up by name: the catalog does not depend on the runs app, it only reads what runs called.
    from django.apps import apps

    if not apps.is_installed("agents"):
        return {}
    RunEvent = apps.get_model("agents", "RunEvent")  # noqa: N806 - a model class
    calls = RunEvent.objects.filter(type="tool_call")
    if before_event is not None:
        calls = calls.filter(pk__lt=before_event)
    latest = calls.order_by("-pk").values("pk")[:recent_calls]
    counted = RunEvent.objects.filter(pk__in=latest).values("payload__name").annotate(n=Count("pk"))
    return {row["payload__name"]: row["n"] for row in counted}


def surface_context(surface: Surface) -> dict[str, Any]:
    """Resident tools with their token cost, the deferred index, and what each withheld schema would cost."""
    resident = [
        {"name": t.name, "group": t.group, "tokens": estimate_json_tokens(t.definition())} for t in surface.resident
    ]
    withheld = [
        {"name": t.name, "group": t.group, "schema_tokens": estimate_json_tokens(t.definition())}
        for t in surface.deferred
    ]
    groups: dict[str, list[str]] = {}
    for tool in surface.deferred:
        groups.setdefault(tool.group, []).append(tool.name)
    resident_tokens = estimate_json_tokens(surface.resident_schemas()) if surface.resident else 0
    index_tokens = estimate_text_tokens(surface.index_text)
    return {
        "mode": surface.mode.name,
        "deferral": surface.deferral,
        "resident": resident,
        "resident_tokens": resident_tokens,
        "index": {
            "text": surface.index_text,
            "tokens": index_tokens,
            "groups": [{"heading": h, "tools": sorted(names)} for h, names in groups.items()],
        },
        "deferred": withheld,
        "withheld_tokens": sum(item["schema_tokens"] for item in withheld),
        "tool_block_tokens": resident_tokens + index_tokens,
    }


def tools_list() -> QuerySet[Tool]:
    return Tool.objects.select_related("group", "server").order_by("group__order", "group__heading", "name")


def modes_list() -> QuerySet[Mode]:
    return Mode.objects.all()


def mcp_catalog_records(records: list[ToolRecord] | None = None) -> list[ToolRecord]:
    """What the MCP endpoint lists: the whole enabled catalog, never deferred (TD-9), by name.

    The discovery tools of the built-in runtime (search_tools, describe_tool,
    list_tool_groups) load schemas into a run; an MCP client already holds every
    schema, so it gets search_tool_bm25 instead (TD-7) and not these.
    """
    records = catalog_records() if records is None else records
    return sorted((r for r in records if r.name not in DISCOVERY_TOOLS), key=lambda r: r.name)


def groups_list() -> QuerySet[ToolGroup]:
    return ToolGroup.objects.annotate(tool_count=Count("tools")).order_by("order", "heading")


def mcp_servers_list() -> QuerySet[McpServer]:
    return McpServer.objects.order_by("name")
