"""bootstrap puts the built-in tools into the catalog, so a fresh installation's admin shows them (TD-1)."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command

from engine.catalog.surface import ModeSpec
from engine.catalog.toolbox import DISCOVERY_TOOLS
from tests.support.catalog import reference_catalog
from toolcatalog.builtins import BUILTINS
from toolcatalog.models import Mode, Tool, ToolGroup
from toolcatalog.selectors import run_surface
from toolcatalog.services import catalog_import, catalog_load_builtins

pytestmark = pytest.mark.django_db


@pytest.fixture
def quiet_admin(monkeypatch):
    monkeypatch.setenv("CC_ADMIN_PASSWORD", "admin-password-1")


REWORDED = {"bash", "read_file", "search_files", "fetch_url", "search_memory"}


@pytest.mark.req("UX-7")
def test_built_in_descriptions_name_only_tools_that_exist(quiet_admin):
    call_command("bootstrap")
    names = set(Tool.objects.values_list("name", flat=True))
    reference = {entry["name"] for entry in reference_catalog()["tools"]}
    for tool in Tool.objects.all():
        # A tool name in a description is a word of the reference catalog's names.
        named = {word for word in re.findall(r"[a-z][a-z0-9_]*_[a-z0-9_]+", tool.description) if word in reference}
        assert named <= names, (tool.name, named - names)


@pytest.mark.req("UX-7")
def test_bootstrap_offers_starter_modes_once_and_keeps_an_operators_edits(quiet_admin):
    call_command("bootstrap")
    assert set(Mode.objects.values_list("name", flat=True)) == {"chat", "code", "read-only"}
    chat = Mode.objects.get(name="chat")
    chat.deny = ["fetch_url"]
    chat.save()
    call_command("bootstrap")
    assert Mode.objects.get(name="chat").deny == ["fetch_url"]
    assert Mode.objects.count() == 3


@pytest.mark.req("UX-7", "TD-8")
def test_the_starter_modes_that_change_nothing_admit_no_tool_that_writes_or_runs(quiet_admin):
    """QA: read-only and chat denied a few names and admitted multi_edit, apply_patch, delete_path,
    git_push and every tool imported later. Every reference tool they admit is one of the catalog's
    side-effect-free ones."""
    call_command("bootstrap")
    harmless = {entry["name"] for entry in reference_catalog()["tools"] if entry.get("side_effects") == "none"}
    for name in ("chat", "read-only"):
        spec = ModeSpec(allow=tuple(Mode.objects.get(name=name).allow), deny=tuple(Mode.objects.get(name=name).deny))
        admitted = {entry["name"] for entry in reference_catalog()["tools"] if spec.admits(entry["name"])}
        assert admitted and admitted <= harmless, (name, sorted(admitted - harmless))
        assert not spec.admits("weather__set_alarm")  # a tool imported later is not admitted by default


@pytest.mark.req("TD-1")
def test_bootstrap_loads_every_built_in_with_the_reference_groups_and_flags(quiet_admin, capsys):
    call_command("bootstrap")
    assert "Built-in tools: 18 added to the catalog, 0 already there." in capsys.readouterr().out
    tools = {tool.name: tool for tool in Tool.objects.select_related("group")}
    assert set(tools) == set(BUILTINS) | set(DISCOVERY_TOOLS)
    reference = {entry["name"]: entry for entry in reference_catalog()["tools"]}
    for name, tool in tools.items():
        entry = reference[name]
        assert (tool.group.heading, tool.resident, tool.requires_approval) == (
            entry["group"],
            entry["resident"],
            entry["requires_approval"],
        ), name
        assert tool.input_schema == entry["input_schema"]
        # The reference catalog's bash and read_file point to bash_background and read_document,
        # which are not built in here: their descriptions are reworded to name only what exists (UX-7).
        assert tool.description == entry["description"] or name in REWORDED, name
        assert tool.source == Tool.Source.BUILT_IN and tool.enabled
    assert tools["fetch_url"].resident is False and tools["bash"].requires_approval is True
    headings = list(ToolGroup.objects.values_list("heading", flat=True))
    assert headings == ["Files and shell", "Web", "Memory and knowledge", "Task list and reporting", "Discovery"]
    # A run on the bootstrapped catalog can find and load what is deferred.
    surface, _ = run_surface(deferral=True)
    assert {"search_tools", "describe_tool"} <= {tool.name for tool in surface.resident}
    assert {"fetch_url", "save_memory"} == surface.deferred_names


@pytest.mark.req("TD-1")
def test_bootstrap_again_adds_nothing_and_keeps_the_operators_edits(quiet_admin, capsys):
    call_command("bootstrap")
    Tool.objects.filter(name="fetch_url").update(resident=True, max_calls_per_run=4)
    Tool.objects.filter(name="bash").update(enabled=False)
    before = list(Tool.objects.order_by("pk").values())
    call_command("bootstrap")
    assert "Built-in tools: 0 added to the catalog, 18 already there." in capsys.readouterr().out
    assert list(Tool.objects.order_by("pk").values()) == before


@pytest.mark.req("TD-1")
def test_loading_built_ins_after_a_catalog_import_changes_nothing():
    catalog_import(text=__import__("json").dumps(reference_catalog()))
    before = list(Tool.objects.order_by("pk").values())
    result = catalog_load_builtins()
    assert (result.created, result.existing) == (0, 18)
    assert list(Tool.objects.order_by("pk").values()) == before


@pytest.mark.req("TD-1")
def test_the_admin_lists_the_built_ins_of_a_fresh_installation(quiet_admin, admin_client):
    call_command("bootstrap")
    page = admin_client.get("/admin/toolcatalog/tool/?all=")
    assert page.status_code == 200
    text = page.content.decode()
    for name in [*BUILTINS, *DISCOVERY_TOOLS]:
        assert f">{name}</a>" in text, name
