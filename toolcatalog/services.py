"""Writes to the tool catalog: catalog files, activation records, mode versions (TD-1, TD-15, TS-3)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from controlcenter.errors import DomainError
from engine.catalog.schemas import (
    NAMESPACE_SEPARATOR,
    description_problem,
    name_problem,
    qualified_name,
    schema_problem,
)
from engine.catalog.toolbox import DISCOVERY_TOOLS, Activation
from toolcatalog.builtins import builtin_names
from toolcatalog.catalogfile import dump_catalog, parse_catalog
from toolcatalog.mcp_config import (
    McpConfigError,
    config_problems,
    merged_secrets,
    parse_servers_file,
    resolve_references,
)
from toolcatalog.mcp_spec import ImportedTool, McpImportError, McpServerSpec
from toolcatalog.models import (
    McpCallCount,
    McpServer,
    Mode,
    ModeVersion,
    RetrievalMiss,
    Tool,
    ToolActivation,
    ToolGroup,
)
from toolcatalog.selectors import catalog_records, mode_spec
from toolcatalog.tools.base import DEFINITIONS_FILE


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
    # Catalog tools the file does not name: left as they are, but said (QA: nothing was).
    not_in_file: tuple[str, ...] = ()


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
    _headings, definitions = builtin_definitions()
    parsed = parse_catalog(text, fixed_schemas={entry["name"]: entry["input_schema"] for entry in definitions})
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
            changed = [name for name in _FIELDS if getattr(tool, name) != values[name]]
            if tool.group_id != groups[entry["group"]].pk:
                tool.group = groups[entry["group"]]
                changed.append("group")
            if not changed:
                unchanged += 1
                continue
            for name in _FIELDS:
                setattr(tool, name, values[name])
            tool.save()
            updated += 1
    named = {entry["name"] for entry in parsed.tools}
    return ImportResult(created, updated, unchanged, groups_created, tuple(sorted(set(existing) - named)))


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


class ResidentChangeRefused(ValueError):
    """A resident-set change that cannot be applied; the message says why. Nothing was stored."""


def mode_resident_apply(
    *,
    mode_id: int,
    make_resident: list[str],
    make_deferred: list[str],
    expected_version: int,
    applied_by: str = "",
    effect: dict[str, Any] | None = None,
) -> ModeVersion:
    """Change the mode's resident set as one new version; refuses stale, unknown or contradictory changes."""
    add, remove = set(make_resident), set(make_deferred)
    if not add and not remove:
        raise ResidentChangeRefused("Nothing to apply: choose at least one tool to make resident or deferred.")
    if add & remove:
        raise ResidentChangeRefused(f"A tool cannot be made resident and deferred at once: {sorted(add & remove)}.")
    with transaction.atomic():
        mode = Mode.objects.select_for_update().get(pk=mode_id)
        if not 1 <= expected_version <= mode.version:
            raise ResidentChangeRefused(
                f"Version {expected_version} was never a version of mode {mode.name} (it is at {mode.version}). "
                "Reload the recommendation."
            )
        if mode.version != expected_version:
            raise ResidentChangeRefused(
                f"Mode {mode.name} is at version {mode.version}, not {expected_version}: someone changed it "
                "meanwhile. Reload the recommendation."
            )
        spec = mode_spec(mode)
        records = [tool for tool in catalog_records() if spec.admits(tool.name)]
        if unknown := sorted((add | remove) - {tool.name for tool in records}):
            raise ResidentChangeRefused(f"Not tools of mode {mode.name}: {_some_names(unknown)}.")
        # A version that changes nothing would still change the tools prefix's version (QA).
        resident = {tool.name for tool in records if spec.resident(tool)}
        if already := sorted((add & resident) | (remove - resident)):
            raise ResidentChangeRefused(
                f"Already as asked in mode {mode.name}: {_some_names(already)}. Nothing was applied."
            )
        if discovery := sorted(remove & set(DISCOVERY_TOOLS)):
            raise ResidentChangeRefused(
                f"{_some_names(discovery)} find and load the deferred tools: they stay resident. Nothing was applied."
            )
        changed = spec.with_resident(add, remove)
        mode.resident_add = sorted(changed.resident_add)
        mode.resident_remove = sorted(changed.resident_remove)
        mode.version += 1
        mode.save(update_fields=["resident_add", "resident_remove", "version"])
        return ModeVersion.objects.create(
            mode=mode,
            version=mode.version,
            added=sorted(add),
            removed=sorted(remove),
            effect=effect or {},
            applied_by=applied_by,
        )


def _some_names(names: list[str], shown: int = 5) -> str:
    # Names come from a form: a 100,000-character one was echoed whole into the page.
    listed = ", ".join(repr(name[:64] + ("…" if len(name) > 64 else "")) for name in names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")


def activations_record(*, run_id: int, activations: Iterable[Activation], misses: Iterable[str]) -> None:
    """What a run loaded and which searches found nothing (TD-15); called inside the turn's transaction.

    The misses first: a turn's misses and loads are stored together at its end, and TS-3 counts a
    load "found after a failed search" by time. Stored loads first, no load in the turn of its miss
    ever counted (QA); a search that misses and then finds is the usual order within a turn."""
    RetrievalMiss.objects.bulk_create(RetrievalMiss(run_id=run_id, query=query) for query in misses)
    ToolActivation.objects.bulk_create(
        ToolActivation(run_id=run_id, tool_name=a.tool_name, trigger=a.trigger, query=a.query) for a in activations
    )


# --- built-in tools on a fresh installation -------------------------------------------


@dataclass(frozen=True)
class BuiltinsLoaded:
    created: int
    existing: int


def builtin_definitions() -> tuple[list[str], list[dict[str, Any]]]:
    """Group headings and definitions of every tool this installation answers itself.

    The tools of `toolcatalog/tools/` plus the discovery tools the catalog runtime
    implements (search_tools, describe_tool, list_tool_groups), with the groups and
    resident flags of the reference catalog.
    """
    data = json.loads(DEFINITIONS_FILE.read_text(encoding="utf-8"))
    return list(data["groups"]), [*data["tools"], *data["runtime_tools"]]


def catalog_load_builtins() -> BuiltinsLoaded:
    """Add the built-in tools that are missing from the catalog; never touch existing rows.

    Idempotent and run by `bootstrap` on every start, so an operator's edits (resident,
    approval, limits, enabled) survive restarts; to hide a built-in, disable it.
    """
    headings, definitions = builtin_definitions()
    created = existing = 0
    with transaction.atomic():
        known = set(Tool.objects.filter(server__isnull=True).values_list("name", flat=True))
        groups: dict[str, ToolGroup] = {}
        for order, heading in enumerate(headings):
            groups[heading], _ = ToolGroup.objects.get_or_create(heading=heading, defaults={"order": order})
        for entry in definitions:
            if entry["name"] in known:
                existing += 1
                continue
            Tool.objects.create(
                name=entry["name"],
                group=groups[entry["group"]],
                description=entry["description"],
                input_schema=entry["input_schema"],
                resident=bool(entry.get("resident", False)),
                requires_approval=bool(entry.get("requires_approval", False)),
                side_effects=entry.get("side_effects", ""),
                source=Tool.Source.BUILT_IN,
            )
            created += 1
    return BuiltinsLoaded(created, existing)


# --- importing an external MCP server's tools -----------------------------------------


class McpServerImportFailed(DomainError):
    pass


@dataclass(frozen=True)
class McpImportResult:
    """What a (re-)import changed, by tool name (MC-1)."""

    added: list[str]
    changed: list[str]
    unchanged: int
    removed: list[str]
    refused: list[str]

    @property
    def created(self) -> int:
        return len(self.added)

    @property
    def updated(self) -> int:
        return len(self.changed)

    @property
    def disabled(self) -> int:
        return len(self.removed)

    def summary(self) -> str:
        def named(label: str, names: list[str]) -> str:
            return f"{len(names)} {label}" + (f" ({', '.join(names)})" if names else "")

        text = ", ".join(
            [
                named("tools added", self.added),
                named("changed", self.changed),
                f"{self.unchanged} unchanged",
                named("removed (no longer listed by the server; disabled)", self.removed),
            ]
        )
        if self.refused:
            text += f"; {len(self.refused)} refused:\n" + "\n".join(self.refused)
        return text + "."

    def as_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "refused": self.refused,
        }


def mcp_server_spec(server: McpServer, *, timeout_seconds: float | None = None) -> McpServerSpec:
    """How to reach `server`, with `${VAR}` references resolved from this process's environment.

    Raises McpConfigError when a reference names a variable that is not set.
    """
    timeout = timeout_seconds if timeout_seconds is not None else settings.CC_MCP_CALL_TIMEOUT_SECONDS
    if server.transport == McpServer.Transport.STDIO:
        return McpServerSpec(
            name=server.name,
            transport="stdio",
            command=server.command,
            args=list(server.args or []),
            env=resolve_references(server.name, "env", dict(server.env or {})),
            cwd=server.cwd or None,
            timeout_seconds=timeout,
            network=server.network,
        )
    return McpServerSpec(
        name=server.name,
        transport="http",
        url=server.url,
        headers=resolve_references(server.name, "header", dict(server.headers or {})),
        timeout_seconds=timeout,
    )


def _imported_problem(server: McpServer, tool: ImportedTool) -> str | None:
    problem = name_problem(tool.name) or name_problem(qualified_name(tool.name, server.name))
    if problem is None and NAMESPACE_SEPARATOR in tool.name:
        problem = f"tool name {tool.name!r} contains '__', which separates server and tool."
    return problem or schema_problem(tool.input_schema) or description_problem(tool.description)


def mcp_server_listing(server: McpServer) -> list[ImportedTool]:
    """The tools `server` lists now; McpServerImportFailed, saying why, when it cannot be reached."""
    # Deferred: the MCP SDK would cost every process that loads this module ~0.7 s at start (mcp_spec).
    from toolcatalog.mcp_import import list_server_tools

    try:
        return list_server_tools(mcp_server_spec(server, timeout_seconds=settings.CC_MCP_IMPORT_TIMEOUT_SECONDS))
    except (McpImportError, McpConfigError) as exc:
        raise McpServerImportFailed(f"{str(exc).rstrip('.')}. Nothing was changed.") from exc


def mcp_server_import(*, server: McpServer) -> McpImportResult:
    """List `server`'s tools and upsert them as MCP tools under a group named after the server.

    Connecting happens before any write: a server that cannot be reached changes
    nothing. Tools with a bad name or schema are refused one by one (named in the
    result) and their rows keep what they had. Tools the server no longer lists are
    disabled, not deleted, and enabled again when they come back. The server owns
    names, descriptions and schemas; the operator owns everything else (resident,
    approval, limits, group, enabled), which a re-import leaves alone. Idempotent.
    """
    listed = mcp_server_listing(server)
    with transaction.atomic():
        return _apply_listing(server, listed)


def mcp_server_apply_listing(*, server: McpServer, listed: list[ImportedTool]) -> McpImportResult:
    """Take a tool list the server just sent (its list_changed notification, MC-4) into the catalog."""
    with transaction.atomic():
        return _apply_listing(server, listed)


def _apply_listing(server: McpServer, listed: list[ImportedTool]) -> McpImportResult:
    refused: list[str] = []
    valid: dict[str, ImportedTool] = {}
    tool: ImportedTool | Tool | None  # the listing's tools, then the catalog's rows
    for tool in listed:
        if problem := _imported_problem(server, tool):
            refused.append(f"{server.name}: {tool.name!r}: {problem}")
        elif tool.name in valid:
            refused.append(f"{server.name}: {tool.name!r}: listed twice by the server; the first one is kept.")
        else:
            valid[tool.name] = tool
    listed_names = {tool.name for tool in listed}
    added: list[str] = []
    changed_names: list[str] = []
    removed: list[str] = []
    unchanged = 0
    group = ToolGroup.objects.filter(heading=server.name).first()
    existing = {tool.name: tool for tool in Tool.objects.select_for_update().filter(server=server)}
    if group is None and (valid.keys() - existing.keys()):
        last = ToolGroup.objects.order_by("-order").values_list("order", flat=True).first()
        group = ToolGroup.objects.create(heading=server.name, order=(last or 0) + 1)
    for name, imported in valid.items():
        tool = existing.get(name)
        if tool is None:
            assert group is not None  # created above, as this tool is new
            Tool.objects.create(
                name=name,
                group=group,
                description=imported.description,
                input_schema=imported.input_schema,
                source=Tool.Source.MCP,
                server=server,
            )
            added.append(name)
            continue
        changed = []
        for field, value in (("description", imported.description), ("input_schema", imported.input_schema)):
            if getattr(tool, field) != value:
                setattr(tool, field, value)
                changed.append(field)
        if tool.server_missing:
            tool.server_missing, tool.enabled = False, True
            changed += ["server_missing", "enabled"]
        if changed:
            tool.save(update_fields=[*changed, "updated_at"])
            changed_names.append(name)
        else:
            unchanged += 1
    for name, tool in existing.items():
        if name not in listed_names and not tool.server_missing:
            tool.server_missing, tool.enabled = True, False
            tool.save(update_fields=["server_missing", "enabled", "updated_at"])
            removed.append(name)
    return McpImportResult(sorted(added), sorted(changed_names), unchanged, sorted(removed), refused)


# --- configuring servers (admin, API, mcpServers files) ---------------------------------


class McpServerInvalid(DomainError):
    """Per-field errors in the shape a serializer's have: one sentence, and `details` by field."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(
            " ".join(f"{field}: {message}" for field, message in errors.items()),
            {field: [message] for field, message in errors.items()},
        )


_CONFIG_FIELDS = ("transport", "command", "args", "env", "cwd", "url", "headers", "network", "enabled")


def mcp_server_save(
    *, config: dict[str, Any], server: McpServer | None = None, import_tools: bool = True
) -> tuple[McpServer, McpImportResult | None]:
    """Create or update a server from `config` and import its tools: all or nothing (MC-1).

    Nothing is stored unless the configuration is valid and (for an enabled server, when
    `import_tools`) the server answers tools/list; the error says why.
    """
    values = {field: config[field] for field in _CONFIG_FIELDS if field in config}
    name = config.get("name", server.name if server is not None else "")
    for field, what in (("env", "environment variable"), ("headers", "header")):
        if field in values and isinstance(values[field], dict):
            try:
                values[field] = merged_secrets(getattr(server, field, None) or {}, values[field], what)
            except ValueError as exc:
                raise McpServerInvalid({field: str(exc)}) from None
    if server is not None:
        current = {field: getattr(server, field) for field in _CONFIG_FIELDS}
        values = {**current, **values}
    values.setdefault("transport", "")
    errors = config_problems(name=name, **{k: v for k, v in values.items() if k != "enabled"})
    # pk=None excludes nothing (IS NULL); the stubs allow no None in a lookup.
    duplicate = McpServer.objects.filter(name=name).exclude(pk=server.pk if server is not None else None)  # type: ignore[misc]
    if not errors and duplicate.exists():
        errors["name"] = f"There is already an MCP server named {name!r}."
    if errors:
        raise McpServerInvalid(errors)
    candidate = server or McpServer(name=name)
    candidate.name = name
    for field, value in values.items():
        setattr(candidate, field, value)
    for field, default in (("args", []), ("env", {}), ("headers", {}), ("cwd", ""), ("command", ""), ("url", "")):
        if getattr(candidate, field) is None:
            setattr(candidate, field, default)
    listed = mcp_server_listing(candidate) if import_tools and candidate.enabled else None
    try:
        with transaction.atomic():
            candidate.save()
            result = _apply_listing(candidate, listed) if listed is not None else None
    except IntegrityError:
        # Another request saved the name while this one listed the tools (seconds): a double
        # click, a client's retry.
        if not duplicate.exists():
            raise
        raise McpServerInvalid({"name": f"There is already an MCP server named {name!r}."}) from None
    return candidate, result


def mcp_server_delete(*, server: McpServer) -> None:
    """Remove a server and its tools; a call of one of them later says it was removed."""
    with transaction.atomic():
        Tool.objects.filter(server=server).delete()
        ToolGroup.objects.filter(heading=server.name, tools__isnull=True).delete()
        server.delete()


@dataclass(frozen=True)
class McpFileOutcome:
    name: str
    created: bool = False
    result: McpImportResult | None = None
    error: str = ""


def mcp_servers_import_file(*, text: str) -> list[McpFileOutcome]:
    """Configure every server of a Claude-Desktop-style `{"mcpServers": {...}}` file.

    Each server is imported all-or-nothing on its own: one that is invalid or cannot be
    reached is reported with its reason and changes nothing, the others go ahead.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise McpConfigError(f"The file is not JSON: {exc}.") from exc
    configs, problems = parse_servers_file(data)
    outcomes = [McpFileOutcome(name=name, error=problem) for name, problem in problems.items()]
    for name, config in configs.items():
        existing = McpServer.objects.filter(name=name).first()
        try:
            _, result = mcp_server_save(config=config, server=existing)
        except (McpServerInvalid, McpServerImportFailed) as exc:
            outcomes.append(McpFileOutcome(name=name, error=exc.message))
            continue
        outcomes.append(McpFileOutcome(name=name, created=existing is None, result=result))
    return sorted(outcomes, key=lambda outcome: outcome.name)


# --- per-session action limits of the MCP endpoint ------------------------------------


def mcp_session_take_call(*, user_id: int, session_key: str, tool_name: str, limit: int) -> bool:
    """Count one call of `tool_name` in this MCP session; False (nothing counted) at the limit.

    A session's counts end after CC_MCP_SESSION_IDLE_SECONDS without a counted call
    (stale rows of every session are pruned here). A conditional UPDATE decides, so
    concurrent calls cannot overshoot the limit whichever web process answers them.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.CC_MCP_SESSION_IDLE_SECONDS)
    with transaction.atomic():
        McpCallCount.objects.filter(updated_at__lt=cutoff).delete()
        McpCallCount.objects.get_or_create(user_id=user_id, session_key=session_key, tool_name=tool_name)
        taken = McpCallCount.objects.filter(
            user_id=user_id, session_key=session_key, tool_name=tool_name, count__lt=limit
        ).update(count=F("count") + 1, updated_at=timezone.now())
    return taken == 1


def mcp_session_end(*, user_id: int, session_key: str) -> int:
    """Forget a closed session's counts (the client's DELETE)."""
    deleted, _ = McpCallCount.objects.filter(user_id=user_id, session_key=session_key).delete()
    return deleted
