"""Checks on tool definitions shared by the models, the importer and the runtime (no Django import)."""

from __future__ import annotations

import difflib
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


# Top-level keywords under which a schema says more about its properties than `properties` does.
_COMPOSED = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "$ref")


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, refusing top-level arguments it does not name, unless it says what others may be.

    JSON Schema lets any other name through, and tool schemas rarely say otherwise: a model's
    `timeout` for bash's `timeout_seconds` was dropped in silence and the command ran with the
    default 30 s. The schema the model sees stays as written; only the check is closed.
    """
    if "properties" in schema and not any(keyword in schema for keyword in _COMPOSED):
        return {**schema, "additionalProperties": False}
    return schema


def arguments_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """The first way `arguments` break `schema`, in words the model can act on, or None."""
    try:
        Draft202012Validator(closed_schema(schema)).validate(arguments)
    except ValidationError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        message = f"{where}: {exc.message}" if where else exc.message
        if exc.validator == "additionalProperties" and not exc.absolute_path and isinstance(arguments, dict):
            message += _argument_names_hint(schema, arguments)
        return message
    return None


def _argument_names_hint(schema: dict[str, Any], arguments: dict[str, Any]) -> str:
    known = list(schema.get("properties", {}))
    guesses = [
        f"{match[0]!r} for {name!r}"
        for name in arguments
        if name not in known and (match := difflib.get_close_matches(name, known, n=1, cutoff=0.6))
    ]
    return f". It takes: {', '.join(known)}" + (f"; did you mean {', '.join(guesses)}?" if guesses else ".")
