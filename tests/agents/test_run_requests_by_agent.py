"""The run's model requests say which agent made each one and why its answer ended (RN-2, UX-6): a
subagent's step 1 and an attempt broken off and retried are not duplicates of the run's step 1."""

from __future__ import annotations

import pytest

from agents.models import Subagent
from tests.support.factories import ModelRequestFactory, RunFactory


@pytest.fixture
def fanned_out_run(alice):
    run = RunFactory(conversation__owner=alice, status="succeeded")
    child = Subagent.objects.create(
        parent=run, fanout_id="3753f268", index=0, count=1, shape="parallel", profile="researcher", task="look"
    )
    # The run's step 1 broke off mid-answer and was asked again; its child ran a step 1 of its own.
    ModelRequestFactory(run=run, owner=alice, step=1, stop_reason="retried", output_tokens=3)
    ModelRequestFactory(run=run, owner=alice, step=1, stop_reason="tool_use", output_tokens=20)
    ModelRequestFactory(run=run, owner=alice, step=1, stop_reason="end_turn", subagent=child.label)
    ModelRequestFactory(run=run, owner=alice, step=2, stop_reason="end_turn")
    return run


@pytest.mark.django_db
@pytest.mark.req("RN-2")
def test_the_api_names_each_requests_subagent_and_stop_reason(fanned_out_run, alice_api):
    rows = alice_api.get(f"/api/runs/{fanned_out_run.pk}/").json()["model_requests"]
    assert [(row["step"], row["subagent"], row["stop_reason"]) for row in rows] == [
        (1, None, "retried"),
        (1, None, "tool_use"),
        (1, "3753f268/0", "end_turn"),
        (2, None, "end_turn"),
    ]
    schema = alice_api.get("/api/schema/?format=json").json()["components"]["schemas"]["ModelRequest"]
    assert schema["properties"]["subagent"]["nullable"] is True
    assert {"subagent", "stop_reason"} <= set(schema["required"])


@pytest.mark.django_db
@pytest.mark.req("RN-2", "UX-6")
def test_the_run_page_shows_who_made_each_request_and_why_it_stopped(fanned_out_run, client, alice):
    client.force_login(alice)
    page = client.get(f"/runs/{fanned_out_run.pk}/").content.decode()
    table = page[page.index('id="model-requests"') : page.index("</table>", page.index('id="model-requests"'))]
    rows = table.split("<tr data-step=")[1:]
    assert len(rows) == 4
    retried, answered, child, last = rows
    assert "this run" in retried and 'data-stop-reason="retried"' in retried and "stop-retried" in retried
    assert "this run" in answered and ">tool_use<" in answered
    assert 'data-subagent="3753f268/0"' in child and "subagent 0 (researcher)" in child and "this run" not in child
    assert ">end_turn<" in child and "this run" in last
    assert '<th scope="col">Agent</th>' in table and '<th scope="col">Stop</th>' in table
