"""REST endpoints of the scratchpad: per-user isolation, reads with the tool's modes, pin; and the viewer page's own
reads, for a form sent without its script."""

from __future__ import annotations

import pytest

from scratchpad import services
from scratchpad.models import Chunk, Entry
from tests.support.scratchpad import make_run, server_log

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_entry(alice):
    run = make_run(alice)
    text = server_log(2000, errors_at_end=1)
    entry = services.put(
        turn_id=str(run.pk), run_id=run.pk, conversation_id=run.conversation_id, content=text, step_num=1
    )
    return run, entry, text


@pytest.mark.req("SP-11")
def test_owner_lists_a_runs_entries_with_metadata_only(alice_api, alice_entry):
    run, entry, text = alice_entry
    response = alice_api.get(f"/api/scratchpad/runs/{run.pk}/entries/")
    assert response.status_code == 200
    [listed] = response.json()
    assert listed["scratchpad_id"] == entry.pk and listed["size_bytes"] == len(text.encode())
    assert "content" not in listed and listed["summary"] == entry.summary


@pytest.mark.req("SP-6")
def test_owner_reads_slices_with_the_tool_modes(alice_api, alice_entry):
    _, entry, text = alice_entry
    url = f"/api/scratchpad/entries/{entry.pk}/read/"
    assert alice_api.get(url, {"mode": "range", "start": 5, "end": 25}).json()["content"] == text[5:25]
    assert alice_api.get(url, {"mode": "tail", "n": 50}).json()["content"] == text[-50:]
    lines = alice_api.get(url, {"mode": "lines", "start": 3, "end": 4}).json()
    assert lines["content"] == "".join(text.splitlines(keepends=True)[2:4])
    found = alice_api.get(url, {"mode": "grep", "pattern": "error", "ignore_case": "true"}).json()
    assert found["matches"] == 1 and found["content"].startswith("2001:")


# What the viewer's form sends when the browser submits it itself (Enter before its script has
# loaded, or no script): every field, those of the other modes too, and the checkbox's value.
NATIVE_FORM = {"n": "2000", "start": "1", "end": "50", "pattern": "", "context": "0"}


@pytest.mark.req("SP-6")
def test_the_viewer_answers_its_form_sent_without_its_script_with_the_slice_asked_for(client, alice, alice_entry):
    _, entry, _ = alice_entry
    client.force_login(alice)
    asked = {**NATIVE_FORM, "mode": "grep", "pattern": "error", "ignore_case": "true"}
    page = client.get(f"/scratchpad/{entry.pk}/", asked)
    assert page.status_code == 200
    html = page.content.decode()
    assert "2001:" in html.split('id="slice"', 1)[1] and "matches: 1" in html
    # The form shows what was asked, so the next read starts from it.
    assert '<option value="grep" selected>' in html and 'name="pattern" value="error"' in html
    assert 'name="ignore_case" value="true" checked' in html
    plain = client.get(f"/scratchpad/{entry.pk}/").content.decode()
    assert entry.summary.splitlines()[0] in plain and '<option value="head" selected>' in plain


@pytest.mark.req("SP-6")
def test_the_viewer_answers_a_bad_form_with_the_apis_message_and_changes_nothing(client, alice, alice_entry):
    _, entry, _ = alice_entry
    client.force_login(alice)
    before = (list(Entry.objects.values_list("id", "expires_at")), Chunk.objects.count())
    page = client.get(f"/scratchpad/{entry.pk}/", {**NATIVE_FORM, "mode": "range", "start": "30", "end": "3"})
    assert page.status_code == 400
    assert 'role="alert">' in page.content.decode() and "range needs start &lt; end" in page.content.decode()
    assert (list(Entry.objects.values_list("id", "expires_at")), Chunk.objects.count()) == before


@pytest.mark.req("SP-6")
@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"mode": "sideways"}, "mode must be one of"),
        ({"mode": "head", "n": "x"}, "n must be an integer; got 'x'"),
        ({"mode": "range", "start": 30, "end": 3}, "range needs start < end"),
        # QA: a range asked without its mode read the head, silently.
        ({"start": 10, "end": 20}, "start and end are read by mode lines or range only, and this read's mode is head"),
        ({"mode": "tail", "pattern": "x"}, "pattern is read by mode grep only, and this read's mode is tail:"),
        ({"mode": "grep", "pattern": "[unclosed"}, "not a valid regular expression"),
        # Compiled, it would take 275 MB of the web process (`a{99999999}` took 23 GB).
        ({"mode": "grep", "pattern": "(?:a{1000}){1000}"}, "would write out up to 1,000,000 copies"),
    ],
)
def test_bad_read_parameters_are_400_and_change_nothing(alice_api, alice_entry, params, message):
    _, entry, _ = alice_entry
    before = (list(Entry.objects.values_list("id", "expires_at")), Chunk.objects.count())
    response = alice_api.get(f"/api/scratchpad/entries/{entry.pk}/read/", params)
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert (list(Entry.objects.values_list("id", "expires_at")), Chunk.objects.count()) == before


@pytest.mark.req("SP-11")
def test_another_user_cannot_see_list_read_or_pin_an_entry(bob_api, alice_entry):
    run, entry, _ = alice_entry
    assert bob_api.get(f"/api/scratchpad/runs/{run.pk}/entries/").status_code == 404
    missing = bob_api.get("/api/scratchpad/entries/0000000000000000/")
    other = bob_api.get(f"/api/scratchpad/entries/{entry.pk}/")
    assert other.status_code == missing.status_code == 404
    assert bob_api.get(f"/api/scratchpad/entries/{entry.pk}/read/").status_code == 404
    assert bob_api.post(f"/api/scratchpad/entries/{entry.pk}/pin/", {}, format="json").status_code == 404
    entry.refresh_from_db()
    assert entry.pinned is False


@pytest.mark.req("SP-11")
def test_owner_pins_an_entry_to_its_conversation(alice_api, alice_entry):
    _, entry, _ = alice_entry
    response = alice_api.post(f"/api/scratchpad/entries/{entry.pk}/pin/", {"ttl_seconds": 86_400}, format="json")
    assert response.status_code == 200 and response.json()["pinned"] is True
    entry.refresh_from_db()
    assert entry.pinned and (entry.expires_at - entry.created_at).total_seconds() >= 86_400 - 5
    bad = alice_api.post(f"/api/scratchpad/entries/{entry.pk}/pin/", {"ttl_seconds": 0}, format="json")
    assert bad.status_code == 400
    # QA: a misspelt option was dropped and the entry pinned for the default time.
    misspelt = alice_api.post(f"/api/scratchpad/entries/{entry.pk}/pin/", {"ttl": 60}, format="json")
    assert misspelt.status_code == 400
    assert "ttl: Unknown field; this endpoint takes ttl_seconds." in misspelt.json()["error"]["message"]


def test_unauthenticated_requests_are_refused(client, alice_entry):
    _, entry, _ = alice_entry
    assert client.get(f"/api/scratchpad/entries/{entry.pk}/").status_code in (401, 403)


@pytest.mark.req("SP-2")
def test_admin_shows_metadata_and_a_short_preview_not_the_blob(admin_client, alice_entry):
    _, entry, text = alice_entry
    page = admin_client.get(f"/admin/scratchpad/entry/{entry.pk}/change/").content.decode()
    assert text.splitlines()[0] in page
    assert text[5000:5100] not in page
    assert admin_client.get("/admin/scratchpad/entry/").status_code == 200


@pytest.mark.req("SP-6")
def test_the_viewer_says_what_the_tool_said_of_its_cut_output(client, alice, alice_entry):
    """QA: `seq 1 200000` was cut at 1 MB by bash; the viewer showed a size and lines, no word of
    the cut, and a grep for the last numbers answered "No line matches"."""
    _, entry, _ = alice_entry
    Entry.objects.filter(pk=entry.pk).update(
        envelope={"ok": True, "_note": "Output above 1000000 bytes per stream was cut.", "stdout_bytes_omitted": 288895}
    )
    client.force_login(alice)
    html = client.get(f"/scratchpad/{entry.pk}/").content.decode()
    assert "The tool said: Output above 1000000 bytes per stream was cut. (stdout bytes: 288,895 omitted)" in html
