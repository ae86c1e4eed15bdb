"""BM25 tool search: tokenisation, ranking fields, namespacing, caching per catalog version (TD-6, TD-7),
and never below plain rank-bm25 on the frozen test parts (TS-1)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.search import HERE as SEARCH_DATA
from bench.search import PlainBM25, evaluate, load_queries, load_tools, split_part
from bench.search import run as bench_run
from bench.search_tune import run as tune_run
from engine.catalog import ranking
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
@pytest.mark.req("TS-1")
@pytest.mark.parametrize(
    ("query", "tool"),
    [
        ("remind me on Monday to renew the TLS certificate", "create_reminder"),
        ("please remember that my editor of choice is vim", "save_memory"),
        ("is anything uncommitted in the repo right now?", "git_status"),
        ("can we meet with the platform team next Tuesday morning?", "create_calendar_event"),
        ("the nightly export query is slow, find out what it is doing", "explain_query"),
    ],
)
def test_everyday_words_reach_the_tool_whose_description_uses_other_words(query, tool):
    index = ToolIndex(reference_records())
    assert tool in [m.tool.name for m in index.search(query, k=5)]


@pytest.mark.req("TS-1")
def test_an_everyday_word_adds_its_tool_words_below_the_querys_own_words():
    weighted = ranking.query_terms("remember the deploy date")
    assert weighted[ranking.terms("memory")[0]] == ranking.EVERYDAY_WEIGHT < weighted[ranking.terms("deploy")[0]]


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


# The tests folder, wherever in it this module lives.
TESTS = next(folder for folder in Path(__file__).resolve().parents if folder.name == "tests")
SETS = TESTS / "data" / "search"
OWN_QUERIES = TESTS.parent / "bench" / "search_data" / "tool-queries-own.jsonl"


def _recall_at_5(index, queries) -> float:
    return evaluate(index, queries, 5)["recall_at_5"]


@pytest.mark.req("TS-1")
@pytest.mark.parametrize(
    ("catalog", "queries"),
    [
        ("metatool-tools.json", "metatool-test.json"),
        ("apigen-tools.json", "apigen-test.json"),
        (None, "tool-queries-dev-test.jsonl"),
        (None, OWN_QUERIES),
    ],
)
def test_bm25_is_never_below_plain_rank_bm25_on_test_parts(catalog, queries):
    # Test parts of the frozen splits (and our never-tuned queries): nothing here was tuned on.
    tools = load_tools(SETS / catalog) if catalog else reference_records()
    asked = load_queries(SETS / queries)
    ours = _recall_at_5(ToolIndex(tools), asked)
    plain = _recall_at_5(PlainBM25(tools), asked)
    assert ours >= plain, f"BM25 {ours} < plain rank-bm25 {plain}"


@pytest.mark.req("TS-1")
def test_the_splits_are_frozen_disjoint_and_cover_every_query():
    for name in ("tool-queries-dev", "toolret-apigen", "metatool"):
        split = json.loads((SEARCH_DATA / f"{name}.split.json").read_text(encoding="utf-8"))
        assert split["seed"] == 20
        assert not set(split["tune"]) & set(split["test"])
        assert abs(len(split["tune"]) - len(split["test"])) <= 1
    dev = [json.loads(line)["id"] for line in (SETS / "tool-queries-dev-test.jsonl").read_text().splitlines()]
    assert split_part([{"id": i} for i in dev], "tool-queries-dev.split.json", "tune") == []


@pytest.mark.req("TS-1")
def test_the_bench_labels_a_tune_part_as_tuned_on(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    catalog = (TESTS / "data" / "toolcatalog.json").read_text(encoding="utf-8")
    (data / "toolcatalog.json").write_text(catalog, encoding="utf-8")
    (data / "tool-queries-dev.jsonl").write_text(
        (SETS / "tool-queries-dev-test.jsonl").read_text(encoding="utf-8"), encoding="utf-8"
    )
    base = {"data": str(data), "set": ["tool-queries-dev"], "catalog": None, "queries": None, "k": 5}
    base.update({"synthetic": 0, "limit": 0, "ranker": ["bm25", "plain"]})
    tested = bench_run({**base, "part": "test"})["sets"]["tool-queries-dev"]
    assert tested["label"] == "tool-queries-dev"
    assert set(tested["rankers"]) == {"bm25", "plain"} and tested["rankers"]["bm25"]["n_queries"] == 60
    # The copy holds only test queries, so its tune part is empty and not reported at all.
    assert bench_run({**base, "part": "tune"})["sets"] == {}
    (data / "tool-queries-dev.jsonl").write_text(
        '{"id": "dev-002", "query": "which modules import requests_cache", "gold": ["grep_code"]}\n', encoding="utf-8"
    )
    tuned = bench_run({**base, "part": "tune"})["sets"]["tool-queries-dev"]
    assert tuned["label"] == "tool-queries-dev (tuned on)"


@pytest.mark.req("TS-1")
def test_the_tuning_bench_sees_only_tune_queries_and_restores_the_settings(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "toolcatalog.json").write_text(
        (TESTS / "data" / "toolcatalog.json").read_text(encoding="utf-8"), encoding="utf-8"
    )
    # Two tune queries (ids of the frozen tune part) and the whole test part.
    tune = [
        '{"id": "dev-001", "query": "show me config/settings.py from line 200", "gold": ["read_file"]}',
        '{"id": "dev-006", "query": "assign a ticket to someone", "gold": ["assign_ticket"]}',
    ]
    test = (SETS / "tool-queries-dev-test.jsonl").read_text(encoding="utf-8").splitlines()
    (data / "tool-queries-dev.jsonl").write_text("\n".join(tune + test) + "\n", encoding="utf-8")
    k1, weights = ranking.K1, dict(ranking.FIELD_WEIGHTS)
    figures = tune_run(
        {
            "data": str(data),
            "set": ["tool-queries-dev"],
            "grid": {"ranking.K1": [0.5, 3.0], "ranking.FIELD_WEIGHTS.name": [0.0]},
            "ranker": "bm25",
            "folds": 2,
            "k": 5,
        }
    )
    assert figures["part"] == "tune" and figures["n_queries"] == {"tool-queries-dev": 2}
    assert [row["setting"] for row in figures["settings"]] == [
        {"ranking.K1": 0.5, "ranking.FIELD_WEIGHTS.name": 0.0},
        {"ranking.K1": 3.0, "ranking.FIELD_WEIGHTS.name": 0.0},
    ]
    assert len(figures["cross_validation"]["picked"]) == 2
    assert k1 == ranking.K1 and weights == ranking.FIELD_WEIGHTS


@pytest.mark.req("TD-6")
def test_the_ranker_reads_a_query_only_up_to_its_limit():
    # Whoever calls it: the literal patterns cost the square of a word's length beyond it.
    long = "assign a ticket " + "x" * 1_000_000
    assert ranking.query_terms(long) == ranking.query_terms(long[: ranking.MAX_QUERY_CHARS])
    assert ranking.query_terms(long)  # the words before the limit still count
