"""A tool call's arguments against its schema (TD-5): what the model is told when they do not fit."""

from __future__ import annotations

import pytest

from engine.catalog.schemas import arguments_problem

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["path"],
}


@pytest.mark.req("TD-5")
def test_an_argument_the_schema_does_not_name_is_refused_with_a_guess_at_the_one_meant():
    problem = arguments_problem(SCHEMA, {"path": "a.txt", "limt": 5})
    assert problem == (
        "Additional properties are not allowed ('limt' was unexpected). It takes: path, limit; "
        "did you mean 'limit' for 'limt'?"
    )
    assert arguments_problem(SCHEMA, {"path": "a.txt", "colour": "red"}).endswith("It takes: path, limit.")
    assert arguments_problem(SCHEMA, {"path": "a.txt", "limit": 5}) is None


@pytest.mark.req("TD-5")
@pytest.mark.parametrize(
    "schema",
    [
        {**SCHEMA, "additionalProperties": True},
        {**SCHEMA, "additionalProperties": {"type": "string"}},
        {**SCHEMA, "patternProperties": {"^x-": {}}},
        {"type": "object"},
    ],
)
def test_a_schema_that_says_what_other_arguments_may_be_keeps_its_own_rule(schema):
    assert arguments_problem(schema, {"path": "a.txt", "colour": "red"}) is None


@pytest.mark.req("TD-5")
def test_the_check_never_changes_the_schema_the_model_sees():
    before = repr(SCHEMA)
    arguments_problem(SCHEMA, {"path": "a.txt", "other": 1})
    assert repr(SCHEMA) == before and "additionalProperties" not in SCHEMA
