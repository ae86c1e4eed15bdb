"""BM25 tool search: tokenisation, ranking fields, namespacing, caching per catalog version (TD-6, TD-7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.catalog.ranking import ToolIndex, index_for, no_match_message, words
from engine.catalog.surface import ToolRecord
from tests.support.catalog import reference_records

SCHEMA = {"type": "object", "properties": {}}


@pytest.mark.req("TD-6")
def test_names_split_on_snake_case_camel_case_and_acronyms():
    assert words("assign_ticket") == ["assign", "ticket"]
    assert words("getHTTPServerStatus") == ["get", "http", "server", "status"]
    assert words("fetchURL2json") == ["fetch", "url", "2", "json"]


@pytest.mark.req("TD-6")
def test_a_tool_is_found_by_its_parameter_descriptions_and_group_heading():
    tools = [
        ToolRecord(
            name="xq",
            group="Weather",
            description="Run it.",
            input_schema={
                "type": "object",
                "properties": {"latitude": {"type": "number", "description": "Degrees north of the equator."}},
            },
        ),
        ToolRecord(name="zz", group="Other", description="Something unrelated entirely.", input_schema=SCHEMA),
    ]
    index = ToolIndex(tools)
    assert [m.tool.name for m in index.search("equator latitude")] == ["xq"]
    assert [m.tool.name for m in index.search("weather")] == ["xq"]


@pytest.mark.req("TD-6")
def test_the_reference_catalog_answers_plain_requests():
    index = ToolIndex(reference_records())
    assert "assign_ticket" in [m.tool.name for m in index.search("assign a ticket to someone", k=3)]
    assert "git_blame" in [m.tool.name for m in index.search("who last changed this line of code", k=5)]
    # Stemming: 'schedules' finds the schedule tools.
    assert any(m.tool.name.endswith("schedule") or "schedul" in m.tool.name for m in index.search("schedules"))


@pytest.mark.req("TD-6")
def test_a_clause_that_points_at_another_tool_does_not_pull_queries_to_the_wrong_one():
    index = ToolIndex(reference_records())
    # read_file's description says 'use read_document for PDF or Office files'.
    top = [m.tool.name for m in index.search("read a PDF", k=2)]
    assert top[0] == "read_document"


@pytest.mark.req("TD-6")
def test_equal_names_from_two_servers_rank_as_distinct_tools():
    tools = [
        ToolRecord(
            name="jira__create_issue", group="jira", description="Create an issue in Jira.", input_schema=SCHEMA
        ),
        ToolRecord(
            name="linear__create_issue", group="linear", description="Create an issue in Linear.", input_schema=SCHEMA
        ),
    ]
    index = ToolIndex(tools)
    names = [m.tool.name for m in index.search("create an issue in linear")]
    assert names == ["linear__create_issue", "jira__create_issue"]
    # The server prefix is a namespace: 'jira' alone does not match the name field.
    assert [m.tool.name for m in index.search("jira")] == ["jira__create_issue"]


@pytest.mark.req("TD-6")
def test_search_is_limited_to_the_allowed_names():
    index = ToolIndex(reference_records())
    allowed = {"create_ticket", "get_ticket"}
    assert {m.tool.name for m in index.search("assign a ticket to someone", allowed=allowed)} <= allowed


@pytest.mark.req("TD-6")
def test_the_index_is_built_once_per_catalog_version():
    records = reference_records()
    first = index_for(records)
    assert index_for(list(records)) is first
    changed = [replace(records[0], description=records[0].description + " Also reads tarballs."), *records[1:]]
    assert index_for(changed) is not first


@pytest.mark.req("TD-6")
def test_nothing_matches_a_query_of_unknown_words_or_only_stopwords():
    index = ToolIndex(reference_records())
    assert index.search("zzqx wobblefrump") == []
    assert index.search("the of and") == []
    assert ToolIndex([]).search("anything") == []
    message = no_match_message("zzqx")
    assert message.startswith("No tool on this run's surface matches 'zzqx'.")
    assert "does not mean the capability is missing" in message
