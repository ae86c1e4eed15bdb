"""MCP server configuration (MC-1, MC-3): checking it, reading `mcpServers` files, resolving secrets.

One shape whatever the way in (admin, API, a Claude-Desktop-style file): stdio servers have
`command`, `args`, `env`, `cwd`; Streamable HTTP servers have `url` and `headers`. Values of
`env` and `headers` are secrets: they are never shown back, and may be `${VAR}` references
to the worker's environment, resolved only when the server is reached.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from engine.catalog.schemas import NAMESPACE_SEPARATOR

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HIDDEN_VALUE = "***"
_HTTP_URL = URLValidator(schemes=["http", "https"])
# A value with one of these would end a header line early (or a C string, for env).
_BREAKING = re.compile(r"[\r\n\x00]")


class McpConfigError(ValueError):
    """A server's configuration is unusable; the message names the server and the field."""


def config_problems(
    *,
    name: str,
    transport: str,
    command: str = "",
    args: Any = (),
    env: Any = None,
    cwd: str = "",
    url: str = "",
    headers: Any = None,
    network: Any = False,
) -> dict[str, str]:
    """Field -> why it is refused; empty when the server can be saved."""
    errors: dict[str, str] = {}
    if not _NAME.fullmatch(name or ""):
        errors["name"] = "1-40 letters, digits, '-' or '_' (it prefixes the names of the server's tools)."
    elif NAMESPACE_SEPARATOR in name:
        errors["name"] = "A server name cannot contain '__' (it separates server and tool)."
    if transport == "stdio":
        if not isinstance(command, str) or not command.strip():
            errors["command"] = "A stdio server needs the command that starts it."
        if not isinstance(args, list | tuple) or not all(isinstance(arg, str) for arg in args):
            errors["args"] = 'A list of strings, e.g. ["-m", "my_server"].'
        if problem := _mapping_problem(env, _ENV_NAME, "environment variable"):
            errors["env"] = problem
        if url or headers:
            errors["url"] = "A stdio server has no url or headers; use transport http for a remote server."
    elif transport == "http":
        if problem := _url_problem(url):
            errors["url"] = problem
        if problem := _mapping_problem(headers, _HEADER_NAME, "header"):
            errors["headers"] = problem
        if command or args or env or cwd:
            errors["command"] = "An http server has no command, args, env or cwd; use transport stdio for those."
        if network:
            errors["network"] = "network applies to stdio servers (they run in the sandbox); an http server is remote."
    else:
        errors["transport"] = "Use stdio (command, args, env, cwd) or http (url, headers)."
    if not isinstance(network, bool):
        errors["network"] = "true or false: whether the sandboxed server gets outbound network."
    return errors


def _mapping_problem(value: Any, key_pattern: re.Pattern[str], what: str) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, dict):
        return f"An object of {what} names to string values."
    for key, item in value.items():
        if not isinstance(key, str) or not key_pattern.fullmatch(key):
            return f"{key!r} is not a valid {what} name."
        if not isinstance(item, str):
            return f"The value of {what} {key!r} must be a string."
        if _BREAKING.search(item):
            return f"The value of {what} {key!r} contains a line break or NUL, which no {what} may hold."
    return None


def _url_problem(url: Any) -> str | None:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return "An http server needs its http(s):// URL."
    try:
        _HTTP_URL(url)
        urlsplit(url).port  # noqa: B018  # raises on a port outside 0-65535
    except (ValidationError, ValueError):
        return f"{url[:200]!r} is not a valid http(s) URL (host, optional port 1-65535, path)."
    return None


def merged_secrets(previous: dict[str, str], given: dict[str, Any], what: str) -> dict[str, Any]:
    """`given` with every HIDDEN_VALUE replaced by the value stored before ("***" means keep it).

    ValueError when a name given as "***" has no stored value: storing "" would silently break
    the server, and the operator meant to keep something that is not there."""
    missing = [key for key, value in given.items() if value == HIDDEN_VALUE and key not in previous]
    if len(missing) == 1:
        raise ValueError(f'{what} {missing[0]!r} has no stored value for "{HIDDEN_VALUE}" to keep; give its value.')
    if missing:
        # All of them at once: one round trip per name was the admin's answer to a refused form.
        names = ", ".join(repr(key) for key in missing)
        raise ValueError(f'{what}s {names} have no stored value for "{HIDDEN_VALUE}" to keep; give their values.')
    return {key: previous[key] if value == HIDDEN_VALUE else value for key, value in given.items()}


def resolve_references(server: str, field: str, values: dict[str, str]) -> dict[str, str]:
    """`values` with every `${VAR}` replaced from this process's environment; a missing one is an error."""
    resolved = {}
    for key, value in values.items():

        def lookup(match: re.Match[str], key: str = key) -> str:
            variable = match.group(1)
            if variable not in os.environ:
                raise McpConfigError(
                    f"MCP server {server!r}: {field} {key!r} refers to ${{{variable}}}, which is not set in the "
                    "environment of the process starting the server (a worker for runs, the web process for /mcp "
                    "and the API, the command for imports)."
                )
            return os.environ[variable]

        resolved[key] = _REFERENCE.sub(lookup, value)
    return resolved


def hidden(values: dict[str, str] | None) -> dict[str, str]:
    """What the admin and the API show of write-only values: the names, and whether each is a reference."""
    return {key: value if _REFERENCE.fullmatch(value or "") else HIDDEN_VALUE for key, value in (values or {}).items()}


def parse_servers_file(data: Any) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """A Claude-Desktop-style `{"mcpServers": {NAME: {...}}}` document -> (configs, problems by server).

    Each config is ready for an `McpServer` row (transport inferred: `url` means http).
    A server with a problem is left out of the configs and named in the problems.
    """
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError('The file must be a JSON object with an "mcpServers" object: {"mcpServers": {...}}.')
    configs: dict[str, dict[str, Any]] = {}
    problems: dict[str, str] = {}
    for name, entry in data["mcpServers"].items():
        if not isinstance(entry, dict):
            problems[name] = "its entry must be an object with command/args/env or url/headers."
            continue
        known = {"command", "args", "env", "cwd", "url", "headers", "network", "type", "transport", "disabled"}
        if unknown := sorted(set(entry) - known):
            expected = "command, args, env, cwd, network or url, headers"
            problems[name] = f"unknown keys {', '.join(unknown)} (expected {expected})."
            continue
        transport = "http" if "url" in entry else "stdio"
        declared = entry.get("type") or entry.get("transport")
        if declared not in (None, transport, "streamable-http", "http" if transport == "http" else "stdio"):
            problems[name] = f"type {declared!r} is not supported (stdio, or http for Streamable HTTP)."
            continue
        config = {
            "name": name,
            "transport": transport,
            "command": entry.get("command", ""),
            "args": entry.get("args", []),
            "env": entry.get("env", {}),
            "cwd": entry.get("cwd", ""),
            "url": entry.get("url", ""),
            "headers": entry.get("headers", {}),
            "network": entry.get("network", False),
        }
        if errors := config_problems(**config):
            problems[name] = "; ".join(f"{field}: {message}" for field, message in errors.items())
            continue
        config["enabled"] = not entry.get("disabled", False)
        configs[name] = config
    return configs, problems
