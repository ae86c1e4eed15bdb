"""Typed parsers for settings read from the environment.

Every parser fails loudly with the variable's name and the value it refused, so a
typo in a deployment stops the process at start instead of surfacing as odd
behaviour hours later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit


class ImproperEnvironment(ValueError):
    """An environment variable holds a value the settings cannot use."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def redact_url(value: str) -> str:
    """`value` fit for an error message or a log: the password and query values hidden.

    A URL setting (DATABASE_URL, REDIS_URL, a provider's base URL) may carry credentials in
    its user info or its query (`?password=`, `?token=`); a startup error must not print them.
    """
    try:
        parts = urlsplit(value)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
        query = "&".join(f"{pair.split('=', 1)[0]}=***" for pair in parts.query.split("&") if pair)
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:
        return "<a value that is not a URL>"


@overload
def env_str(name: str, default: str, *, environ: Mapping[str, str] | None = None) -> str: ...
@overload
def env_str(name: str, default: None = None, *, environ: Mapping[str, str] | None = None) -> str | None: ...
def env_str(name: str, default: str | None = None, *, environ: Mapping[str, str] | None = None) -> str | None:
    value = _raw(name, environ)
    return default if value is None else value


def env_bool(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, environ)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperEnvironment(f"{name}={value!r} is not a boolean; use one of on/off, true/false, yes/no, 1/0.")


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    value = _raw(name, environ)
    if value is None:
        return default
    try:
        parsed = int(value)
    except ValueError:
        raise ImproperEnvironment(f"{name}={value!r} is not an integer.") from None
    if minimum is not None and parsed < minimum:
        raise ImproperEnvironment(f"{name}={parsed} is below the minimum of {minimum}.")
    if maximum is not None and parsed > maximum:
        raise ImproperEnvironment(f"{name}={parsed} is above the maximum of {maximum}.")
    return parsed


def env_choice(
    name: str,
    choices: Sequence[str],
    default: str,
    *,
    environ: Mapping[str, str] | None = None,
) -> str:
    value = _raw(name, environ)
    if value is None:
        return default
    if value not in choices:
        raise ImproperEnvironment(f"{name}={value!r} is not one of: {', '.join(choices)}.")
    return value


def env_list(name: str, default: Sequence[str], *, environ: Mapping[str, str] | None = None) -> list[str]:
    value = _raw(name, environ)
    if value is None:
        return list(default)
    items = [item.strip() for item in value.split(",")]
    if any(item == "" for item in items):
        raise ImproperEnvironment(f"{name}={value!r} has an empty item; separate values with single commas.")
    return items


def env_on_off(name: str, default: bool, *, environ: Mapping[str, str] | None = None) -> bool:
    """A switch spelled exactly `on` or `off`, as the CLI flags are."""
    value = _raw(name, environ)
    if value is None:
        return default
    if value not in ("on", "off"):
        raise ImproperEnvironment(f"{name}={value!r} must be 'on' or 'off'.")
    return value == "on"


def env_secret(name: str, *, environ: Mapping[str, str] | None = None) -> str | None:
    """A secret from NAME, or from the file named by NAME_FILE (for Docker secrets)."""
    direct = _raw(name, environ)
    file_name = _raw(f"{name}_FILE", environ)
    if direct is not None and file_name is not None:
        raise ImproperEnvironment(f"Set {name} or {name}_FILE, not both.")
    if file_name is None:
        return direct
    path = Path(file_name)
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ImproperEnvironment(f"{name}_FILE={file_name!r} cannot be read: {exc.strerror}.") from None
    if not secret:
        raise ImproperEnvironment(f"{name}_FILE={file_name!r} is empty.")
    return secret


@dataclass(frozen=True)
class DatabaseUrl:
    engine: str
    name: str
    user: str
    password: str
    host: str
    port: str
    options: dict[str, str]

    def as_django(self) -> dict[str, object]:
        config: dict[str, object] = {
            "ENGINE": self.engine,
            "NAME": self.name,
            "USER": self.user,
            "PASSWORD": self.password,
            "HOST": self.host,
            "PORT": self.port,
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
        if self.options:
            config["OPTIONS"] = dict(self.options)
        return config


_DB_ENGINES = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "sqlite": "django.db.backends.sqlite3",
}


def parse_database_url(name: str, value: str) -> DatabaseUrl:
    parts = urlsplit(value)
    engine = _DB_ENGINES.get(parts.scheme)
    if engine is None:
        raise ImproperEnvironment(
            f"{name}={redact_url(value)!r} has scheme {parts.scheme!r}; "
            "use postgres:// (or sqlite:///path for development)."
        )
    if engine.endswith("sqlite3"):
        path = unquote(parts.path)
        if not path:
            raise ImproperEnvironment(f"{name}={redact_url(value)!r} names no database file.")
        return DatabaseUrl(engine, path, "", "", "", "", {})
    db_name = unquote(parts.path.lstrip("/"))
    if not db_name:
        raise ImproperEnvironment(
            f"{name}={redact_url(value)!r} names no database; add it as the path, e.g. /controlcenter."
        )
    try:
        port = parts.port
    except ValueError:
        raise ImproperEnvironment(f"{name}={redact_url(value)!r} has a port that is not a number.") from None
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return DatabaseUrl(
        engine,
        db_name,
        unquote(parts.username or ""),
        unquote(parts.password or ""),
        parts.hostname or "",
        str(port or ""),
        options,
    )


def env_database_url(name: str, *, environ: Mapping[str, str] | None = None) -> DatabaseUrl | None:
    value = _raw(name, environ)
    return None if value is None else parse_database_url(name, value)


def env_redis_url(name: str, *, environ: Mapping[str, str] | None = None) -> str | None:
    value = _raw(name, environ)
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ImproperEnvironment(
            f"{name}={redact_url(value)!r} has scheme {parts.scheme!r}; use redis://host:port/db."
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ImproperEnvironment(f"{name}={redact_url(value)!r} names no host.")
    return value


def env_http_url(name: str, *, environ: Mapping[str, str] | None = None) -> str | None:
    value = _raw(name, environ)
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperEnvironment(f"{name}={redact_url(value)!r} is not an http(s) URL with a host.")
    return value
