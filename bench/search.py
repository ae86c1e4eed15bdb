"""Tool-search quality and speed (TD-6, TS-1): recall@1, recall@k, MRR and latency per query.

With no options it runs every known query set on the **test part** of its frozen
split (bench/search_data/*.split.json, seed 20) with our BM25, the plain
`rank-bm25` baseline (Okapi, default parameters, the same tokenisation) and, when
the semantic model is there, the hybrid ranker, all in one run. `--part tune`
reports the part the ranker was tuned on, labelled "(tuned on)".

Sets: our reference catalog with tool-queries-dev (split) and our own never-tuned
queries (bench/search_data/tool-queries-own.jsonl, all test), ToolRet apigen and
MetaTool from shared/data/public (split). Formats: our catalog + JSONL with
`gold`; ToolRet (tools.json with `documentation`, queries.json with `labels`; the
leaky `instruction` field is never read); MetaTool (plugin_des.json name ->
description, queries with `tool`). `--catalog/--queries` measures any one file pair.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rank_bm25 import BM25Okapi

from bench._options import non_negative, positive
from engine.catalog.ranking import Match, ToolIndex, parameter_text, terms
from engine.catalog.surface import ToolRecord
from toolcatalog.catalogfile import records_from_catalog

HERE = Path(__file__).resolve().parent / "search_data"
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@dataclass(frozen=True)
class QuerySet:
    name: str
    catalog: str  # relative to the data folder, or absolute
    queries: str
    split: str | None  # a split file in bench/search_data; None: never tuned on, all test


SETS = [
    QuerySet("tool-queries-dev", "toolcatalog.json", "tool-queries-dev.jsonl", "tool-queries-dev.split.json"),
    QuerySet("tool-queries-own", "toolcatalog.json", str(HERE / "tool-queries-own.jsonl"), None),
    QuerySet(
        "toolret-apigen",
        "public/toolret-apigen/tools.json",
        "public/toolret-apigen/queries.json",
        "toolret-apigen.split.json",
    ),
    QuerySet(
        "metatool",
        "public/metatool/plugin_des.json",
        "public/metatool/multi_tool_query_golden.json",
        "metatool.split.json",
    ),
]


class Ranker(Protocol):
    def search(self, query: str, *, k: int = 5) -> list[Match]: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="the shared data folder (default ../shared/data)")
    parser.add_argument("--set", action="append", choices=[s.name for s in SETS], help="only these sets")
    parser.add_argument("--part", choices=["test", "tune", "all"], default="test", help="default: the test part")
    parser.add_argument("--catalog", help="one catalog file instead of the known sets")
    parser.add_argument("--queries", help="its queries (JSONL with gold, ToolRet queries.json, MetaTool)")
    parser.add_argument("--k", type=positive, default=5)
    parser.add_argument(
        "--synthetic", type=non_negative, default=0, help="grow the catalog to this many tools (latency)"
    )
    parser.add_argument("--limit", type=non_negative, default=0, help="use only the first N queries")
    parser.add_argument(
        "--ranker",
        action="append",
        choices=["bm25", "plain", "hybrid"],
        help="default: bm25 and plain, plus hybrid when the semantic model is available",
    )


def load_tools(path: Path) -> list[ToolRecord]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and "tools" in data:
        return records_from_catalog(data)
    if isinstance(data, list) and data and "documentation" in data[0]:
        return [_toolret_record(item) for item in data]
    if isinstance(data, dict):
        return [
            ToolRecord(name=name, group="", description=text, input_schema={"type": "object"})
            for name, text in data.items()
        ]
    raise SystemExit(f"{path}: not a catalog format this benchmark knows")


def _toolret_record(item: dict[str, Any]) -> ToolRecord:
    doc = item["documentation"]
    parameters = doc.get("parameters") or {}
    properties = parameters.get("properties", parameters) if isinstance(parameters, dict) else {}
    properties = {
        name: {"description": str(spec.get("description", ""))} if isinstance(spec, dict) else {}
        for name, spec in properties.items()
    }
    # Documentation names repeat across APIs, like tools of different MCP servers: the
    # unique id becomes the namespace, and the ranker sees the tool's own name.
    return ToolRecord(
        name=f"{item['id']}__{doc.get('name', '')}",
        group=item.get("type", ""),
        description=str(doc.get("description", "")),
        input_schema={"type": "object", "properties": properties},
    )


def load_queries(path: Path) -> list[dict[str, Any]]:
    """The queries of a file: JSON lines of {"query", "gold"}, or a JSON list of {"query", "labels" or
    "tool"}. A file of another shape is a ValueError naming the item (it was a TypeError traceback)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        items = json.loads(text)
        if not isinstance(items, list):
            raise ValueError(f"{path}: a JSON list of queries was expected")
    queries = []
    for i, item in enumerate(items):
        try:
            if "gold" in item:
                gold = list(item["gold"])
            elif "labels" in item:
                gold = [label["id"] for label in item["labels"]]
            else:
                gold = list(item["tool"])
            query = item["query"]
        except (KeyError, TypeError) as exc:
            shape = '{"query", "gold" | "labels" | "tool"}'
            raise ValueError(f"{path}: query {i + 1} is not {shape} ({exc!r})") from None
        if not isinstance(query, str) or not all(isinstance(name, str) for name in gold):
            raise ValueError(f"{path}: query {i + 1} needs a text query and tool names as its gold")
        queries.append({"id": str(item.get("id", i)), "query": query, "gold": gold})
    return queries


def split_part(queries: list[dict[str, Any]], split_file: str | None, part: str) -> list[dict[str, Any]]:
    """The queries of one frozen part; a set with no split is never tuned on, so all of it is test."""
    if split_file is None:
        return queries if part in ("test", "all") else []
    if part == "all":
        return queries
    split = json.loads((HERE / split_file).read_text(encoding="utf-8"))
    wanted = set(split[part])
    return [query for query in queries if str(query["id"]) in wanted]


class PlainBM25:
    """The baseline: rank-bm25's Okapi with its default parameters over each tool's flattened text.

    Same tokenisation as ours (words split on case and `_`, stop words, stemming);
    no fields, no query weighting, no diversification.
    """

    def __init__(self, tools: Sequence[ToolRecord]) -> None:
        self.tools = list(tools)
        corpus = [terms(flat_text(tool)) or ["\x00empty"] for tool in self.tools]
        self._okapi = BM25Okapi(corpus)

    def search(self, query: str, *, k: int = 5) -> list[Match]:
        words = terms(query)
        if not words or not self.tools:
            return []
        scores = self._okapi.get_scores(words)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
        return [Match(self.tools[i], float(scores[i])) for i in order if scores[i] > 0]


def flat_text(tool: ToolRecord) -> str:
    bare = tool.name.rpartition("__")[2]
    return f"{bare} {tool.group} {tool.description} {parameter_text(tool.input_schema)}"


def synthetic(tools: list[ToolRecord], size: int) -> list[ToolRecord]:
    """Grow a catalog with namespaced copies whose descriptions are shuffled, like many MCP servers."""
    rng = random.Random(7)
    grown = list(tools)
    server = 0
    while len(grown) < size:
        server += 1
        for tool in tools:
            if len(grown) >= size:
                break
            words = tool.description.split()
            rng.shuffle(words)
            grown.append(
                ToolRecord(
                    name=f"srv{server}__{tool.name.split('__')[-1]}",
                    group=f"server {server}",
                    description=" ".join(words),
                    input_schema=tool.input_schema,
                )
            )
    return grown


def _gold_key(name: str, gold: list[str]) -> str:
    namespace = name.split("__", 1)[0]
    return namespace if namespace in gold else name


def evaluate(index: Ranker, queries: list[dict[str, Any]], k: int) -> dict[str, Any]:
    per_query = []
    timings = []
    for query in queries:
        started = time.perf_counter()
        matches = index.search(query["query"], k=max(k, 10))
        timings.append((time.perf_counter() - started) * 1000)
        # A namespaced name counts for its namespace's id (ToolRet ids, MCP servers).
        names = [_gold_key(match.tool.name, query["gold"]) for match in matches]
        gold = set(query["gold"])
        first = next((rank for rank, name in enumerate(names, 1) if name in gold), None)
        per_query.append(
            {
                "difficulty": query.get("difficulty"),
                "r1": len(gold & set(names[:1])) / len(gold),
                "rk": len(gold & set(names[:k])) / len(gold),
                "rr": 1 / first if first else 0.0,
            }
        )

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "recall_at_1": round(statistics.fmean(r["r1"] for r in rows), 4),
            f"recall_at_{k}": round(statistics.fmean(r["rk"] for r in rows), 4),
            "mrr": round(statistics.fmean(r["rr"] for r in rows), 4),
            "n_queries": len(rows),
        }

    figures = summary(per_query)
    by_difficulty: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in per_query:
        if row["difficulty"]:
            by_difficulty[row["difficulty"]].append(row)
    if by_difficulty:
        figures["by_difficulty"] = {name: summary(rows) for name, rows in sorted(by_difficulty.items())}
    timings.sort()
    figures["p50_ms"] = round(timings[len(timings) // 2], 3)
    figures["p99_ms"] = round(timings[min(len(timings) - 1, int(len(timings) * 0.99))], 3)
    return figures


def _rankers(options: dict[str, Any]) -> list[str]:
    if options.get("ranker"):
        return list(dict.fromkeys(options["ranker"]))
    from engine.catalog import semantic

    return ["bm25", "plain", *(["hybrid"] if semantic.available() else [])]


def build(ranker: str, tools: list[ToolRecord]) -> tuple[Ranker, float]:
    """The ranker over `tools` and its build time in ms (loading a model is not building).

    Tool embeddings are stored like the product stores them (CC_TOOL_EMBEDDINGS_DIR, per
    catalog version), so only the first hybrid run over a catalog pays for embedding it.
    """
    if ranker == "hybrid":
        from django.conf import settings

        from engine.catalog.ranking import catalog_fingerprint
        from engine.catalog.semantic import HybridIndex, default_encoder, tool_embeddings

        encode = default_encoder()
        started = time.perf_counter()
        embeddings = tool_embeddings(
            tools, fingerprint=catalog_fingerprint(tools), encode=encode, cache_dir=settings.CC_TOOL_EMBEDDINGS_DIR
        )
        index: Ranker = HybridIndex(ToolIndex(tools), embeddings, encode)
    else:
        started = time.perf_counter()
        index = ToolIndex(tools) if ranker == "bm25" else PlainBM25(tools)
    return index, (time.perf_counter() - started) * 1000


def measure(
    tools: list[ToolRecord], queries: list[dict[str, Any]], rankers: list[str], k: int
) -> dict[str, dict[str, Any]]:
    results = {}
    for ranker in rankers:
        index, build_ms = build(ranker, tools)
        figures = evaluate(index, queries, k)
        figures["build_ms"] = round(build_ms, 1)
        results[ranker] = figures
    return results


def run(options: dict[str, Any]) -> dict[str, Any]:
    rankers = _rankers(options)
    k = options["k"]
    if options.get("queries") and not options.get("catalog"):
        raise ValueError("--queries needs --catalog: the tools its gold names are in (it was silently ignored)")
    if options.get("catalog"):
        tools = load_tools(Path(options["catalog"]))
        if options["synthetic"]:
            tools = synthetic(tools, options["synthetic"])
        if options.get("queries"):
            queries = load_queries(Path(options["queries"]))
        else:
            queries = [{"query": tool.description, "gold": [tool.name]} for tool in tools[:200]]
        if options["limit"]:
            queries = queries[: options["limit"]]
        return {"n_tools": len(tools), "k": k, "rankers": measure(tools, queries, rankers, k)}
    data = Path(options["data"])
    part = options["part"]
    figures: dict[str, Any] = {"k": k, "part": part, "sets": {}}
    for query_set in SETS:
        if options.get("set") and query_set.name not in options["set"]:
            continue
        tools = load_tools(data / query_set.catalog)
        queries = split_part(load_queries(data / query_set.queries), query_set.split, part)
        if options["limit"]:
            queries = queries[: options["limit"]]
        if not queries:
            continue
        label = query_set.name if part == "test" or query_set.split is None else f"{query_set.name} (tuned on)"
        if part == "all" and query_set.split is not None:
            label = f"{query_set.name} (tune and test; half of it tuned on)"
        figures["sets"][query_set.name] = {
            "label": label,
            "part": part if query_set.split is not None else "never tuned on",
            "n_tools": len(tools),
            "rankers": measure(tools, queries, rankers, k),
        }
    return figures
