"""The MCP server admin form never draws a secret back (MC-3), not even one just typed into a refused form."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission

from tests.support.factories import UserFactory
from toolcatalog.models import McpServer

TYPED_ENV = "typed-env-secret-5f1c"
TYPED_HEADER = "typed-header-secret-9b2e"
STORED_ENV = "stored-env-secret-77aa"


def _form(**fields: str) -> dict[str, str]:
    return {
        "name": "notes", "transport": "stdio", "command": "notes-server", "args": "[]",
        "env": "{}", "cwd": "", "url": "", "headers": "{}", **fields,
    }  # fmt: skip


@pytest.mark.req("MC-3")
@pytest.mark.django_db
def test_a_refused_add_form_draws_typed_env_and_headers_as_hidden_and_stores_nothing(admin_client):
    # A stdio server with headers is refused (those are for http servers): the form comes back.
    env = {"NOTES_TOKEN": TYPED_ENV, "NOTES_HOME": "${HOME}", "RETRIES": 3}
    refused = admin_client.post(
        "/admin/toolcatalog/mcpserver/add/",
        _form(env=json.dumps(env), headers=json.dumps({"Authorization": f"Bearer {TYPED_HEADER}"})),
    )
    page = refused.content.decode()
    assert refused.status_code == 200 and "A stdio server has no url or headers" in page
    assert TYPED_ENV not in page and TYPED_HEADER not in page
    # The names stay, and a ${VAR} reference (not a secret) is shown as typed.
    drawn = refused.context["adminform"].form
    shown_env = json.loads(drawn["env"].value())
    assert shown_env == {"NOTES_TOKEN": "***", "NOTES_HOME": "${HOME}", "RETRIES": "***"}
    assert json.loads(drawn["headers"].value()) == {"Authorization": "***"}
    assert not McpServer.objects.exists()

    # Sent back as drawn, "***" has nothing stored to keep: the person is asked for the value again.
    again = admin_client.post("/admin/toolcatalog/mcpserver/add/", _form(env=json.dumps(shown_env), headers="{}"))
    said = "environment variables &#x27;NOTES_TOKEN&#x27;, &#x27;RETRIES&#x27; have no stored value"
    assert said in again.content.decode()
    assert not McpServer.objects.exists()


@pytest.mark.req("MC-3")
@pytest.mark.django_db
def test_a_refused_change_form_hides_a_newly_typed_value_and_keeps_the_stored_one(admin_client):
    server = McpServer.objects.create(
        name="notes", transport="stdio", command="notes-server", env={"NOTES_TOKEN": STORED_ENV}, enabled=False
    )
    url = f"/admin/toolcatalog/mcpserver/{server.pk}/change/"
    typed = {"NOTES_TOKEN": "***", "NEW_KEY": TYPED_ENV}
    refused = admin_client.post(url, _form(env=json.dumps(typed), command=""))
    page = refused.content.decode()
    assert refused.status_code == 200 and "A stdio server needs the command that starts it." in page
    assert TYPED_ENV not in page and STORED_ENV not in page
    server.refresh_from_db()
    assert (server.command, server.env) == ("notes-server", {"NOTES_TOKEN": STORED_ENV})

    # A stored value replaced in a refused form comes back as "***", which would keep the old one:
    # the form says it did not keep the new value.
    rotated = admin_client.post(url, _form(env=json.dumps({"NOTES_TOKEN": TYPED_ENV}), command=""))
    assert "Not kept, type again: NOTES_TOKEN" in rotated.content.decode()
    assert TYPED_ENV not in rotated.content.decode()


@pytest.mark.req("MC-3")
@pytest.mark.django_db
def test_env_that_is_not_a_json_object_is_refused_and_not_drawn_back(admin_client):
    refused = admin_client.post("/admin/toolcatalog/mcpserver/add/", _form(env=f'{{"NOTES_TOKEN": "{TYPED_ENV}"'))
    page = refused.content.decode()
    assert refused.status_code == 200 and "Enter a valid JSON." in page
    assert TYPED_ENV not in page
    assert not McpServer.objects.exists()


@pytest.mark.req("MC-3")
@pytest.mark.django_db
def test_a_view_only_staff_user_sees_the_server_with_its_secrets_hidden(client):
    server = McpServer.objects.create(
        name="notes", transport="stdio", command="notes-server",
        env={"NOTES_TOKEN": STORED_ENV, "NOTES_HOME": "${HOME}"}, enabled=False,
    )  # fmt: skip
    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_mcpserver"))
    client.force_login(viewer)
    page = client.get(f"/admin/toolcatalog/mcpserver/{server.pk}/change/")
    text = page.content.decode()
    assert page.status_code == 200, text[-2000:]
    assert "NOTES_TOKEN" in text and "${HOME}" in text and STORED_ENV not in text
    assert client.post(f"/admin/toolcatalog/mcpserver/{server.pk}/change/", _form()).status_code == 403
    server.refresh_from_db()
    assert server.env == {"NOTES_TOKEN": STORED_ENV, "NOTES_HOME": "${HOME}"}
