"""Writes to the tool catalog: import and export of catalog files, activation records (TD-1, TD-15)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from controlcenter.errors import DomainError
from toolcatalog.catalogfile import dump_catalog, parse_catalog
from toolcatalog.models import RetrievalMiss, Tool, ToolActivation, ToolGroup
from toolcatalog.runtime import Activation
from toolcatalog.toolbox import builtin_names


class CatalogFileInvalid(DomainError):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("The catalog file was refused; nothing was changed:\n" + "\n".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class ImportResult:
    created: int
    updated: int
    unchanged: int
    groups_created: int


_FIELDS = (
    "description",
    "input_schema",
    "resident",
    "requires_approval",
    "max_calls_per_run",
    "enabled",
    "side_effects",
)


def catalog_import(*, text: str) -> ImportResult:
    """Import a whole catalog file or nothing: any invalid tool refuses the file (TD-1).

    Idempotent: tools are matched by name (outside MCP servers) and only changed
    fields are written, so importing the same file twice changes nothing.
    """
    parsed = parse_catalog(text)
    if parsed.errors:
        raise CatalogFileInvalid(parsed.errors)
    created = updated = unchanged = groups_created = 0
    with transaction.atomic():
        groups = {}
        for order, heading in enumerate(parsed.groups):
            group, made = ToolGroup.objects.get_or_create(heading=heading, defaults={"order": order})
            if not made and group.order != order:
                group.order = order
                group.save(update_fields=["order"])
            groups_created += made
            groups[heading] = group
        existing = {tool.name: tool for tool in Tool.objects.filter(server__isnull=True)}
        implemented = builtin_names()
        for entry in parsed.tools:
            values: dict[str, Any] = {
                "description": entry["description"],
                "input_schema": entry["input_schema"],
                "resident": entry.get("resident", False),
                "requires_approval": entry.get("requires_approval", False),
                "max_calls_per_run": entry.get("max_calls_per_run"),
                "enabled": entry.get("enabled", True),
                "side_effects": entry.get("side_effects", ""),
            }
            tool = existing.get(entry["name"])
            if tool is None:
                source = Tool.Source.BUILT_IN if entry["name"] in implemented else Tool.Source.IMPORTED
                Tool.objects.create(name=entry["name"], group=groups[entry["group"]], source=source, **values)
                created += 1
                continue
            changed = [field for field in _FIELDS if getattr(tool, field) != values[field]]
            if tool.group_id != groups[entry["group"]].pk:
                tool.group = groups[entry["group"]]
                changed.append("group")
            if not changed:
                unchanged += 1
                continue
            for field in _FIELDS:
                setattr(tool, field, values[field])
            tool.save()
            updated += 1
    return ImportResult(created, updated, unchanged, groups_created)


def catalog_export() -> str:
    """Every tool outside MCP servers, in the import format (MCP tools come from their servers)."""
    tools = (
        Tool.objects.filter(server__isnull=True)
        .select_related("group")
        .order_by("group__order", "group__heading", "name")
    )
    groups = list(ToolGroup.objects.order_by("order", "heading").values_list("heading", flat=True))
    entries = []
    for tool in tools:
        entry: dict[str, Any] = {"name": tool.name, "group": tool.group.heading, "description": tool.description}
        entry["input_schema"] = tool.input_schema
        entry.update(resident=tool.resident, requires_approval=tool.requires_approval, enabled=tool.enabled)
        if tool.max_calls_per_run is not None:
            entry["max_calls_per_run"] = tool.max_calls_per_run
        if tool.side_effects:
            entry["side_effects"] = tool.side_effects
        entries.append(entry)
    return dump_catalog(groups, entries)


def tools_set_resident(*, tool_ids: Iterable[int], resident: bool) -> int:
    return Tool.objects.filter(pk__in=list(tool_ids)).update(resident=resident)


def activations_record(*, run_id: int, activations: Iterable[Activation], misses: Iterable[str]) -> None:
    """What a run loaded and which searches found nothing (TD-15); called inside the turn's transaction."""
    ToolActivation.objects.bulk_create(
        ToolActivation(run_id=run_id, tool_name=a.tool_name, trigger=a.trigger, query=a.query) for a in activations
    )
    RetrievalMiss.objects.bulk_create(RetrievalMiss(run_id=run_id, query=query) for query in misses)
