"""The resident set learns from use (TS-3): a recommendation from what a mode's runs recorded.

What a mode's runs did over the last N days says which deferred tools earn a place in
every request and which resident ones do not. The tools they called (`tool_call` run
events, their subagents' included) decide both ways; which deferred tools they loaded
(ToolActivation), which searches found nothing first (RetrievalMiss) and how many
requests they sent measure the effect.
Each suggestion comes with its measured effect; toolcatalog.services.mode_resident_apply
applies the chosen ones as one new mode version, so the tools prefix changes once.
The same records, paired with what each run called, are a set of real search
queries to measure the ranker on (TS-1, `recorded_tool_queries`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import Count, F, Min, Q, QuerySet
from django.utils import timezone

from agents.models import ModelRequest, Run, RunEvent
from engine.catalog.surface import ModeSpec, Surface, build_surface
from engine.catalog.toolbox import DISCOVERY_TOOLS
from engine.tokens import estimate_json_tokens
from toolcatalog.models import Mode, RetrievalMiss, Tool, ToolActivation
from toolcatalog.selectors import DEFAULT_MODE, catalog_records, mode_spec, surface_context

# A deferred tool called in at least this share of the mode's runs pays for its schema in
# every request; a resident tool called in fewer than this share does not. Calls, not loads: a
# search loads its five best matches, and the four a run never calls would cost every request.
PROMOTE_SHARE = 0.25
DEMOTE_SHARE = 0.02
# Fewer runs than this say nothing reliable either way.
MIN_RUNS = 10
DEFAULT_DAYS = 30
# A run's calls: its own, and its subagents' (stored in the parent run's log, TD-14).
CALL_EVENTS = ("tool_call", "subagent_tool_call")


@dataclass(frozen=True)
class Suggestion:
    name: str
    schema_tokens: int
    runs_using: int  # runs that called it
    share: float
    activations: int = 0
    calls: int = 0
    found_after_miss: int = 0  # runs where a search found nothing before the tool was loaded


@dataclass(frozen=True)
class Recommendation:
    mode: str
    version: int
    days: int
    runs: int
    requests: int
    make_resident: list[Suggestion] = field(default_factory=list)
    make_deferred: list[Suggestion] = field(default_factory=list)
    tool_block_tokens_before: int = 0
    tool_block_tokens_after: int = 0
    activations_saved: int = 0  # loads of the promoted tools in the window that would not have happened
    cache_misses_saved: int = 0  # requests whose cached prefix a load broke (providers without deferred loading)
    activations_added: int = 0  # calls of demoted tools, each of which would have loaded it first
    enough_data: bool = True

    @property
    def changes(self) -> bool:
        return bool(self.make_resident or self.make_deferred)

    @property
    def tokens_per_request(self) -> int:
        return self.tool_block_tokens_after - self.tool_block_tokens_before

    @property
    def tokens_over_window(self) -> int:
        return self.tokens_per_request * self.requests

    @property
    def prefix_changes(self) -> int:
        """How often applying changes the tools prefix: once, and only when something changes."""
        return 1 if self.changes else 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            tokens_per_request=self.tokens_per_request,
            tokens_over_window=self.tokens_over_window,
            prefix_changes=self.prefix_changes,
        )
        return data


def recorded_tool_queries(*, days: int = DEFAULT_DAYS) -> list[dict[str, Any]]:
    """Real tool-search queries with their answer, from what runs recorded (TS-1): a query set for
    `bench search --queries`, in its JSONL shape (`{"id", "query", "gold"}`, plus `source` and `run`).

    The answer is what the run called, never a guess:
    - `miss`: a search that found nothing, and the deferred tools the same run loaded after it and
      called — the queries today's ranker fails on;
    - `search`: a search that loaded tools, and those of them the run called.
    A call counts wherever it falls in the run: a turn's loads and misses are stored when it ends,
    after the events of its calls, so their times cannot order a call against a search. A
    subagent's searches are stored on its parent run, and its calls count with the parent's.
    Left out: empty queries, queries whose run called none of the tools, and tools that
    `catalog export` does not write (MCP tools, and tools no longer in the catalog), which the
    measured catalog could never rank. Oldest first, every run of every mode in the last `days` days.
    """
    window = Q(run__created_at__gte=timezone.now() - dt.timedelta(days=days))
    exported = {tool.name for tool in catalog_records() if tool.source != Tool.Source.MCP}
    called: dict[int, set[str]] = {}
    for run_id, name in RunEvent.objects.filter(window, type__in=CALL_EVENTS).values_list("run_id", "payload__name"):
        if name in exported:
            called.setdefault(run_id, set()).add(name)
    loads: dict[int, list[ToolActivation]] = {}
    for load in ToolActivation.objects.filter(window, run_id__in=list(called)).order_by("created_at", "id"):
        loads.setdefault(load.run_id, []).append(load)
    recorded: list[tuple[dt.datetime, dict[str, Any]]] = []  # oldest first, once sorted
    for miss in RetrievalMiss.objects.filter(window, run_id__in=list(loads)).exclude(query="").order_by("created_at"):
        after = {load.tool_name for load in loads[miss.run_id] if load.created_at >= miss.created_at}
        if gold := sorted(after & called[miss.run_id]):
            recorded.append((miss.created_at, _query(f"miss-{miss.pk}", miss.query, gold, "miss", miss.run_id)))
    searches: dict[tuple[int, str], list[ToolActivation]] = {}
    for run_loads in loads.values():
        for load in run_loads:
            if load.trigger == ToolActivation.Trigger.SEARCH and load.query.strip():
                searches.setdefault((load.run_id, load.query), []).append(load)
    for (run_id, query), found in searches.items():
        if gold := sorted({load.tool_name for load in found} & called[run_id]):
            recorded.append((found[0].created_at, _query(f"search-{found[0].pk}", query, gold, "search", run_id)))
    recorded.sort(key=lambda item: (item[0], item[1]["id"]))
    return [query for _, query in recorded]


def _query(query_id: str, query: str, gold: list[str], source: str, run_id: int) -> dict[str, Any]:
    return {"id": query_id, "query": query, "gold": gold, "source": source, "run": run_id}


def _runs(mode: Mode, since: dt.datetime) -> QuerySet[Run]:
    # Runs started with no mode ran under the default one.
    of_mode = Q(mode=mode) | Q(mode__isnull=True) if mode.name == DEFAULT_MODE else Q(mode=mode)
    return Run.objects.filter(of_mode, created_at__gte=since)


def _surface(spec: ModeSpec) -> Surface:
    return build_surface(catalog_records(), spec, deferral=True)


def resident_recommendation(
    *,
    mode: Mode,
    days: int = DEFAULT_DAYS,
    now: dt.datetime | None = None,
    applying: tuple[Collection[str], Collection[str]] | None = None,
) -> Recommendation:
    """Deferred tools the mode's runs call often enough to be resident, and resident ones they rarely call.

    `applying`: the names a person chose to make resident and deferred; the figures are then those
    of that change (what a new version records), not of everything offered (QA: a version recorded
    -2,711 tokens a request for a change of +42)."""
    since = (now or timezone.now()) - dt.timedelta(days=days)
    runs = _runs(mode, since)
    run_ids = list(runs.values_list("id", flat=True))
    spec = mode_spec(mode)
    surface = _surface(spec)
    base: dict[str, Any] = {"mode": mode.name, "version": mode.version, "days": days, "runs": len(run_ids)}
    requests = ModelRequest.objects.filter(run_id__in=run_ids).count()
    block = surface_context(surface)["tool_block_tokens"]
    if len(run_ids) < MIN_RUNS:
        chosen = surface_context(_surface(spec.with_resident(*applying)))["tool_block_tokens"] if applying else block
        return Recommendation(
            **base,
            requests=requests,
            tool_block_tokens_before=block,
            tool_block_tokens_after=chosen,
            enough_data=False,
        )

    loads = {
        row["tool_name"]: row
        for row in ToolActivation.objects.filter(run_id__in=run_ids)
        .values("tool_name")
        .annotate(activations=Count("id"), runs=Count("run", distinct=True))
    }
    calls: dict[str, Mapping[str, Any]] = {
        row["name"]: row
        for row in RunEvent.objects.filter(run_id__in=run_ids, type__in=CALL_EVENTS)
        .values(name=F("payload__name"))
        .annotate(calls=Count("id"), runs=Count("run", distinct=True))
    }
    first_miss = dict(
        RetrievalMiss.objects.filter(run_id__in=run_ids)
        .values("run_id")
        .annotate(first=Min("created_at"))
        .values_list("run_id", "first")
    )
    first_load = ToolActivation.objects.filter(run_id__in=list(first_miss)).values("run_id", "tool_name")
    after_miss: dict[str, set[int]] = {}
    row: Mapping[str, Any] | None  # a first load, then a tool's loads, then its calls
    for row in first_load.annotate(first=Min("created_at")):
        if first_miss[row["run_id"]] <= row["first"]:
            after_miss.setdefault(row["tool_name"], set()).add(row["run_id"])

    n = len(run_ids)
    promote = []
    for tool in surface.deferred:
        row = calls.get(tool.name)
        if row and row["runs"] / n >= PROMOTE_SHARE:
            promote.append(
                Suggestion(
                    name=tool.name,
                    schema_tokens=estimate_json_tokens(tool.definition()),
                    runs_using=row["runs"],
                    share=round(row["runs"] / n, 3),
                    activations=loads[tool.name]["activations"] if tool.name in loads else 0,
                    calls=row["calls"],
                    found_after_miss=len(after_miss.get(tool.name, ())),
                )
            )
    demote = []
    for tool in surface.resident:
        if tool.name in DISCOVERY_TOOLS or tool.name == spec.output_action:
            continue  # what makes deferral work, and what the mode exists to call
        row = calls.get(tool.name) or {"calls": 0, "runs": 0}
        if row["runs"] / n < DEMOTE_SHARE:
            demote.append(
                Suggestion(
                    name=tool.name,
                    schema_tokens=estimate_json_tokens(tool.definition()),
                    runs_using=row["runs"],
                    share=round(row["runs"] / n, 3),
                    calls=row["calls"],
                )
            )
    promote.sort(key=lambda s: (-s.share, s.name))
    demote.sort(key=lambda s: (s.share, -s.schema_tokens, s.name))
    added, removed = ({s.name for s in promote}, {s.name for s in demote}) if applying is None else map(set, applying)
    promote = [s for s in promote if s.name in added]
    demote = [s for s in demote if s.name in removed]
    after = surface_context(_surface(spec.with_resident(added, removed)))["tool_block_tokens"]
    broken = ModelRequest.objects.filter(run_id__in=run_ids, cache_miss="tool_activation")
    return Recommendation(
        **base,
        requests=requests,
        make_resident=promote,
        make_deferred=demote,
        tool_block_tokens_before=block,
        tool_block_tokens_after=after,
        activations_saved=sum(s.activations for s in promote),
        cache_misses_saved=sum(1 for loaded in broken.values_list("tools_loaded", flat=True) if added & set(loaded)),
        activations_added=sum(s.calls for s in demote),
    )
