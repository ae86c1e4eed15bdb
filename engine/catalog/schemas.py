"""Checks on tool definitions shared by the models, the importer and the runtime (no Django import)."""

from __future__ import annotations

import re
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from engine.nesting import nesting_depth

# Provider tool names: what both the Anthropic and OpenAI APIs accept.
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# MCP tools are namespaced by their server so equal names from two servers stay distinct.
NAMESPACE_SEPARATOR = "__"
# JSON Schema's checker recurses a few frames per level: a schema 95 levels deep from an MCP
# server ended in RecursionError, a 500. Real tool schemas nest a handful of levels.
MAX_SCHEMA_DEPTH = 32


class InvalidToolDefinition(ValueError):
    pass


def qualified_name(name: str, server: str | None) -> str:
    return f"{server}{NAMESPACE_SEPARATOR}{name}" if server else name


def schema_problem(schema: Any) -> str | None:
    """Why `schema` cannot be a tool's input schema, or None when it can."""
    if not isinstance(schema, dict):
        return "the input schema must be a JSON object."
    if nesting_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        return f"the input schema nests deeper than {MAX_SCHEMA_DEPTH} levels."
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path) or "(top level)"
        return f"the input schema is not valid JSON Schema at {where}: {exc.message}"
    if schema.get("type") != "object":
        return 'the input schema must describe an object ("type": "object").'
    return None


def name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        return f"tool name {name!r} must be 1-64 letters, digits, '_' or '-'."
    return None


# A resident tool's description is in every request: a 2 MB one was imported (QA).
MAX_DESCRIPTION_CHARS = 10_000


def description_problem(description: str) -> str | None:
    if len(description) > MAX_DESCRIPTION_CHARS:
        return (
            f"the description is {len(description):,} characters, over {MAX_DESCRIPTION_CHARS:,}: a resident "
            "tool's description goes into every request."
        )
    return None


def catalog_name_problem(name: Any) -> str | None:
    """A tool that belongs to no MCP server: its name may not look like one that does. `weather__get`
    beside server weather's `get` sent one name twice, and the API refused every request (QA)."""
    if problem := name_problem(name):
        return problem
    if NAMESPACE_SEPARATOR in name:
        return f"tool name {name!r} contains '__', which only an MCP server's tools have (SERVER__tool)."
    return None


def arguments_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """The first way `arguments` break `schema`, in words the model can act on, or None."""
    try:
        Draft202012Validator(schema).validate(arguments)
    except ValidationError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        return f"{where}: {exc.message}" if where else exc.message
    return None
