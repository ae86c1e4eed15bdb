"""The schema says what the API refuses: a NUL in any string it takes (UX-8).

PostgreSQL text cannot hold a NUL, so the API answers one with a 400. Schemathesis found a
conversation title starting with a NUL, valid by the schema of the time, refused by the API.
"""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from rest_framework.test import APIClient

from agents.models import Run
from conversations.models import Checkpoint, Conversation, Message
from tests.support.history import add_turn
from toolcatalog.models import McpServer


def _schema(client) -> dict[str, Any]:
    return client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()


def _body_validator(schema: dict[str, Any], path: str, method: str) -> Draft202012Validator:
    body = schema["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    registry = Registry().with_resource("urn:api", Resource.opaque(schema))
    return Draft202012Validator({"$ref": "urn:api#" + body["$ref"].removeprefix("#")}, registry=registry)


def _stored(conversation: Conversation) -> tuple:
    conversation.refresh_from_db()
    return (
        conversation.title,
        Conversation.objects.count(),
        Message.objects.count(),
        Checkpoint.objects.count(),
        McpServer.objects.count(),
        Run.objects.count(),
    )


@pytest.mark.req("UX-8")
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("post", "/api/conversations/", {"title": "Plans"}, "title"),
        ("patch", "/api/conversations/{conversation_id}/", {"title": "Renamed"}, "title"),
        ("post", "/api/conversations/{conversation_id}/messages/", {"text": "/checkpoint plan"}, "text"),
        ("post", "/api/conversations/{conversation_id}/checkpoints/", {"label": "plan"}, "label"),
        ("post", "/api/conversations/{conversation_id}/fork/", {"title": "Copy"}, "title"),
        (
            "post",
            "/api/mcp-servers/",
            {"name": "time", "transport": "stdio", "command": "true", "enabled": False},
            "command",
        ),
    ],
)
def test_a_nul_in_a_string_is_invalid_by_the_schema_and_refused_by_the_api_with_nothing_stored(
    admin_user, method, path, body, field
):
    # A staff account: the MCP servers' endpoints are staff-only, the conversations' anyone's.
    api = APIClient()
    api.force_authenticate(admin_user)
    conversation = Conversation.objects.create(owner=admin_user, title="Before")
    add_turn(conversation, "hello", "hi")
    validator = _body_validator(_schema(api), path, method)
    url = path.format(conversation_id=conversation.pk)
    with_nul = {**body, field: f"\x00{body[field]}"}

    assert list(validator.iter_errors(body)) == [], "the valid body is valid by the schema"
    assert any(error.validator == "pattern" for error in validator.iter_errors(with_nul)), with_nul

    before = _stored(conversation)
    refused = getattr(api, method)(url, with_nul, format="json")
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["message"].startswith(f"{field}: "), refused.json()
    assert _stored(conversation) == before
    # The same body without the NUL is taken: the schema and the API draw the line at the same place.
    taken = getattr(api, method)(url, body, format="json")
    assert taken.status_code in (200, 201), taken.content


@pytest.mark.req("UX-8")
@pytest.mark.django_db
def test_the_rule_is_on_request_bodies_only_since_an_error_may_repeat_the_refused_value(admin_user):
    api = APIClient()
    api.force_authenticate(admin_user)
    conversation = Conversation.objects.create(owner=admin_user, title="Before")
    schema = _schema(api)
    assert (
        "pattern"
        not in schema["components"]["schemas"]["ErrorResponse"]["properties"]["error"]["properties"]["message"]
    )
    # A refusal that names the value it refused, NUL included, still matches its documented shape.
    refused = api.post(f"/api/conversations/{conversation.pk}/compact/", {"rungs": ["\x00elide"]}, format="json")
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "\x00" in message
    registry = Registry().with_resource("urn:api", Resource.opaque(schema))
    validator = Draft202012Validator({"$ref": "urn:api#/components/schemas/ErrorResponse"}, registry=registry)
    assert list(validator.iter_errors(refused.json())) == []
