"""The resident set learns from use (TS-3): a recommendation from a scripted history, applied as a new version."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.utils import timezone

from agents.models import ModelRequest, Run, RunEvent
from agents.resident import resident_recommendation
from engine.catalog.toolbox import Activation
from engine.tokens import estimate_json_tokens, estimate_text_tokens
from tests.support.catalog import CATALOG_PATH
from tests.support.factories import ModeFactory, ModelRequestFactory, RunFactory
from toolcatalog.models import Mode, ModeVersion, RetrievalMiss, ToolActivation
from toolcatalog.selectors import run_surface
from toolcatalog.services import ResidentChangeRefused, activations_record, catalog_import, mode_resident_apply
from toolcatalog.toolbox import run_toolbox


def _run(owner, mode: Mode, *, days_ago: float = 1) -> Run:
    run = RunFactory(conversation__owner=owner, conversation__title="history", trigger__text="go", model="m", mode=mode)
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - dt.timedelta(days=days_ago))
    return run


def _history(owner) -> tuple[Mode, list[str]]:
    """12 runs in the window: half load git_status and git_log with one search (two after a failed
    search) and call git_status, never git_log; one loads web_search; every resident tool is called in
    a third of the runs except kill_background and todo_list. 6 older runs, outside the window, all
    loaded and called web_search."""
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    mode = ModeFactory(name="coder", allow=["*"])
    resident = [tool.name for tool in run_surface(mode=mode, deferral=True)[0].resident]
    called = [name for name in resident if name not in ("kill_background", "todo_list")]
    events = []
    for i in range(12):
        run = _run(owner, mode)
        ModelRequestFactory(run=run)
        events += [
            RunEvent(run=run, seq=seq, type="tool_call", payload={"name": name, "input": {}})
            for seq, name in enumerate(called)
            if (i + seq) % 3 == 0
        ]
        if i % 2 == 0:
            if i < 4:
                RetrievalMiss.objects.create(run=run, query="repo state")
            ToolActivation.objects.create(run=run, tool_name="git_status", trigger="search", query="git state")
            ToolActivation.objects.create(run=run, tool_name="git_log", trigger="search", query="git state")
            events.append(RunEvent(run=run, seq=100, type="tool_call", payload={"name": "git_status", "input": {}}))
            ModelRequest.objects.create(
                run=run, step=2, model="m", tools_loaded=["git_status"], cache_miss="tool_activation"
            )
        if i == 1:
            ToolActivation.objects.create(run=run, tool_name="web_search", trigger="direct")
    RunEvent.objects.bulk_create(events)
    for _ in range(6):
        old = _run(owner, mode, days_ago=40)
        ToolActivation.objects.create(run=old, tool_name="web_search", trigger="direct")
        RunEvent.objects.create(run=old, seq=1, type="tool_call", payload={"name": "web_search", "input": {}})
    return mode, resident


@pytest.mark.req("TS-3")
@pytest.mark.django_db
def test_a_load_stored_with_the_miss_of_its_own_turn_counts_as_found_after_it(alice):
    """QA: a turn's loads were stored before its misses, so none ever counted as found after one."""
    mode, _ = _history(alice)
    run = _run(alice, mode)
    ModelRequestFactory(run=run)
    activations_record(
        run_id=run.pk, activations=[Activation("git_status", "search", "git state")], misses=["repo state"]
    )
    RunEvent.objects.create(run=run, seq=1, type="tool_call", payload={"name": "git_status", "input": {}})
    (promoted,) = resident_recommendation(mode=mode, days=30).make_resident
    assert (promoted.name, promoted.runs_using, promoted.found_after_miss) == ("git_status", 7, 3)


@pytest.mark.req("TS-3")
@pytest.mark.django_db
def test_the_recommendation_comes_from_recorded_loads_misses_and_calls(alice):
    mode, resident = _history(alice)
    rec = resident_recommendation(mode=mode, days=30)
    assert rec.runs == 12 and rec.requests == 18
    # git_log came back from the same searches as git_status in as many runs, and no run called it.
    assert [s.name for s in rec.make_resident] == ["git_status"]
    promoted = rec.make_resident[0]
    assert (promoted.runs_using, promoted.calls, promoted.activations, promoted.found_after_miss) == (6, 6, 6, 2)
    assert {s.name for s in rec.make_deferred} == {"kill_background", "todo_list"}
    # The effect: schemas in and out of every request, the index lines they leave or join.
    before, _ = run_surface(mode=mode, deferral=True)
    changed = Mode(
        name="coder", allow=["*"], resident_add=["git_status"], resident_remove=["kill_background", "todo_list"]
    )
    after, _ = run_surface(mode=changed, deferral=True)
    schemas = {tool.name: estimate_json_tokens(tool.definition()) for tool in after.admitted.values()}
    moved = schemas["git_status"] - schemas["kill_background"] - schemas["todo_list"]
    index = estimate_text_tokens(after.index_text) - estimate_text_tokens(before.index_text)
    # The block is estimated whole (one JSON array), so the parts may round a token apart.
    assert abs(rec.tokens_per_request - (moved + index)) <= 2
    expected = (
        estimate_json_tokens(after.resident_schemas())
        + estimate_text_tokens(after.index_text)
        - estimate_json_tokens(before.resident_schemas())
        - estimate_text_tokens(before.index_text)
    )
    assert rec.tokens_per_request == expected
    assert rec.tokens_over_window == expected * 18
    assert (rec.activations_saved, rec.cache_misses_saved, rec.activations_added) == (6, 6, 0)
    assert rec.prefix_changes == 1
    # Too little history recommends nothing.
    assert not resident_recommendation(mode=mode, days=3, now=timezone.now() + dt.timedelta(days=5)).changes


@pytest.mark.req("TS-3")
@pytest.mark.django_db
def test_applying_makes_a_new_version_and_the_tools_prefix_changes_exactly_once(alice, tmp_path):
    mode, _ = _history(alice)
    rec = resident_recommendation(mode=mode)

    def prefix() -> str:
        toolbox = run_toolbox(workspace=tmp_path, mode=Mode.objects.get(pk=mode.pk), deferral=True)
        return json.dumps([toolbox.schemas(), toolbox.surface.system_blocks()], sort_keys=True)

    first = prefix()
    assert prefix() == first
    version = mode_resident_apply(
        mode_id=mode.pk,
        make_resident=[s.name for s in rec.make_resident],
        make_deferred=[s.name for s in rec.make_deferred],
        expected_version=1,
        applied_by="admin",
        effect=rec.as_dict(),
    )
    mode.refresh_from_db()
    assert (mode.version, version.version) == (2, 2)
    assert mode.resident_add == ["git_status"] and mode.resident_remove == ["kill_background", "todo_list"]
    assert version.effect["tokens_per_request"] == rec.tokens_per_request
    second, third = prefix(), prefix()
    assert second != first and third == second
    surface, _ = run_surface(mode=mode, deferral=True)
    assert "git_status" in {t.name for t in surface.resident} and "kill_background" in surface.deferred_names
    # Applied: the same history now recommends nothing more for git_status.
    assert "git_status" not in [s.name for s in resident_recommendation(mode=mode).make_resident]


@pytest.mark.req("TS-3")
@pytest.mark.django_db
def test_a_stale_unknown_or_contradictory_change_is_refused_and_changes_nothing(alice):
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    mode = ModeFactory(name="reader", allow=["read_*", "git_*"])
    mode_resident_apply(mode_id=mode.pk, make_resident=["git_status"], make_deferred=[], expected_version=1)
    mode.refresh_from_db()
    before = (mode.version, mode.resident_add, mode.resident_remove, ModeVersion.objects.count())
    many_unknown = [f"nope_{i}" for i in range(8)]
    bad = [
        ({"make_resident": ["git_log"], "make_deferred": [], "expected_version": 1}, "at version 2, not 1: someone"),
        ({"make_resident": ["git_log"], "make_deferred": [], "expected_version": 7}, "Version 7 was never a version"),
        ({"make_resident": ["git_log"], "make_deferred": [], "expected_version": -1}, "Version -1 was never"),
        ({"make_resident": ["send_email"], "make_deferred": [], "expected_version": 2}, "Not tools of mode reader"),
        # Named, shortened, and only the first five: a 100,000-character name was echoed whole.
        (
            {"make_resident": many_unknown, "make_deferred": [], "expected_version": 2},
            r"'nope_4' and 3 more\.$",
        ),
        ({"make_resident": ["x" * 100_000], "make_deferred": [], "expected_version": 2}, r"reader: 'x{64}…'\.$"),
        ({"make_resident": ["git_log"], "make_deferred": ["git_log"], "expected_version": 2}, "resident and deferred"),
        ({"make_resident": [], "make_deferred": [], "expected_version": 2}, "Nothing to apply"),
        # QA: a change that changed nothing, and deferring a discovery tool, made new versions.
        ({"make_resident": ["git_status"], "make_deferred": [], "expected_version": 2}, "Already as asked in mode"),
        ({"make_resident": [], "make_deferred": ["git_log"], "expected_version": 2}, "Already as asked in mode"),
    ]
    for arguments, message in bad:
        with pytest.raises(ResidentChangeRefused, match=message):
            mode_resident_apply(mode_id=mode.pk, **arguments)
    everything = ModeFactory(name="everything", allow=["*"])
    with pytest.raises(ResidentChangeRefused, match="they stay resident"):
        mode_resident_apply(mode_id=everything.pk, make_resident=[], make_deferred=["search_tools"], expected_version=1)
    mode.refresh_from_db()
    assert (mode.version, mode.resident_add, mode.resident_remove, ModeVersion.objects.count()) == before


@pytest.mark.req("TS-3")
@pytest.mark.django_db
def test_the_admin_shows_the_recommendation_with_its_effect_and_applies_it(admin_client, admin_user):
    mode, _ = _history(admin_user)
    url = f"/admin/toolcatalog/mode/{mode.pk}/resident/"
    page = admin_client.get(url).content.decode()
    assert "git_status" in page and "kill_background" in page
    assert "changes this mode&#x27;s tools prefix once" in page or "changes this mode's tools prefix once" in page
    assert "Apply as version 2" in page
    stale = admin_client.post(url, {"version": "9", "make_resident": ["git_status"]}, follow=True)
    assert "Version 9 was never a version of mode" in stale.content.decode()
    for version in ("abc", "", "-1", "５"):
        typed = admin_client.post(url, {"version": version, "make_resident": ["git_status"]}, follow=True)
        assert "The form carries no version number" in typed.content.decode(), version
    mode.refresh_from_db()
    assert mode.version == 1
    offered = resident_recommendation(mode=mode)  # git_status up, kill_background and todo_list down
    admin_client.post(url, {"version": "1", "make_resident": ["git_status"]})
    mode.refresh_from_db()
    assert (mode.version, mode.resident_add, mode.resident_remove) == (2, ["git_status"], [])
    assert "v2" in admin_client.get(url).content.decode()
    # The version records what was applied, not all that was offered (QA: -2,711 tokens a request
    # recorded for a change of +42).
    effect = ModeVersion.objects.get(mode=mode, version=2).effect
    git_status = offered.make_resident[0].schema_tokens
    assert (effect["make_resident"][0]["name"], effect["make_deferred"]) == ("git_status", [])
    assert offered.tokens_per_request < 0 < effect["tokens_per_request"]
    assert effect["tokens_per_request"] <= git_status  # its schema in; its index line out
