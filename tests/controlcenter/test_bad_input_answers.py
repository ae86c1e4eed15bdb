"""SB-5: the inputs that once gave a 500 each get a 400 in the documented error shape, and an
unexpected error in the API is a JSON 500 in that shape too, never Django's HTML page."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from controlcenter.errors import DomainError
from conversations.models import Conversation
from scratchpad import services
from scratchpad.models import Entry
from tests.support.scratchpad import make_run
from toolcatalog.models import Tool

pytestmark = [pytest.mark.django_db, pytest.mark.req("SB-5")]


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()["error"]
    assert set(body) == {"code", "message", "details"} and body["message"]
    return body


@pytest.fixture
def entry(alice) -> Entry:
    run = make_run(alice)
    return services.put(
        turn_id=str(run.pk), run_id=run.pk, conversation_id=run.conversation_id, content="x", step_num=1
    )


def test_a_nul_in_a_scratchpad_id_or_a_query_is_a_400(alice_api):
    assert "NUL" in _error(alice_api.get("/api/scratchpad/entries/ab%00c/"), 400)["message"]
    _error(alice_api.get("/api/scratchpad/entries/ab%00c/read/"), 400)
    _error(alice_api.post("/api/scratchpad/entries/ab%00c/pin/", {}, format="json"), 400)
    # An id longer than any entry's is simply not there.
    _error(alice_api.get("/api/scratchpad/entries/" + "a" * 300 + "/"), 404)
    assert alice_api.get("/api/conversations/?q=a%00b").status_code in (200, 400)


def test_a_huge_offset_or_limit_is_a_400(alice_api):
    for name, value in (("offset", "9" * 23), ("offset", "9223372036854775808"), ("limit", "1" + "0" * 40)):
        assert name in _error(alice_api.get(f"/api/conversations/?{name}={value}"), 400)["details"]


def test_a_pin_ttl_beyond_ten_years_is_a_400_and_changes_nothing(alice_api, entry):
    before = Entry.objects.values().get(pk=entry.pk)
    for ttl in (3.2e11, 320_000_000_000, 10**30):
        body = _error(
            alice_api.post(f"/api/scratchpad/entries/{entry.pk}/pin/", {"ttl_seconds": ttl}, format="json"), 400
        )
        assert "ttl_seconds" in body["details"]
    assert Entry.objects.values().get(pk=entry.pk) == before
    with pytest.raises(DomainError, match="ten years"):
        services.pin(entry=entry, ttl_seconds=320_000_000_000)


def test_deeply_nested_json_is_a_400(alice_api, settings):
    conversation = alice_api.post("/api/conversations/", {}, format="json").json()
    url = f"/api/conversations/{conversation['id']}/messages/"
    for body in ("[" * 100_000 + "]" * 100_000, '{"text": ' + '{"a": ' * 5000 + "1" + "}" * 5001):
        assert "nests deeper" in _error(alice_api.post(url, data=body, content_type="application/json"), 400)["message"]
    deep_enough = (
        '{"text": "hi", "x": ' + "[" * (settings.CC_MAX_JSON_DEPTH + 1) + "]" * (settings.CC_MAX_JSON_DEPTH + 1) + "}"
    )
    assert (
        "CC_MAX_JSON_DEPTH"
        in _error(alice_api.post(url, data=deep_enough, content_type="application/json"), 400)["message"]
    )


def test_a_body_that_is_not_json_is_a_415_and_creates_nothing(alice_api):
    # DRF's form parsers took a garbage multipart body for an empty form: a conversation with
    # default values was created (201). The API speaks JSON only.
    before = Conversation.objects.count()
    for content_type, body in [
        ("multipart/form-data; boundary=zz", "garbage"),
        ("application/x-www-form-urlencoded", "title=%FF"),
        ("text/plain", '{"title": "t"}'),
    ]:
        answer = alice_api.post("/api/conversations/", data=body, content_type=content_type)
        assert "Unsupported media type" in _error(answer, 415)["message"], content_type
    assert Conversation.objects.count() == before


def test_catalog_import_refuses_a_long_side_effects_and_writes_nothing(tmp_path):
    before = list(Tool.objects.values())
    tool = {"name": "t", "group": "G", "description": "d", "input_schema": {"type": "object"}}
    for bad in ({"side_effects": "x" * 10_000}, {"max_calls_per_run": 2**40}):
        path = tmp_path / "catalog.json"
        path.write_text(json.dumps({"version": 1, "groups": ["G" * 101], "tools": [{**tool, **bad}]}))
        with pytest.raises(CommandError) as refused:
            call_command("catalog", "import", str(path), stdout=io.StringIO())
        assert "at most" in str(refused.value)
    assert list(Tool.objects.values()) == before


@pytest.mark.parametrize("content", [None, "{not json"])
def test_a_benchmark_given_a_missing_or_broken_data_file_says_so_in_one_line(tmp_path, content):
    path = tmp_path / "toolcatalog.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CommandError) as refused:
        call_command("bench", "deferral", "--catalog", str(path), stdout=io.StringIO())
    said = str(refused.value)
    assert said.startswith("bench deferral: ")
    assert ("No such file" in said) if content is None else ("Expecting property name" in said)


def test_an_unexpected_error_in_the_api_is_a_json_500(alice, monkeypatch):
    from conversations import selectors

    def broken(*args, **kwargs):
        raise RuntimeError("the database password is hunter2")

    monkeypatch.setattr(selectors, "conversations_for_user", broken)
    client = APIClient(raise_request_exception=False)
    client.force_authenticate(alice)
    body = _error(client.get("/api/conversations/"), 500)
    assert body["code"] == "server_error" and "hunter2" not in json.dumps(body)
