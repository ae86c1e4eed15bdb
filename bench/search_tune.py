"""Choose ranker settings on the **tune parts only** (TS-1), with cross-validation of the choice.

    python manage.py bench search_tune --grid '{"ranking.K1": [0.9, 1.2], "semantic.LEXICAL_SHARE": [0.3, 0.4]}'

Every combination of the grid is run over the tune part of each split set (tool-queries-dev,
ToolRet apigen, MetaTool; never a test part, and never our own never-tuned queries). A name
is `ranking.X` / `semantic.X` for a module constant of engine/catalog/ranking.py or
semantic.py, `ranking.FIELD_WEIGHTS.name` for one entry of a dict constant; the constants
are restored afterwards. The figures:

- `settings`: recall@k per set on the whole tune part, for every combination;
- `cross_validation`: the choice itself, validated: the tune part is cut into `--folds`
  folds; for each fold the best combination on the other folds (recall@k summed over the
  sets) is picked and scored on the held-out fold. Its mean is what picking by this grid
  is worth on queries the pick never saw; if it is well below the winner's tune figure,
  the winner is fitting noise.

The test parts are measured afterwards with `bench search`, once per design.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
from argparse import ArgumentTypeError
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bench._options import positive
from bench.search import DEFAULT_DATA, SETS, Ranker, load_queries, load_tools, split_part
from controlcenter.cli import whole_number
from engine.catalog import ranking, semantic
from engine.catalog.ranking import ToolIndex
from engine.catalog.surface import ToolRecord

MODULES = {"ranking": ranking, "semantic": semantic}


def _grid(value: str) -> dict[str, list[Any]]:
    """`{"MODULE.NAME": [value, ...], ...}` naming constants of MODULES, each with values to try."""
    try:
        grid = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ArgumentTypeError('write a JSON object of non-empty lists, e.g. {"ranking.K1": [0.9, 1.2]}')
    for dotted in grid:
        module_name, _, rest = dotted.partition(".")
        if module_name not in MODULES or not hasattr(MODULES[module_name], rest.partition(".")[0]):
            raise ArgumentTypeError(f"{dotted!r} names no constant of {', '.join(MODULES)}")
    return grid


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="the shared data folder (default ../shared/data)")
    parser.add_argument("--set", action="append", help="only these sets (tune parts)")
    parser.add_argument(
        "--grid", type=_grid, default="{}", help='JSON: {"ranking.K1": [0.9, 1.2], ...}; {} runs today\'s settings'
    )
    parser.add_argument("--ranker", choices=["bm25", "hybrid"], default="bm25")
    parser.add_argument("--folds", type=whole_number(2), default=5)
    parser.add_argument("--k", type=positive, default=5)


@contextmanager
def patched(setting: dict[str, Any]) -> Iterator[None]:
    """Module constants set to `setting` for the duration, then restored."""
    undo: list[tuple[Any, str, Any]] = []
    try:
        for dotted, value in setting.items():
            module_name, _, rest = dotted.partition(".")
            target: Any = MODULES[module_name]
            name, _, key = rest.partition(".")
            if key:
                container = getattr(target, name)
                undo.append((container, key, container[key]))
                container[key] = value
            else:
                undo.append((target, name, getattr(target, name)))
                setattr(target, name, value)
        yield
    finally:
        for target, name, value in reversed(undo):
            if isinstance(target, dict):
                target[name] = value
            else:
                setattr(target, name, value)


class _CachedEncoder:
    """The model's encoder, remembering query vectors: every combination asks the same queries."""

    def __init__(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        missing = [text for text in dict.fromkeys(texts) if text not in self._vectors]
        if missing:
            for text, vector in zip(missing, semantic.default_encoder()(missing), strict=True):
                self._vectors[text] = vector
        return np.stack([self._vectors[text] for text in texts])


def _ranker(kind: str, tools: list[ToolRecord], encoder: _CachedEncoder | None) -> Ranker:
    index = ToolIndex(tools)
    if kind == "bm25":
        return index
    from django.conf import settings

    assert encoder is not None
    embeddings = semantic.tool_embeddings(
        tools,
        fingerprint=ranking.catalog_fingerprint(tools),
        encode=semantic.default_encoder(),
        cache_dir=settings.CC_TOOL_EMBEDDINGS_DIR,
    )
    return semantic.HybridIndex(index, embeddings, encoder)


def _recalls(index: Ranker, queries: list[dict[str, Any]], k: int) -> list[float]:
    from bench.search import _gold_key

    found = []
    for query in queries:
        names = [_gold_key(match.tool.name, query["gold"]) for match in index.search(query["query"], k=k)]
        gold = set(query["gold"])
        found.append(len(gold & set(names[:k])) / len(gold))
    return found


def _folds(n: int, folds: int) -> list[int]:
    """Each query's fold, fixed by a seed so that every run cuts the same folds."""
    order = list(range(n))
    random.Random(20).shuffle(order)
    assignment = [0] * n
    for position, i in enumerate(order):
        assignment[i] = position % folds
    return assignment


def run(options: dict[str, Any]) -> dict[str, Any]:
    data = Path(options["data"])
    grid: dict[str, list[Any]] = options["grid"]
    combinations = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())] or [{}]
    k, folds = options["k"], options["folds"]
    encoder = _CachedEncoder() if options["ranker"] == "hybrid" else None
    sets = []
    for query_set in SETS:
        if query_set.split is None or (options.get("set") and query_set.name not in options["set"]):
            continue
        queries = split_part(load_queries(data / query_set.queries), query_set.split, "tune")
        sets.append((query_set.name, load_tools(data / query_set.catalog), queries))
    # per combination, per set: one recall@k per tune query
    found: list[dict[str, list[float]]] = []
    for setting in combinations:
        with patched(setting):
            found.append(
                {name: _recalls(_ranker(options["ranker"], tools, encoder), qs, k) for name, tools, qs in sets}
            )
    assignments = {name: _folds(len(qs), folds) for name, _, qs in sets}

    def score(i: int, name: str, fold: int, *, inside: bool) -> float:
        """Mean recall of combination i on one fold (inside) or on every other fold."""
        values = [
            value for value, where in zip(found[i][name], assignments[name], strict=True) if (where == fold) == inside
        ]
        return statistics.fmean(values) if values else 0.0

    held_out: dict[str, list[float]] = {name: [] for name, _, _ in sets}
    picks = []
    for fold in range(folds):
        best = max(
            range(len(combinations)),
            key=lambda i, fold=fold: (sum(score(i, name, fold, inside=False) for name, _, _ in sets), -i),
        )
        picks.append(combinations[best])
        for name, _, _ in sets:
            held_out[name].append(score(best, name, fold, inside=True))
    return {
        "part": "tune",
        "ranker": options["ranker"],
        "k": k,
        "n_queries": {name: len(qs) for name, _, qs in sets},
        "settings": [
            {"setting": setting, **{name: round(statistics.fmean(found[i][name]), 4) for name, _, _ in sets}}
            for i, setting in enumerate(combinations)
        ],
        "cross_validation": {
            "folds": folds,
            "picked": picks,
            f"held_out_recall_at_{k}": {name: round(statistics.fmean(values), 4) for name, values in held_out.items()},
        },
    }
