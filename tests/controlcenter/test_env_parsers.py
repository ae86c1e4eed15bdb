"""The settings parsers refuse bad values loudly (STYLE #9)."""

from __future__ import annotations

import pytest

from controlcenter.env import (
    ImproperEnvironment,
    env_bool,
    env_choice,
    env_database_url,
    env_http_url,
    env_int,
    env_list,
    env_on_off,
    env_redis_url,
    env_secret,
)


def test_bool_accepts_common_spellings():
    assert env_bool("X", False, environ={"X": "yes"}) is True
    assert env_bool("X", True, environ={"X": "OFF"}) is False
    assert env_bool("X", True, environ={}) is True


def test_bool_refuses_garbage_naming_the_variable():
    with pytest.raises(ImproperEnvironment, match="DEBUG='maybe' is not a boolean"):
        env_bool("DEBUG", False, environ={"DEBUG": "maybe"})


def test_int_refuses_non_numbers_and_values_below_minimum():
    assert env_int("N", 5, environ={"N": "12"}) == 12
    with pytest.raises(ImproperEnvironment, match="not an integer"):
        env_int("N", 5, environ={"N": "12kb"})
    with pytest.raises(ImproperEnvironment, match="below the minimum of 1"):
        env_int("N", 5, minimum=1, environ={"N": "0"})


def test_choice_lists_the_allowed_values():
    assert env_choice("CC_PROVIDER", ["offline", "anthropic", "openai"], "offline", environ={}) == "offline"
    with pytest.raises(ImproperEnvironment, match="offline, anthropic, openai"):
        env_choice("CC_PROVIDER", ["offline", "anthropic", "openai"], "offline", environ={"CC_PROVIDER": "gemini"})


def test_list_splits_on_commas_and_refuses_empty_items():
    assert env_list("ALLOWED_HOSTS", ["a"], environ={"ALLOWED_HOSTS": "x.org, y.org"}) == ["x.org", "y.org"]
    with pytest.raises(ImproperEnvironment, match="empty item"):
        env_list("ALLOWED_HOSTS", [], environ={"ALLOWED_HOSTS": "x.org,,y.org"})


def test_on_off_switch_is_exactly_on_or_off():
    assert env_on_off("CC_SERVER_TOOL_DEFERRAL", True, environ={"CC_SERVER_TOOL_DEFERRAL": "off"}) is False
    with pytest.raises(ImproperEnvironment, match="must be 'on' or 'off'"):
        env_on_off("CC_SERVER_TOOL_DEFERRAL", True, environ={"CC_SERVER_TOOL_DEFERRAL": "false"})


def test_secret_reads_file_variant(tmp_path):
    secret_file = tmp_path / "key"
    secret_file.write_text("s3cret\n")
    assert env_secret("SECRET_KEY", environ={"SECRET_KEY_FILE": str(secret_file)}) == "s3cret"


def test_secret_refuses_both_forms_missing_files_and_empty_files(tmp_path):
    with pytest.raises(ImproperEnvironment, match="not both"):
        env_secret("SECRET_KEY", environ={"SECRET_KEY": "a", "SECRET_KEY_FILE": "/x"})
    with pytest.raises(ImproperEnvironment, match="cannot be read"):
        env_secret("SECRET_KEY", environ={"SECRET_KEY_FILE": str(tmp_path / "missing")})
    empty = tmp_path / "empty"
    empty.write_text("  ")
    with pytest.raises(ImproperEnvironment, match="is empty"):
        env_secret("SECRET_KEY", environ={"SECRET_KEY_FILE": str(empty)})


def test_database_url_parses_postgres_with_credentials_and_options():
    url = env_database_url(
        "DATABASE_URL", environ={"DATABASE_URL": "postgres://cc:p%40ss@db:5433/control?sslmode=require"}
    )
    config = url.as_django()
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["NAME"], config["USER"], config["PASSWORD"], config["HOST"], config["PORT"]) == (
        "control",
        "cc",
        "p@ss",
        "db",
        "5433",
    )
    assert config["OPTIONS"] == {"sslmode": "require"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mysql://db/x", "scheme 'mysql'"),
        ("postgres://db:5432", "names no database"),
        ("postgres://db:port/x", "port that is not a number"),
    ],
)
def test_database_url_refuses_what_it_cannot_use(value, message):
    with pytest.raises(ImproperEnvironment, match=message):
        env_database_url("DATABASE_URL", environ={"DATABASE_URL": value})


def test_redis_and_http_urls_are_checked():
    assert env_redis_url("REDIS_URL", environ={"REDIS_URL": "redis://127.0.0.1:6379/0"})
    with pytest.raises(ImproperEnvironment, match="use redis://"):
        env_redis_url("REDIS_URL", environ={"REDIS_URL": "http://127.0.0.1:6379"})
    with pytest.raises(ImproperEnvironment, match="not an http"):
        env_http_url("OPENAI_BASE_URL", environ={"OPENAI_BASE_URL": "localhost:11434"})


def test_unset_and_blank_values_fall_back_to_defaults():
    assert env_database_url("DATABASE_URL", environ={"DATABASE_URL": "  "}) is None
    assert env_int("N", 7, environ={"N": ""}) == 7
