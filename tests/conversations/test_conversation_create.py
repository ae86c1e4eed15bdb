"""`POST /api/conversations/` takes the model the first run uses and refuses what it does not take."""

from __future__ import annotations

import pytest

from conversations.models import Conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_models(settings):
    settings.CC_MODEL = "offline-1"
    settings.CC_MODELS = {"offline-1": "offline", "offline-2": "offline"}


@pytest.mark.req("UX-8")
def test_a_conversation_is_created_with_the_model_it_names(alice_api, two_models):
    response = alice_api.post("/api/conversations/", {"title": "x", "model": "offline-2"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["model"] == "offline-2"
    assert Conversation.objects.get(pk=response.json()["id"]).model == "offline-2"
    assert alice_api.post("/api/conversations/", {"model": ""}, format="json").json()["model"] == ""


@pytest.mark.req("UX-8")
@pytest.mark.req("SB-5")
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "nonexistent-model"}, "Model 'nonexistent-model' is not offered here; choose one of offline-1"),
        ({"title": "x", "model": 7}, "model: Must be a string, not int."),
        ({"bogus": 1}, "bogus: Unknown field; this endpoint takes title, model."),
        ({"title": "x", "mode": 1, "zz": 2}, "mode: Unknown field; this endpoint takes title, model. zz: Unknown"),
    ],
)  # fmt: skip
def test_an_unknown_model_or_field_is_a_400_naming_it_and_stores_nothing(alice_api, two_models, body, message):
    response = alice_api.post("/api/conversations/", body, format="json")
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]["message"], response.json()
    assert not Conversation.objects.exists()


@pytest.mark.req("UX-8")
def test_an_unknown_field_in_a_rename_is_a_400_naming_it_and_changes_nothing(alice, alice_api, two_models):
    conversation = Conversation.objects.create(owner=alice, title="kept")
    response = alice_api.patch(f"/api/conversations/{conversation.pk}/", {"title": "new", "titel": "x"}, format="json")
    assert response.status_code == 400, response.content
    assert "titel: Unknown field" in response.json()["error"]["message"]
    conversation.refresh_from_db()
    assert conversation.title == "kept"


@pytest.mark.req("UX-8")
def test_the_schema_lists_the_offered_models_and_no_other_fields(alice_api, two_models):
    schemas = alice_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["components"][
        "schemas"
    ]
    for name in ("ConversationCreate", "PatchedConversationUpdate"):
        assert schemas[name]["additionalProperties"] is False
    assert set(schemas["ModelEnum"]["enum"]) == {"offline-1", "offline-2"}
