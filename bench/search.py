"""Tool-search quality and speed (TD-6): recall@1, recall@k, MRR and latency per query.

Reads our catalog format (toolcatalog.json + JSONL queries with `gold`) and the public
formats in shared/data/public/: ToolRet (tools.json with `documentation`, queries.json
with `labels`; the leaky `instruction` field is never read) and MetaTool
(plugin_des.json name -> description, queries with `tool`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from engine.catalog.ranking import ToolIndex
from engine.catalog.surface import ToolRecord
from toolcatalog.catalogfile import records_from_catalog


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--catalog", required=True, help="toolcatalog.json, ToolRet tools.json or MetaTool plugin_des.json"
    )
    parser.add_argument(
        "--queries", help="JSONL (id, query, gold, difficulty), ToolRet queries.json or MetaTool queries"
    )
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--synthetic", type=int, default=0, help="grow the catalog to this many tools (latency)")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N queries")
    parser.add_argument("--ranker", choices=["bm25", "hybrid"], default="bm25", help="hybrid needs the semantic extra")


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
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    queries = []
    for i, item in enumerate(data):
        gold = [label["id"] for label in item["labels"]] if "labels" in item else list(item["tool"])
        queries.append({"id": item.get("id", str(i)), "query": item["query"], "gold": gold})
    return queries


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


def evaluate(index: ToolIndex, queries: list[dict[str, Any]], k: int) -> dict[str, Any]:
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


def run(options: dict[str, Any]) -> dict[str, Any]:
    tools = load_tools(Path(options["catalog"]))
    if options["synthetic"]:
        tools = synthetic(tools, options["synthetic"])
    started = time.perf_counter()
    index = ToolIndex(tools)
    if options.get("ranker") == "hybrid":
        from engine.catalog.semantic import HybridIndex, default_encoder, tool_embeddings

        encode = default_encoder()
        started = time.perf_counter()  # loading the model is not building the index
        fingerprint = "bench"  # never stored: cache_dir is None
        index = HybridIndex(
            index, tool_embeddings(tools, fingerprint=fingerprint, encode=encode, cache_dir=None), encode
        )
    build_ms = (time.perf_counter() - started) * 1000
    if options["queries"]:
        queries = load_queries(Path(options["queries"]))
    else:
        queries = [{"query": tool.description, "gold": [tool.name]} for tool in tools[:200]]
    if options["limit"]:
        queries = queries[: options["limit"]]
    figures = evaluate(index, queries, options["k"])
    figures.update(
        {"n_tools": len(tools), "build_ms": round(build_ms, 1), "k": options["k"], "ranker": options.get("ranker")}
    )
    return figures
