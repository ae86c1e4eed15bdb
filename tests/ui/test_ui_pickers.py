"""Model and mode pickers: `PATCH /api/conversations/<id>/` sets what the next run uses; the run
records it and a real worker runs the turn with that model and that mode's tools (RN-1, TD-8, TD-15)."""

from __future__ import annotations

import pytest
from django.test import Client

from agents.models import ModelRequest, Run, RunEvent
from conversations.models import Conversation, Message
from tests.support.waiting import run_finished
from toolcatalog.models import Mode

pytestmark = pytest.mark.django_db

OFFERED = {"offline-1": "offline", "offline-2": "offline"}


@pytest.fixture
def two_models(settings):
    settings.CC_MODEL = "offline-1"
    settings.CC_MODELS = dict(OFFERED)


@pytest.fixture
def no_list_dir() -> Mode:
    return Mode.objects.create(name="no-listing", allow=["*"], deny=["list_dir"])


def _patch(api, conversation_id: int, body: dict):
    return api.patch(f"/api/conversations/{conversation_id}/", body, format="json")


@pytest.mark.req("RN-3")
def test_models_endpoint_lists_the_offered_models_default_first(alice_api, two_models):
    assert alice_api.get("/api/models/").json() == [
        {"name": "offline-1", "provider": "offline", "default": True},
        {"name": "offline-2", "provider": "offline", "default": False},
    ]


@pytest.mark.req("RN-3")
def test_patch_sets_model_and_mode_and_blank_or_null_go_back_to_the_defaults(alice, alice_api, two_models, no_list_dir):
    conversation = Conversation.objects.create(owner=alice, title="pick")
    before = conversation.updated_at
    response = _patch(alice_api, conversation.pk, {"model": "offline-2", "mode": no_list_dir.pk})
    assert response.status_code == 200, response.content
    assert response.json()["model"] == "offline-2" and response.json()["mode"] == no_list_dir.pk
    conversation.refresh_from_db()
    assert (conversation.model, conversation.mode_id) == ("offline-2", no_list_dir.pk)
    assert conversation.updated_at == before  # picking is not activity: the list keeps its order
    assert alice_api.get(f"/api/conversations/{conversation.pk}/").json()["conversation"]["model"] == "offline-2"

    # One field at a time leaves the other alone.
    assert _patch(alice_api, conversation.pk, {"mode": None}).json()["mode"] is None
    conversation.refresh_from_db()
    assert (conversation.model, conversation.mode_id) == ("offline-2", None)
    assert _patch(alice_api, conversation.pk, {"model": ""}).json()["model"] == ""
    conversation.refresh_from_db()
    assert conversation.model == ""


@pytest.mark.req("RN-3")
@pytest.mark.parametrize(
    ("body", "message", "details"),
    [
        ({"model": "gpt-9", "mode": "MODE"}, "Model 'gpt-9' is not offered here; choose one of offline-1, offline-2",
         {"model": ["offline-1", "offline-2"]}),
        ({"mode": 999_999, "model": "offline-2"}, "Mode 999999 does not exist", {"mode": ["MODE"]}),
        ({"mode": "fast"}, "mode: A valid integer is required.", None),
        ({"model": ["offline-2"]}, "model: Must be a string, not list.", None),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_that_says_what_is_offered_and_stores_nothing(
    alice, alice_api, two_models, no_list_dir, body, message, details
):
    conversation = Conversation.objects.create(owner=alice, title="pick", model="offline-1")
    body = {key: (no_list_dir.pk if value == "MODE" else value) for key, value in body.items()}
    response = _patch(alice_api, conversation.pk, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"]
    if details is not None:
        assert error["details"] == {k: [no_list_dir.pk if v == "MODE" else v for v in vs] for k, vs in details.items()}
    conversation.refresh_from_db()
    assert (conversation.model, conversation.mode_id) == ("offline-1", None)  # neither field changed


@pytest.mark.req("RN-3")
def test_a_model_no_longer_offered_refuses_the_message_and_stores_nothing(alice, alice_api, two_models):
    conversation = Conversation.objects.create(owner=alice, title="stale", model="gone-1")
    response = alice_api.post(f"/api/conversations/{conversation.pk}/messages/", {"text": "hi"}, format="json")
    assert response.status_code == 409  # the conversation's state, not the request, is at fault (UX-8)
    message = response.json()["error"]["message"]
    assert "model 'gone-1' is no longer offered; pick one of offline-1, offline-2" in message
    assert not Message.objects.filter(conversation=conversation).exists() and not Run.objects.exists()
    conversation.refresh_from_db()
    assert conversation.tip_id is None
    # The page shows the stale pick as the selection, not the default it no longer is.
    client = Client()
    client.force_login(alice)
    html = client.get(f"/conversations/{conversation.pk}/").content.decode()
    assert '<option value="gone-1" selected disabled>gone-1 (no longer offered)</option>' in html
    assert "(default)</option>" in html and " selected>offline-1 (default)" not in html


@pytest.mark.req("RN-3")
def test_another_users_conversation_answers_404_and_is_not_changed(alice, bob_api, two_models, no_list_dir):
    conversation = Conversation.objects.create(owner=alice, title="mine")
    response = _patch(bob_api, conversation.pk, {"model": "offline-2", "mode": no_list_dir.pk})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    conversation.refresh_from_db()
    assert (conversation.model, conversation.mode_id) == ("", None)


@pytest.mark.req("TD-15")
def test_the_context_view_builds_the_next_request_with_the_conversations_model_and_mode(
    alice, alice_api, two_models, no_list_dir
):
    conversation = Conversation.objects.create(owner=alice, title="ctx")
    default = alice_api.get(f"/api/conversations/{conversation.pk}/context/").json()
    assert default["model"] == "offline-1"
    assert "list_dir" in [tool["name"] for tool in default["tools"]["resident"]]
    _patch(alice_api, conversation.pk, {"model": "offline-2", "mode": no_list_dir.pk})
    picked = alice_api.get(f"/api/conversations/{conversation.pk}/context/").json()
    assert picked["model"] == "offline-2" and picked["tools"]["mode"] == "no-listing"
    assert "list_dir" not in [tool["name"] for tool in picked["tools"]["resident"]]
    assert picked["tools"]["resident"] and picked["tools"]["resident_tokens"] < default["tools"]["resident_tokens"]


def test_the_conversation_page_draws_both_pickers_with_the_current_choice(alice, two_models, no_list_dir):
    conversation = Conversation.objects.create(owner=alice, title="page", model="offline-2", mode=no_list_dir)
    client = Client()
    client.force_login(alice)
    html = client.get(f"/conversations/{conversation.pk}/").content.decode()
    assert '<label for="model-picker">Model' in html and '<label for="mode-picker">Mode' in html
    assert '<option value="">offline-1 (default)</option>' in html
    assert '<option value="offline-2" selected>offline-2</option>' in html
    assert f'<option value="{no_list_dir.pk}" selected>no-listing</option>' in html


def _wait_for_run(run_id: int, timeout: float = 30) -> Run:
    return run_finished(run_id, timeout)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.req("TD-8")
@pytest.mark.req("RN-1")
def test_a_real_worker_runs_the_next_turn_with_the_picked_model_and_mode(
    celery_worker_process, alice, alice_api, two_models, no_list_dir
):
    conversation = Conversation.objects.create(owner=alice, title="picked")
    assert _patch(alice_api, conversation.pk, {"model": "offline-2", "mode": no_list_dir.pk}).status_code == 200
    sent = alice_api.post(
        f"/api/conversations/{conversation.pk}/messages/", {"text": "please list the files"}, format="json"
    )
    assert sent.status_code == 201, sent.content
    assert (sent.json()["run"]["model"], sent.json()["run"]["mode"]) == ("offline-2", no_list_dir.pk)
    run = _wait_for_run(sent.json()["run"]["id"])
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.worker.startswith("test-")  # the worker process ran it
    assert (run.provider, run.model, run.mode_id) == ("offline", "offline-2", no_list_dir.pk)
    assert set(ModelRequest.objects.filter(run=run).values_list("model", flat=True)) == {"offline-2"}
    started = RunEvent.objects.get(run=run, type="run_started").payload
    assert (started["model"], started["mode"]) == ("offline-2", "no-listing")
    # The mode withheld list_dir, so the offline model, asked about files, had no tool to call.
    assert not RunEvent.objects.filter(run=run, type="tool_call").exists()
    client = Client()
    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert '<dd id="run-model">offline/offline-2</dd>' in page and '<dd id="run-mode">no-listing</dd>' in page

    # Back to the defaults: the next turn lists the files with the default model.
    assert _patch(alice_api, conversation.pk, {"model": "", "mode": None}).status_code == 200
    again = alice_api.post(
        f"/api/conversations/{conversation.pk}/messages/", {"text": "please list the files"}, format="json"
    )
    second = _wait_for_run(again.json()["run"]["id"])
    assert second.status == Run.Status.SUCCEEDED, second.error
    assert (second.model, second.mode_id) == ("offline-1", None)
    assert RunEvent.objects.filter(run=second, type="tool_call", payload__name="list_dir").exists()
    run.refresh_from_db()
    assert run.model == "offline-2"  # a started run keeps what it was started with
