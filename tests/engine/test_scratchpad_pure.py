"""Pure scratchpad pieces: summaries, references, the offload split, chunked reads."""

from __future__ import annotations

import base64
import hashlib
import random

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.scratchpad.chunks import encode
from engine.scratchpad.offload import needs_offload, rebuild_observation, split_observation
from engine.scratchpad.read_tool import run_read
from engine.scratchpad.reader import MemoryChunkSource, grep, read_lines, read_slice, shape_of
from engine.scratchpad.references import UnresolvableReference, resolve
from engine.scratchpad.summary import binary_summary, text_summary


@pytest.mark.req("SP-4")
def test_text_summary_keeps_500_head_500_tail_and_the_exact_omitted_count():
    text = "H" * 500 + "m" * 88_042 + "T" * 500
    summary = text_summary(text)
    assert summary == "H" * 500 + "\n[... 88042 characters omitted ...]\n" + "T" * 500


@pytest.mark.req("SP-4")
def test_text_summary_of_a_short_text_is_the_text():
    assert text_summary("x" * 1000) == "x" * 1000
    assert text_summary("x" * 1001) == "x" * 500 + "\n[... 1 characters omitted ...]\n" + "x" * 500


@pytest.mark.req("SP-5")
def test_binary_summary_is_size_and_sha256_without_preview():
    data = bytes(range(256)) * 10
    assert binary_summary(data) == f"[BINARY: 2560 bytes, sha256={hashlib.sha256(data).hexdigest()}]"


def _steps(mapping):
    def lookup(step):
        if step not in mapping:
            raise KeyError(f"step {step} does not exist")
        return mapping[step]

    return lookup


@pytest.mark.req("SP-9")
def test_references_resolve_dotted_paths_list_indexes_and_keep_types():
    steps = _steps({3: {"items": [{"url": "https://a.test/x"}], "metadata": {"path": "/tmp/x", "n": 4}}})
    resolved = resolve(
        {"url": "{{step3.items.0.url}}", "meta": "{{step3.metadata}}", "text": "n={{ step3.metadata.n }}!"}, steps
    )
    assert resolved == {"url": "https://a.test/x", "meta": {"path": "/tmp/x", "n": 4}, "text": "n=4!"}


@pytest.mark.req("SP-9")
def test_resolved_text_is_not_scanned_again():
    steps = _steps({1: {"content": "literal {{step9.x}} inside"}})
    assert resolve({"c": "{{step1.content}}"}, steps) == {"c": "literal {{step9.x}} inside"}


@pytest.mark.req("SP-9")
@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("{{step2.x}}", "step 2 does not exist"),
        ("{{step1.items.5}}", "index 5 is out of range for step1.items (1 items)"),
        ("{{step1.items.first}}", "step1.items is a list; 'first' is not an index"),
        ("{{step1.missing}}", "step1 has no field 'missing' (its fields: blob, items)"),
        ("see {{step1.blob}}", "binary content"),
    ],
)
def test_unresolvable_references_say_what_is_missing(argument, message):
    steps = _steps({1: {"items": ["a"], "blob": b"\x00"}})
    with pytest.raises(UnresolvableReference, match=regex.escape(message)):
        resolve({"a": argument}, steps)


@pytest.mark.req("SP-3")
def test_split_keeps_metadata_and_rebuilds_the_exact_observation():
    observation = {"ok": True, "path": "/tmp/big.log", "bytes": 9000, "encoding": "utf-8", "content": "é" * 9000}
    payload = split_observation(observation, threshold=4096)
    assert payload.field == "content" and payload.kind == "text"
    assert payload.metadata == {"path": "/tmp/big.log", "bytes": 9000, "encoding": "utf-8"}
    rebuilt = rebuild_observation(
        content=payload.content, field=payload.field, encoding=payload.encoding, envelope=payload.envelope
    )
    assert rebuilt == observation


@pytest.mark.req("SP-3")
def test_observation_without_a_dominant_value_is_stored_whole_as_json():
    observation = {"ok": True, "path": ".", "entries": [{"name": f"f{i}", "size": i} for i in range(400)]}
    payload = split_observation(observation, threshold=4096)
    assert payload.field == "" and payload.metadata == {"path": "."}
    assert rebuild_observation(content=payload.content, field="", encoding="json", envelope={}) == observation


@pytest.mark.req("SP-5")
def test_base64_and_invalid_utf8_values_are_stored_as_exact_bytes():
    raw = bytes(range(256)) * 40
    b64 = {"ok": True, "path": "a.zip", "encoding": "base64", "content": base64.b64encode(raw).decode()}
    payload = split_observation(b64, threshold=4096)
    assert payload.kind == "binary" and payload.content == raw
    rebuilt = rebuild_observation(content=raw, field="content", encoding=payload.encoding, envelope=payload.envelope)
    assert rebuilt == b64
    not_utf8 = {"ok": True, "encoding": "utf-8", "content": b"caf\xe9 " * 2000}
    payload = split_observation(not_utf8, threshold=4096)
    assert payload.kind == "binary" and payload.content == b"caf\xe9 " * 2000


@pytest.mark.req("SP-1")
def test_offload_rule_measures_json_dumps_length():
    assert not needs_offload({"content": "a" * 4080}, 4096)  # 4095 characters of JSON
    assert needs_offload({"content": "a" * 4082}, 4096)


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(alphabet="ab\nc€𝄞\n", max_size=300),
    chunk=st.integers(min_value=1, max_value=17),
    data=st.data(),
)
@pytest.mark.req("SP-12")
def test_chunked_slices_and_lines_equal_plain_python(text, chunk, data):
    source = MemoryChunkSource(encode(text, chunk_size=chunk), shape_of(text))
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    assert read_slice(source, start, end) == text[start:end]
    lines = text.splitlines(keepends=True)
    assert shape_of(text).line_count == len(lines)
    if lines:
        first = data.draw(st.integers(1, len(lines)))
        last = data.draw(st.integers(first, len(lines)))
        assert read_lines(source, first, last, 10**9) == "".join(lines[first - 1 : last])


@pytest.mark.req("SP-6")
@pytest.mark.parametrize("context", [0, 1, 2])
def test_grep_matches_plain_line_by_line_grep(context):
    rnd = random.Random(context)
    text = "".join(rnd.choice(["ok\n", "ERROR x\n", "warn\n", "€\n"]) for _ in range(500))
    source = MemoryChunkSource(encode(text, chunk_size=37), shape_of(text))
    pattern = regex.compile("ERROR", regex.MULTILINE)
    result = grep(source, pattern, context=context, max_matches=10_000, timeout_seconds=5, max_chars=10**9)
    lines = text.splitlines()
    shown: dict[int, bool] = {}
    for number, line in enumerate(lines):
        if "ERROR" in line:
            for near in range(max(0, number - context), min(len(lines), number + context + 1)):
                shown.setdefault(near, False)
            shown[number] = True
    expected, previous = [], None
    for number in sorted(shown):
        if previous is not None and number > previous + 1:
            expected.append("--")
        expected.append(f"{number + 1}{':' if shown[number] else '-'}{lines[number]}")
        previous = number
    assert result.content == "\n".join(expected)
    assert result.matches == sum("ERROR" in line for line in lines) and not result.more


@pytest.mark.req("SP-12")
def test_content_is_compressed_at_rest():
    text = "2026-12-02T10:00:00Z INFO request served in 12ms\n" * 20_000
    chunks = encode(text)
    assert sum(len(chunk.data) for chunk in chunks) * 4 < len(text.encode())


@pytest.mark.req("SP-3")
def test_synthetic_observation_of_a_failed_tool_stays_a_failure():
    from engine.scratchpad.offload import synthetic_observation

    observation = {"ok": False, "exit_code": 2, "stderr": "boom\n" * 2000}
    payload = split_observation(observation, threshold=4096)
    synthetic = synthetic_observation(entry_id="0" * 16, step=4, payload=payload, summary="s", ok=False)
    assert synthetic["ok"] is False and synthetic["metadata"] == {"exit_code": 2}
    assert "{{step4.stderr}}" in synthetic["_note"]


def test_pure_core_modules_import_without_django():
    import subprocess
    import sys

    code = (
        "import sys; import engine.observations, engine.scratchpad.summary, engine.scratchpad.references, "
        "engine.scratchpad.offload, engine.scratchpad.reader, engine.scratchpad.read_tool, engine.scratchpad.chunks; "
        "assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')], 'django imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.req("SP-6")
def test_grep_finds_a_match_deep_inside_a_line_longer_than_a_million_characters():
    text = "start\n" + "a" * 2_500_000 + "NEEDLE" + "b" * 10 + "\nnext NEEDLE\n"
    source = MemoryChunkSource(encode(text), shape_of(text))
    result = grep(
        source, regex.compile("NEEDLE", regex.MULTILINE), context=0, max_matches=10, timeout_seconds=5, max_chars=10**9
    )
    assert result.matches == 2 and result.split_lines == [2]
    first, second = result.content.splitlines()
    assert first.startswith("2:") and "more characters" in first
    assert second == "3:next NEEDLE"


@pytest.mark.req("SP-6")
def test_a_grep_read_is_bounded_like_any_read_and_says_where_it_stopped():
    # QA: 3,000 matching lines of 1,500 characters with max_matches=500 returned 532,187 characters
    # in one read (133,000 input tokens on the next request).
    text = "".join(f"x{number:05} " + "y" * 1493 + "\n" for number in range(3000))
    source = MemoryChunkSource(encode(text), shape_of(text))
    found = run_read(
        {"scratchpad_id": "e1", "mode": "grep", "pattern": "x", "max_matches": 500},
        lambda entry_id: source,
        max_chars=20_000,
    )
    assert found["ok"] and len(found["content"]) <= 20_000
    shown = found["content"].splitlines()
    assert shown[0].startswith("1:x00000") and found["matches"] == len(shown) < 500
    assert found["stopped_before_line"] == len(shown) + 1
    assert f"stop before line {len(shown) + 1}" in found["_note"]


@pytest.mark.req("SP-6")
def test_a_cut_line_in_grep_names_the_range_read_that_shows_the_rest():
    # QA: the marker said "read this line with mode=lines", which refuses a line longer than one read.
    text = "first\nsecond\n" + "a" * 1500 + "NEEDLE" + "b" * 30_000 + "\n"
    source = MemoryChunkSource(encode(text), shape_of(text))
    found = run_read({"scratchpad_id": "e1", "mode": "grep", "pattern": "NEEDLE"}, lambda entry_id: source)
    marker = regex.search(r"mode=range from start=(\d+)\]", found["content"])
    assert marker, found["content"][-200:]
    start = int(marker.group(1))
    rest = run_read(
        {"scratchpad_id": "e1", "mode": "range", "start": start, "end": start + 506}, lambda entry_id: source
    )
    assert rest["content"] == "a" * 500 + "NEEDLE"


@pytest.mark.req("SP-6")
def test_a_scratchpad_id_of_the_wrong_type_is_named_as_such_not_as_missing():
    source = MemoryChunkSource(encode("text\n"), shape_of("text\n"))
    wrong = run_read({"scratchpad_id": ["x"], "mode": "head"}, lambda entry_id: source)
    assert wrong == {"ok": False, "error": wrong["error"]} and "must be a string" in wrong["error"]
    assert "['x']" in wrong["error"]
    missing = run_read({"mode": "head"}, lambda entry_id: source)
    assert "is required" in missing["error"]
