"""The context ladder and snapshots (CH-1, CH-2, CH-3, CH-4)."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from conversations import services
from conversations.models import Compaction, Message
from engine.context import ladder, snapshots
from engine.context.transcript import image_tokens, pairing_problems, transcript_tokens, trim_for_resume
from engine.tokens import estimate_text_tokens
from tests.support.history import add_turn

PROSE = "The quick brown fox checks the build log, line by line, and writes down what failed. "


def _png(width: int, height: int) -> dict:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(buffer.getvalue()).decode()},
    }


def long_session(turns: int = 12, *, screenshot_every: int = 4) -> list[dict]:
    """A task, then many turns with big tool results and some screenshots, all with ids."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "TASK: port the parser. Never change the API."}]}]
    for turn in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{turn}", "name": "read_file", "input": {"n": turn}}],
            }
        )
        result = json.dumps({"ok": True, "scratchpad_id": f"sp-{turn}", "text": PROSE * 40})
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{turn}", "content": result}]}
        )
        reply = [{"type": "text", "text": f"Turn {turn}: " + PROSE * 15}]
        messages.append({"role": "assistant", "content": reply})
        prompt = [{"type": "text", "text": f"Continue with step {turn + 1}."}]
        if turn % screenshot_every == 0:
            prompt.append(_png(800, 600))
        messages.append({"role": "user", "content": prompt})
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "Working on the last step."}]})
    for index, message in enumerate(messages, start=1):
        message["id"] = index
    return messages


def _tail(session: list[dict], tail_tokens: int) -> list[dict]:
    return trim_for_resume(session[1:], budget_tokens=tail_tokens).messages


@pytest.mark.req("CH-1")
def test_rungs_run_cheapest_first_and_each_reports_what_it_freed():
    session = long_session()
    result = ladder.compact(session, rungs=ladder.RUNGS, tail_tokens=600, summarize=lambda text: "summary")
    assert [step.rung for step in result.steps] == ["elide", "drop_images", "snapshot", "summary"]
    elide, drop, snapshot, _ = result.steps
    assert elide.items > 0 and elide.freed > 0
    assert drop.items > 0 and drop.freed > 0
    assert snapshot.items > 0 and snapshot.detail["pages"] == snapshot.items
    assert result.tokens_before > result.tokens_after
    assert result.tokens_before == elide.tokens_before and elide.tokens_after == drop.tokens_before


@pytest.mark.req("CH-1")
def test_the_ladder_stops_at_the_first_rung_that_fits_and_never_summarizes_then():
    session = long_session()
    calls = []
    full = transcript_tokens(session)
    result = ladder.compact(session, target_tokens=full - 100, tail_tokens=600, summarize=calls.append)
    assert [step.rung for step in result.steps] == ["elide"]
    assert result.tokens_after <= full - 100 and calls == []


@pytest.mark.req("CH-1")
def test_elision_replaces_old_uneventful_results_with_a_stub_that_says_how_to_get_them_back():
    session = long_session()
    failing = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "boom " * 200, "is_error": True}],
    }
    session[6] = {**failing, "id": session[6]["id"]}
    result = ladder.compact(session, rungs=["elide"], tail_tokens=600)
    assert pairing_problems(result.messages) == []
    stubs = [
        block["content"]
        for message in result.messages
        for block in message["content"]
        if block.get("type") == "tool_result" and str(block["content"]).startswith("[elided")
    ]
    assert stubs and "message #3" in stubs[0] and "scratchpad entry sp-0" in stubs[0] and "read_file" in stubs[0]
    # The failed call is eventful: it is kept word for word.
    assert any(b.get("is_error") and b["content"] == "boom " * 200 for m in result.messages for b in m["content"])
    # The head (the task) and the tail (current work) are untouched.
    assert result.messages[0]["content"] == session[0]["content"]
    tail = _tail(session, 600)
    assert result.messages[-len(tail) :] == tail
    # The input is not changed: the database copy stays whole.
    assert len(json.loads(session[2]["content"][0]["content"])["text"]) == len(PROSE * 40)


@pytest.mark.req("CH-1")
def test_image_dropping_captions_old_screenshots_and_keeps_recent_ones():
    session = long_session(turns=9, screenshot_every=4)
    result = ladder.compact(session, rungs=["drop_images"], tail_tokens=1500)
    captions = [
        b["text"]
        for m in result.messages
        for b in m["content"]
        if b.get("type") == "text" and "image dropped" in b["text"]
    ]
    assert captions and "800x600" in captions[0]
    # Each dropped 800x600 screenshot frees its image tokens less a short caption.
    assert result.steps[0].freed >= result.steps[0].items * (image_tokens(800, 600) - 50) > 0
    # The latest screenshot is in the tail and stays.
    assert any(b.get("type") == "image" for m in result.messages[-8:] for b in m["content"])


@pytest.mark.req("CH-1")
def test_summary_is_the_last_resort_and_its_input_is_bounded():
    session = long_session(turns=40)
    seen = []

    def summarize(text: str) -> str:
        seen.append(len(text))
        return "We ported most of the parser."

    result = ladder.compact(session, rungs=["elide", "summary"], tail_tokens=600, summarize=summarize)
    assert seen and max(seen) <= ladder.SUMMARY_INPUT_CHARS + 100
    assert result.rung == "summary"
    assert any("We ported most of the parser." in b.get("text", "") for m in result.messages for b in m["content"])
    assert pairing_problems(result.messages) == []


@pytest.mark.req("CH-2")
def test_overflow_recovery_needs_no_model_call():
    session = long_session(turns=30)
    target = transcript_tokens(session) // 4

    def no_model(text: str) -> str:
        raise AssertionError("the summary rung was reached")

    result = ladder.compact(session, target_tokens=target, tail_tokens=600, summarize=no_model)
    assert result.tokens_after <= target
    assert result.rung == "snapshot"
    assert pairing_problems(result.messages) == []
    roles = [m["role"] for m in result.messages]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False))


@pytest.mark.req("CH-3")
def test_snapshot_keeps_a_literal_head_and_tail_and_images_the_middle():
    session = long_session()
    result = ladder.compact(session, rungs=["snapshot"], tail_tokens=600)
    first = result.messages[0]["content"]
    assert first[0]["text"].startswith("TASK: port the parser")
    assert first[1]["text"].startswith("[snapshot of messages #2-#")
    assert all(b["type"] == "image" for b in first[2 : 2 + len(result.pages)])
    tail = _tail(session, 600)
    # The tail's first prompt is merged into the snapshot's user turn; the rest is verbatim.
    assert first[-len(tail[0]["content"]) :] == tail[0]["content"]
    assert result.messages[1:] == tail[1:]
    assert result.replaced[0]["messages"] == list(range(2, tail[0]["id"]))


@pytest.mark.req("CH-3")
def test_a_page_carries_far_more_characters_than_its_image_costs():
    text = [{"role": "user", "content": [{"type": "text", "text": PROSE * 1000}]}]
    for rule in ("area", "fixed"):
        shape = snapshots.PAGE_SHAPES[rule]
        pages, report = snapshots.render(text, shape=shape, image_rule=rule)
        assert report.pages == len(pages) >= 1
        assert report.chars_per_page[0] > 0.9 * shape.columns * shape.rows
        # A full page, measured as the renderer reports it: text tokens of its characters per image token.
        ratio = estimate_text_tokens("x" * report.chars_per_page[0]) / report.image_tokens_per_page
        assert ratio >= (2.5 if rule == "area" else 8), (rule, ratio)
        assert report.tokens_saved == report.text_tokens - report.image_tokens > 0
        with Image.open(io.BytesIO(pages[0].png)) as page:
            assert page.size == (shape.width, shape.height)


def _cells(page: snapshots.Page, shape: snapshots.PageShape, first: int, count: int) -> list[bytes]:
    """The pixels of `count` glyph cells of the first row, from column `first` on."""
    with Image.open(io.BytesIO(page.png)) as image:
        return [
            image.crop(
                (
                    shape.margin + column * shape.cell_width,
                    shape.margin,
                    shape.margin + (column + 1) * shape.cell_width,
                    shape.margin + shape.cell_height,
                )
            ).tobytes()
            for column in range(first, first + count)
        ]


@pytest.mark.req("CH-3")
def test_text_beyond_latin_1_gets_its_own_glyphs_and_what_the_font_lacks_is_counted():
    # Hungarian double acutes (Latin Extended-A), Portuguese, Greek and Cyrillic, then the
    # replacement character itself and two characters the font has no glyph for.
    text = "oőuűãçΩЖ\ufffd中😀"
    shape = snapshots.PAGE_SHAPES["area"]
    pages, report = snapshots.render([{"id": 1, "role": "user", "content": [{"type": "text", "text": text}]}])
    o, o_double_acute, u, u_double_acute, a_tilde, c_cedilla, omega, zhe, replacement, han, emoji = _cells(
        pages[0], shape, len("[user #1] "), len(text)
    )
    drawn = [o, o_double_acute, u, u_double_acute, a_tilde, c_cedilla, omega, zhe, replacement]
    assert len(set(drawn)) == len(drawn), "every covered character has a glyph of its own"
    question_mark = _cells(
        snapshots.render([{"role": "user", "content": [{"type": "text", "text": "?"}]}])[0][0], shape, len("[user] "), 1
    )[0]
    assert question_mark not in drawn
    # What the font lacks is drawn as the visible replacement glyph and reported, never as '?'.
    assert han == emoji == replacement != question_mark
    assert report.missing_chars == 2 and report.missing == {"中": 1, "😀": 1}
    # A combining accent is composed first, so 'o' + U+030B takes the precomposed glyph.
    decomposed, _ = snapshots.render([{"id": 1, "role": "user", "content": [{"type": "text", "text": "o\u030b"}]}])
    assert _cells(decomposed[0], shape, len("[user #1] "), 1)[0] == o_double_acute


@pytest.mark.req("CH-3")
def test_tool_results_are_capped_and_dimmer_and_role_markers_are_kept():
    message = {"id": 7, "role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "y" * 5000}]}
    lines = snapshots.source_lines([message])
    assert lines[0].text == "[user #7]" and not lines[0].dim
    assert all(line.dim for line in lines[1:])
    assert "more chars in the transcript" in lines[-1].text
    assert sum(len(line.text) for line in lines) < 2200


@pytest.mark.req("CH-4")
def test_a_second_pass_renders_from_the_retained_text_never_from_earlier_pixels():
    session = long_session(turns=12)
    first = ladder.compact(session, rungs=["snapshot"], tail_tokens=600)
    grown = long_session(turns=20)
    second = ladder.compact(grown, rungs=["snapshot"], tail_tokens=600)
    middle_ids = second.replaced[0]["messages"]
    fresh, _ = snapshots.render([m for m in grown if m["id"] in middle_ids])
    assert [page.png for page in second.pages] == [page.png for page in fresh]
    # The part both passes imaged comes out pixel-identical: no generation loss between passes.
    assert second.pages[0].png == first.pages[0].png


@pytest.mark.django_db
@pytest.mark.req("CH-1")
@pytest.mark.req("CH-10")
def test_compact_service_records_the_pass_and_keeps_every_message(conversation, settings):
    settings.CC_COMPACT_TAIL_TOKENS = 300
    for index in range(6):
        add_turn(
            conversation, f"Step {index}", f"Done {index}", tools=[("read_file", {"ok": True, "text": PROSE * 30})]
        )
    stored = list(Message.objects.filter(conversation=conversation).values_list("id", "content"))
    done = services.conversation_compact(conversation=conversation, rungs=ladder.FREE_RUNGS)
    compaction, result = done.compaction, done.result
    row = Compaction.objects.get()
    assert row.pk == compaction.pk and row.rung == "elide" and row.tip_id == conversation.tip_id
    assert row.tokens_before > row.tokens_after == result.tokens_after
    assert [step["rung"] for step in row.steps] == ["elide", "drop_images"]
    assert row.replaced and all(item["kind"] == "elided" for item in row.replaced)
    assert list(Message.objects.filter(conversation=conversation).values_list("id", "content")) == stored


@pytest.mark.req("CH-2")
def test_compact_to_fit_makes_one_pass_and_says_how_large_the_history_still_is():
    session = long_session(turns=20)
    calls = []

    def summarize(text: str) -> str:
        calls.append(text)
        return "short"

    fitted = ladder.compact_to_fit(session, limit_tokens=transcript_tokens(session) // 3, tail_tokens=600)
    assert fitted.tokens_after <= transcript_tokens(session) // 3
    # A tail that alone exceeds the limit cannot be helped: one pass, then a clear error.
    with pytest.raises(ladder.ContextOverflow, match=r"still \d+ tokens after compaction .* the limit is 500") as error:
        ladder.compact_to_fit(session, limit_tokens=500, tail_tokens=100_000, summarize=summarize)
    assert error.value.result.tokens_after > 500 and len(calls) <= 1


@pytest.mark.req("CH-13")
def test_a_latest_prompt_larger_than_the_tail_stays_text_and_is_never_only_on_a_page():
    session = long_session(turns=10)
    question = "NOW: why does the parser reject this input? " + "Here is the input I mean. " * 1500
    session.append({"id": 999, "role": "user", "content": [{"type": "text", "text": question}]})
    result = ladder.compact(session, rungs=("elide", "drop_images", "snapshot"), tail_tokens=2_000)
    assert result.rung == "snapshot"
    last = result.messages[-1]
    assert last["role"] == "user" and last["content"][-1] == {"type": "text", "text": question}
    pages = [b for m in result.messages for b in m["content"] if b.get("type") == "image"]
    assert pages and all("NOW: why" not in line.text for line in snapshots.source_lines(session[1:-1]))


@pytest.mark.req("CH-13")
def test_what_the_tail_cannot_keep_goes_to_the_scratchpad_with_both_ends_kept_as_text():
    session = long_session(turns=10)
    question = "NOW: why does the parser reject this input? " + "Here is the input I mean. " * 8000 + "Say why."
    session.append({"id": 999, "role": "user", "content": [{"type": "text", "text": question}]})
    stored: dict[str, str] = {}

    def offload(text: str, message_id: int) -> str:
        stored.setdefault(f"entry-{message_id}", text)
        return f"entry-{message_id}"

    options = {"rungs": ("elide", "drop_images", "snapshot"), "tail_tokens": 2_000, "target_tokens": 6_000}
    result = ladder.compact(session, offload=offload, **options)
    assert result.rung == "scratchpad" and result.tokens_after <= 6_000
    (kept,) = [b["text"] for b in result.messages[-1]["content"] if "entry-999" in b.get("text", "")]
    assert kept.startswith("NOW: why") and kept.endswith("Say why.")
    assert "message #999 is scratchpad entry entry-999" in kept and stored["entry-999"] == question
    # Idempotent (CH-11), and without a target (a plain /compact) nothing is taken.
    assert ladder.compact(session, offload=offload, **options).messages == result.messages
    untargeted = ladder.compact(session, offload=offload, rungs=options["rungs"], tail_tokens=2_000)
    assert untargeted.rung == "snapshot" and untargeted.messages[-1]["content"][-1]["text"] == question


@pytest.mark.req("CH-14")
def test_an_empty_summary_is_never_sent_as_an_empty_block():
    session = long_session(turns=6)
    result = ladder.compact(session, rungs=("elide", "summary"), tail_tokens=600, summarize=lambda text: "  \n")
    assert result.rung == "elide" and "no text" in result.steps[-1].note
    assert all(b.get("text") != "" for m in result.messages for b in m["content"] if b.get("type") == "text")


@pytest.mark.req("CH-11")
def test_the_same_messages_give_the_same_view_and_snapshots_are_worth_a_page():
    session = long_session(turns=10)
    first = ladder.compact(session, rungs=("elide", "drop_images", "snapshot"), tail_tokens=800)
    second = ladder.compact(session, rungs=("elide", "drop_images", "snapshot"), tail_tokens=800)
    assert first.messages == second.messages and first.pages and first.rung == "snapshot"
    # A short middle stays text: imaging it would save less than one page costs.
    short = long_session(turns=2)
    result = ladder.compact(short, rungs=("drop_images", "snapshot"), tail_tokens=200)
    step = result.steps[-1]
    assert step.items == 0 and "less than one page costs" in step.note


@pytest.mark.django_db
@pytest.mark.req("CH-11")
def test_a_shake_after_a_compaction_changes_nothing(conversation, settings):
    from agents import chat

    settings.CC_COMPACT_TAIL_TOKENS = 300
    for index in range(8):
        add_turn(conversation, f"Step {index}", f"Done {index}. " + PROSE * 20, tools=[("read_file", PROSE * 40)])
    compacted = services.conversation_compact(conversation=conversation, rungs=("elide", "drop_images", "snapshot"))
    assert compacted.compaction is not None and compacted.compaction.rung == "snapshot"
    before = chat.message_send(conversation=conversation, text="/context").command.data["used_tokens"]
    shaken = chat.message_send(conversation=conversation, text="/shake").command
    assert shaken.data["recorded"] is False and "nothing was recorded" in shaken.detail
    assert Compaction.objects.count() == 1
    assert chat.message_send(conversation=conversation, text="/context").command.data["used_tokens"] == before
