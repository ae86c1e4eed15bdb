"""The catalog file format (shared/data/toolcatalog.json): parse with line numbers, check, export.

Pure Python. `parse_catalog` returns every problem of a file at once, each with the
line it is on, so an import can refuse the whole file and say exactly why.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.catalog.schemas import catalog_name_problem, description_problem, schema_problem
from engine.catalog.surface import ToolRecord

FORMAT_VERSION = 1
_TOOL_KEYS = {
    "name",
    "group",
    "description",
    "input_schema",
    "resident",
    "requires_approval",
    "max_calls_per_run",
    "enabled",
    "side_effects",
}

# The columns' sizes in toolcatalog.models: a longer value failed half-way in the database (SB-5).
GROUP_HEADING_MAX = 100
SIDE_EFFECTS_MAX = 16
MAX_CALLS_MAX = 2**31 - 1


class _Located(dict):
    line: int = 0


class _LocatingDecoder(json.JSONDecoder):
    """A JSON decoder whose objects remember the line they start on."""

    # Set by JSONDecoder.__init__ at run time; typeshed does not declare it.
    parse_object: Callable[..., tuple[Any, int]]

    def __init__(self, text: str) -> None:
        super().__init__()
        base = self.parse_object

        def parse_object(s_and_end: tuple[str, int], *args: Any, **kwargs: Any) -> tuple[_Located, int]:
            text, end = s_and_end
            value, new_end = base(s_and_end, *args, **kwargs)
            located = _Located(value)
            located.line = text.count("\n", 0, end) + 1
            return located, new_end

        self.parse_object = parse_object
        # The C scanner ignores parse_object; the Python one calls it.
        self.scan_once = json.scanner.py_make_scanner(self)  # type: ignore[attr-defined]  # typeshed omits it


@dataclass
class ParsedCatalog:
    groups: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_catalog(text: str, *, fixed_schemas: Mapping[str, dict[str, Any]] | None = None) -> ParsedCatalog:
    """The file's groups and tools, or every reason it is refused, each with its line.

    `fixed_schemas`: input schemas a file may not change (the tools this installation implements):
    the model would be told arguments the implementation does not take.
    """
    parsed = ParsedCatalog()
    try:
        data = _LocatingDecoder(text).decode(text)
    except json.JSONDecodeError as exc:
        parsed.errors.append(f"line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}")
        return parsed
    if not isinstance(data, dict):
        parsed.errors.append("line 1: the file must hold one JSON object with 'version', 'groups' and 'tools'.")
        return parsed
    top = getattr(data, "line", 1)
    if data.get("version") != FORMAT_VERSION:
        parsed.errors.append(f"line {top}: 'version' must be {FORMAT_VERSION}, not {data.get('version')!r}.")
    groups = data.get("groups")
    if not isinstance(groups, list) or not all(
        isinstance(g, str) and g.strip() and "\x00" not in g and len(g) <= GROUP_HEADING_MAX for g in groups
    ):
        parsed.errors.append(
            f"line {top}: 'groups' must be a list of headings of at most {GROUP_HEADING_MAX} characters."
        )
        groups = []
    elif len(set(groups)) != len(groups):
        parsed.errors.append(f"line {top}: 'groups' lists a heading twice.")
    parsed.groups = list(groups)
    tools = data.get("tools")
    if not isinstance(tools, list):
        parsed.errors.append(f"line {top}: 'tools' must be a list of tool objects.")
        return parsed
    seen: dict[str, int] = {}
    for position, tool in enumerate(tools, 1):
        line = getattr(tool, "line", top)
        if not isinstance(tool, dict):
            parsed.errors.append(f"line {line}: tool #{position} must be a JSON object.")
            continue
        label = f"line {line}: tool {tool.get('name', f'#{position}')!r}"
        for problem in _tool_problems(tool, set(groups), fixed_schemas or {}):
            parsed.errors.append(f"{label}: {problem}")
        name = tool.get("name")
        if isinstance(name, str):
            if name in seen:
                parsed.errors.append(f"{label}: the name is already used by the tool on line {seen[name]}.")
            seen.setdefault(name, line)
        parsed.tools.append(_plain(tool))
    return parsed


def _tool_problems(tool: dict[str, Any], groups: set[str], fixed_schemas: Mapping[str, dict[str, Any]]) -> list[str]:
    problems = []
    if _has_nul(tool):
        # Found by tests/controlcenter/test_fuzz_inputs.py: PostgreSQL text and jsonb cannot store U+0000,
        # so such a file failed half-way in the database instead of being refused up front.
        problems.append("a value contains the NUL character (\\u0000), which cannot be stored.")
    if unknown := sorted(set(tool) - _TOOL_KEYS):
        problems.append(f"unknown keys {', '.join(unknown)}.")
    if problem := catalog_name_problem(tool.get("name")):
        problems.append(problem)
    if tool.get("group") not in groups:
        problems.append(f"group {tool.get('group')!r} is not one of the file's 'groups'.")
    if not isinstance(tool.get("description"), str) or not tool["description"].strip():
        problems.append("a non-empty 'description' is required.")
    elif problem := description_problem(tool["description"]):
        problems.append(problem)
    if "input_schema" not in tool:
        problems.append("'input_schema' is required.")
    elif problem := schema_problem(tool["input_schema"]):
        schema_line = getattr(tool["input_schema"], "line", None)
        problems.append(f"{problem} (schema starts on line {schema_line})" if schema_line else problem)
    elif (fixed := fixed_schemas.get(str(tool.get("name")))) is not None and _plain(tool["input_schema"]) != fixed:
        problems.append(
            "this tool is built in, and its input schema is its implementation's: a file may change its "
            "description, group and flags, not its schema (`catalog export` writes the one to keep)."
        )
    for flag in ("resident", "requires_approval", "enabled"):
        if flag in tool and not isinstance(tool[flag], bool):
            problems.append(f"'{flag}' must be true or false.")
    limit = tool.get("max_calls_per_run")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_CALLS_MAX):
        problems.append(f"'max_calls_per_run' must be an integer from 1 to {MAX_CALLS_MAX}, or null.")
    side_effects = tool.get("side_effects", "")
    if not isinstance(side_effects, str) or len(side_effects) > SIDE_EFFECTS_MAX:
        problems.append(f"'side_effects' must be a string of at most {SIDE_EFFECTS_MAX} characters (e.g. 'none').")
    return problems


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def records_from_catalog(data: dict[str, Any]) -> list[ToolRecord]:
    """Plain records straight from a parsed catalog file (benchmarks, tests)."""
    order = {heading: i for i, heading in enumerate(data.get("groups", []))}
    return [
        ToolRecord(
            name=tool["name"],
            group=tool["group"],
            description=tool["description"],
            input_schema=tool["input_schema"],
            resident=bool(tool.get("resident", False)),
            requires_approval=bool(tool.get("requires_approval", False)),
            max_calls_per_run=tool.get("max_calls_per_run"),
            group_order=order.get(tool["group"], len(order)),
        )
        for tool in data["tools"]
        if tool.get("enabled", True)
    ]


def dump_catalog(groups: list[str], tools: list[dict[str, Any]]) -> str:
    return (
        json.dumps({"version": FORMAT_VERSION, "groups": groups, "tools": tools}, indent=2, ensure_ascii=False) + "\n"
    )
