"""The conversation page's server side (UX-1, UX-2, UX-6..UX-8): the messages fragment, the
Markdown renderer, regenerate / rename / delete, money, the admin, and the schema's truth."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, override_settings

from agents import costs
from agents.lifecycle import run_execute
from agents.models import ModelRequest, Run
from agents.rendering import markdown_html
from conversations.models import Conversation, Message

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _turn(conversation, parent, prompt, answer):
    question = Message.objects.create(
        conversation=conversation, parent=parent, role="user", content=[{"type": "text", "text": prompt}]
    )
    reply = Message.objects.create(
        conversation=conversation, parent=question, role="assistant", content=[{"type": "text", "text": answer}]
    )
    return question, reply


@pytest.mark.req("UX-1")
def test_markdown_is_rendered_sanitized_and_highlighted():
    html = markdown_html(
        "line one\nline two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- [x] done\n\n```python\nx = 1 < 2\n```\n\n"
        '<script>alert(1)</script> <img src=x onerror="alert(2)"> [bad](javascript:alert(3)) [ok](https://e.org)'
    )
    assert "line one<br" in html  # a single line break stays a line break
    assert "<table>" in html and 'type="checkbox"' in html
    assert 'data-lang="python"' in html and '<span class="n">x</span>' in html
    assert "&lt;script&gt;" in html and "<script" not in html and "<img" not in html
    assert 'href="javascript' not in html  # the link is text
    assert 'href="https://e.org"' in html and 'rel="noopener noreferrer nofollow"' in html


@pytest.mark.req("UX-1", "SB-6")
def test_a_markdown_image_is_a_link_to_it_never_an_image_the_page_loads():
    html = markdown_html(
        '![diagram](https://example.org/d.png "A diagram") [![badge](https://e.org/b.svg)](https://e.org/ci) '
        "![a *b*](/static/cc/favicon.svg) ![x](javascript:alert(1))"
    )
    assert "<img" not in html
    assert '<a href="https://example.org/d.png" class="image-link" title="A diagram"' in html
    # A badge inside a link: one link to where the badge points, its alt text inside it.
    assert '<a href="https://e.org/ci" target="_blank" rel="noopener noreferrer nofollow">' in html
    assert '<span class="image-link">badge</span></a>' in html
    assert '<a href="/static/cc/favicon.svg" class="image-link"' in html and ">a b</a>" in html
    assert 'href="javascript' not in html


@pytest.mark.req("UX-2", "UX-1")
def test_the_fragment_draws_a_failed_run_with_retry_a_live_placeholder_and_siblings(alice):
    conversation = Conversation.objects.create(owner=alice, title="f")
    first, reply = _turn(conversation, None, "one", "answer **one**")
    Message.objects.create(
        conversation=conversation, parent=first, role="assistant", content=[{"type": "text", "text": "again"}]
    )
    failing = Message.objects.create(
        conversation=conversation, parent=reply, role="user", content=[{"type": "text", "text": "two"}]
    )
    conversation.tip = failing
    conversation.save()
    run = Run.objects.create(
        conversation=conversation,
        trigger=failing,
        provider="offline",
        model="offline-1",
        status="failed",
        error="boom: overloaded",
    )
    client = _client(alice)
    page = client.get(f"/conversations/{conversation.pk}/").content.decode()
    fragment = client.get(f"/conversations/{conversation.pk}/messages/").content.decode()
    assert fragment.strip() in page  # one drawing for the page and the live refresh
    assert "boom: overloaded" in fragment and f'data-retry="{run.pk}"' in fragment
    assert "<strong>one</strong>" in fragment
    assert '<span class="sibling-count">1/2</span>' in fragment  # "answer one" and "again" under "one"
    assert fragment.index("two") < fragment.index("boom: overloaded")  # the card follows its prompt

    Run.objects.filter(pk=run.pk).update(status="running")
    fragment = client.get(f"/conversations/{conversation.pk}/messages/").content.decode()
    assert f'class="message assistant live" data-run-id="{run.pk}"' in fragment
    assert f'data-active-run="{run.pk}"' in fragment and "data-retry" not in fragment


@pytest.mark.req("UX-2")
def test_regenerate_answers_the_same_prompt_as_a_sibling(alice, django_capture_on_commit_callbacks):
    conversation = Conversation.objects.create(owner=alice, title="r")
    question, reply = _turn(conversation, None, "q", "a")
    conversation.tip = reply
    conversation.save()
    client = _client(alice)
    with django_capture_on_commit_callbacks():
        response = client.post(f"/api/conversations/{conversation.pk}/messages/{reply.pk}/regenerate/")
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["run"]["id"])
    assert run.trigger_id == question.pk
    conversation.refresh_from_db()
    assert conversation.tip_id == question.pk
    refused = client.post(f"/api/conversations/{conversation.pk}/messages/{question.pk}/regenerate/")
    assert refused.status_code in (400, 409)  # a run is in progress, or not a reply: nothing changes
    assert Run.objects.filter(conversation=conversation).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.req("UX-2")
def test_a_regenerate_stopped_before_it_wrote_anything_shows_the_earlier_answer_again(alice, inprocess_runs):
    # QA with the real model: Regenerate, then Stop, left the tip at the prompt; the page showed the
    # prompt and a cancelled card, and the earlier answer only in the tree view.
    conversation = Conversation.objects.create(owner=alice, title="r")
    question, first = _turn(conversation, None, "q", "a")
    follow_up, latest = _turn(conversation, first, "q2", "a2")
    conversation.tip = latest
    conversation.save()
    client = _client(alice)
    for stop_while in ("queued", "running"):
        response = client.post(f"/api/conversations/{conversation.pk}/messages/{latest.pk}/regenerate/")
        assert response.status_code == 201, response.content
        run = Run.objects.get(pk=response.json()["run"]["id"])
        if stop_while == "running":
            # Stop pressed as the worker takes it: the loop sees it before its first step.
            Run.objects.filter(pk=run.pk).update(cancel_requested=True)
            run_execute(run_id=run.pk, worker="test")
        assert client.post(f"/api/runs/{run.pk}/cancel/").status_code in (200, 202, 409)
        run.refresh_from_db()
        conversation.refresh_from_db()
        assert run.status == Run.Status.CANCELLED, (stop_while, run.status)
        assert conversation.tip_id == latest.pk, stop_while
        fragment = client.get(f"/conversations/{conversation.pk}/messages/").content.decode()
        assert "a2" in fragment and f'data-retry="{run.pk}"' not in fragment


@pytest.mark.req("UX-2", "UX-8")
def test_rename_and_delete_take_only_strings_and_refuse_while_a_run_works(alice, bob):
    conversation = Conversation.objects.create(owner=alice, title="old")
    client = _client(alice)
    url = f"/api/conversations/{conversation.pk}/"
    assert client.patch(url, {"title": " new "}, content_type="application/json").json()["title"] == "new"
    for bad in (42, "   ", None):
        assert client.patch(url, {"title": bad}, content_type="application/json").status_code == 400
    sent = client.post(f"{url}messages/", {"text": 7}, content_type="application/json")
    assert sent.status_code == 400 and "string" in sent.json()["error"]["message"]
    assert Conversation.objects.get(pk=conversation.pk).title == "new"
    assert not Message.objects.filter(conversation=conversation).exists()
    assert _client(bob).delete(url).status_code == 404
    question, _ = _turn(conversation, None, "q", "a")
    run = Run.objects.create(conversation=conversation, trigger=question, provider="offline", model="offline-1")
    assert client.delete(url).status_code == 409
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    assert client.delete(url).status_code == 204
    assert not Conversation.objects.filter(pk=conversation.pk).exists()


@pytest.mark.req("UX-6")
@override_settings(CC_MODEL_PRICES={"my-model": (2.0, 10.0)})
def test_money_comes_from_prices_and_is_a_dash_where_unknown(alice):
    assert costs.price_for("claude-sonnet-4-5-20250929") == (3.0, 15.0)  # dated names cost their family's
    assert costs.price_for("offline-1") is None
    usage = {"input_tokens": 1_000_000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1_000_000}
    assert costs.usage_cost("my-model", {**usage, "output_tokens": 100_000}) == pytest.approx(2.0 + 0.2 + 1.0)
    # Cache writes cost by their TTL: 1.25x for 5 minutes, 2x for the hour the tools prefix is written with.
    written = {"cache_creation_input_tokens": 1_000_000, "cache_creation_1h_input_tokens": 600_000}
    assert costs.usage_cost("my-model", written) == pytest.approx(0.4 * 2.0 * 1.25 + 0.6 * 2.0 * 2.0)
    conversation = Conversation.objects.create(owner=alice, title="m")
    question, _ = _turn(conversation, None, "q", "a")
    run = Run.objects.create(
        conversation=conversation, trigger=question, provider="offline", model="my-model", status="succeeded"
    )
    ModelRequest.objects.create(
        run=run, step=1, model="my-model", input_tokens=100, cache_read_input_tokens=900, output_tokens=10
    )
    fragment = _client(alice).get(f"/conversations/{conversation.pk}/messages/").content.decode()
    assert "90.0% from cache" in fragment and "$0.0005" in fragment  # (100*2 + 900*0.2 + 10*10) / 1e6
    assert 'id="context-meter"' in fragment and "1,010 / 200,000" in fragment
    ModelRequest.objects.create(
        run=run, step=2, model="my-model", cache_creation_input_tokens=1000, cache_creation_1h_input_tokens=1000
    )
    fragment = _client(alice).get(f"/conversations/{conversation.pk}/messages/").content.decode()
    assert "$0.0045" in fragment  # + 1000 * 2 * 2.0 / 1e6 for the hour-long write (at 1.25x: $0.0030)
    ModelRequest.objects.create(run=run, step=3, model="offline-1", input_tokens=5, output_tokens=1)
    fragment = _client(alice).get(f"/conversations/{conversation.pk}/messages/").content.decode()
    assert '<span class="money" id="conversation-cost">—</span>' in fragment  # unknown, never $0


@pytest.mark.req("UX-6")
def test_the_usage_bar_alone_shows_a_running_runs_requests_so_far_to_its_owner_only(alice, bob):
    conversation = Conversation.objects.create(owner=alice, title="live usage")
    question, _ = _turn(conversation, None, "q", "a")
    run = Run.objects.create(
        conversation=conversation, trigger=question, provider="offline", model="m", status="running"
    )
    url = f"/conversations/{conversation.pk}/usage/"
    bar = _client(alice).get(url).content.decode()
    assert 'id="conversation-usage"' in bar and "No model requests yet." in bar
    ModelRequest.objects.create(run=run, step=1, model="m", input_tokens=1_200, output_tokens=30)  # step 1 is in
    bar = _client(alice).get(url).content.decode()
    assert "1,200 in" in bar and "30 out" in bar and "1,230 / 200,000" in bar
    assert "All runs:" in bar  # the whole conversation's, where a prompt's card shows its own run's
    # A child's request and a summary call are other contexts: the meter stays with the conversation's turn.
    for label in ("a1b2c3/0", "summary"):
        ModelRequest.objects.create(run=run, step=1, subagent=label, model="m", input_tokens=90_000, output_tokens=9)
    bar = _client(alice).get(url).content.decode()
    assert "181,200 in" in bar and "1,230 / 200,000" in bar  # their tokens count, not as the window's fill
    assert bar in _client(alice).get(f"/conversations/{conversation.pk}/messages/").content.decode()  # one drawing
    assert _client(bob).get(url).status_code == 404
    assert Client().get(url).status_code == 302  # to the sign-in page


@pytest.mark.req("UX-2", "CH-7")
def test_a_tip_moved_onto_an_answered_prompt_says_where_its_answer_is_and_offers_to_answer_it(alice):
    conversation = Conversation.objects.create(owner=alice, title="dead end?")
    question, answer = _turn(conversation, None, "q", "a")
    Run.objects.create(conversation=conversation, trigger=question, provider="offline", model="m", status="succeeded")
    conversation.tip = question  # Branch here on the prompt
    conversation.save()
    fragment = _client(alice).get(f"/conversations/{conversation.pk}/messages/").content.decode()
    assert "answered on another branch" in fragment
    assert f'data-branch="{answer.pk}">Show its answer' in fragment and "Answer it again" in fragment
    conversation.tip = answer
    conversation.save()
    fragment = _client(alice).get(f"/conversations/{conversation.pk}/messages/").content.decode()
    assert "unanswered" not in fragment  # on the answer: nothing to say


@pytest.mark.req("UX-7")
def test_the_admin_lists_approvals_and_keeps_audit_data_read_only(alice):
    admin = get_user_model().objects.create_superuser("root", password="root-password-1")
    conversation = Conversation.objects.create(owner=alice, title="a")
    question, _ = _turn(conversation, None, "q", "a")
    run = Run.objects.create(conversation=conversation, trigger=question, provider="offline", model="offline-1")
    client = _client(admin)
    assert client.get("/admin/agents/approval/").status_code == 200
    assert b"Retrieval misses" in client.get("/admin/").content
    assert client.get("/admin/agents/run/add/").status_code == 403
    assert client.post(f"/admin/agents/run/{run.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Run.objects.filter(pk=run.pk).exists()
    page = client.get(f"/admin/agents/run/{run.pk}/change/").content.decode()
    assert 'name="status"' not in page  # shown, not editable


@pytest.mark.req("UX-8", "SB-6")
def test_the_schema_describes_the_tree_and_the_docs_are_served_by_the_app(alice):
    client = _client(alice)
    schema = client.get("/api/schema/?format=json").json()
    tree = schema["components"]["schemas"]["MessageTree"]
    assert set(tree["properties"]) == {"conversation", "tip", "roots", "messages"}
    assert tree["properties"]["tip"].get("nullable") is True
    assert schema["components"]["schemas"]["Tool"]["properties"]["server"].get("nullable") is True
    export = schema["paths"]["/api/conversations/{conversation_id}/export/{kind}/"]["get"]
    kind = next(p for p in export["parameters"] if p["name"] == "kind")
    assert kind["schema"]["enum"] == ["json", "markdown"]
    assert "text/markdown" in export["responses"]["200"]["content"]
    docs = client.get("/api/docs/").content.decode()
    assert "cdn" not in docs.lower() and "/static/drf_spectacular_sidecar/" in docs
