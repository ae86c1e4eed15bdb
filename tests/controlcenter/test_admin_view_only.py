"""The admin as a staff user who may only view it meets it: every page answers, and no secret shows (UX-7, MC-3)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission

from tests.support.catalog import CATALOG_PATH
from tests.support.factories import CheckpointFactory, ModeFactory, RunFactory, UserFactory
from toolcatalog.models import McpServer
from toolcatalog.services import catalog_import

SECRET = "view-only-secret-3c9d"


@pytest.mark.req("UX-7", "MC-3")
@pytest.mark.django_db
def test_a_view_only_staff_user_gets_every_admin_list_and_change_page_and_no_secret(client):
    """QA: a view-only user's MCP server page was a 500 (the form expected fields it does not get)."""
    catalog_import(text=CATALOG_PATH.read_text(encoding="utf-8"))
    run = RunFactory(conversation__owner=UserFactory(username="owner"), trigger__text="go")
    run.conversation.tip = run.trigger
    run.conversation.save(update_fields=["tip"])
    CheckpointFactory(conversation=run.conversation)
    ModeFactory(name="reviewing")
    McpServer.objects.create(
        name="notes", transport="stdio", command="notes-server", env={"NOTES_TOKEN": SECRET}, enabled=False
    )
    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    client.force_login(viewer)

    pages = []
    for model in admin.site._registry:
        listing = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        pages.append(listing)
        if (row := model._default_manager.first()) is not None:
            pages.append(f"{listing}{row.pk}/change/")
    assert len(pages) > 2 * 8  # every registered model, most with a row to show
    for page in pages:
        answer = client.get(page)
        assert answer.status_code == 200, page
        assert SECRET not in answer.content.decode(), page
