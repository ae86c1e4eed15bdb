"""The hybrid ranker's fusion and its stored embeddings (TD-6), and the numpy model against torch (TS-2).

The fusion tests drive the code with a deterministic bag-of-words stand-in encoder
(fast, and it makes the synonym a real model would know explicit). The model test
runs the shipped numpy MiniLM against vectors the torch version computed.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from engine.catalog import minilm
from engine.catalog.ranking import ToolIndex, catalog_fingerprint
from engine.catalog.semantic import NAME_WEIGHT, HybridIndex, hybrid_index_for, name_words, tool_embeddings, tool_text
from engine.catalog.surface import ToolRecord
from tests.support.catalog import reference_records

DIMENSIONS = 4096
SYNONYMS = {"ping": "message", "dm": "message", "notify": "message"}


class WordEncoder:
    """Hashes words into a normalised vector; maps a few synonyms the way a real model would."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        vectors = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().replace(".", " ").replace("_", " ").split():
                word = SYNONYMS.get(word, word)
                vectors[row, zlib.crc32(word.encode()) % DIMENSIONS] += 1
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1, norms)


@pytest.mark.req("TD-6")
def test_fusion_finds_a_tool_bm25_misses_and_respects_the_allowed_names():
    records = reference_records()
    encoder = WordEncoder()
    bm25 = ToolIndex(records)
    embeddings = tool_embeddings(bm25.tools, fingerprint="x", encode=encoder, cache_dir=None)
    hybrid = HybridIndex(bm25, embeddings, encoder)
    # Only the stand-in's synonym links "dm" (a direct message) to messaging tools; BM25 has no such word.
    assert bm25.search("dm", k=5) == []
    found = [match.tool.name for match in hybrid.search("dm", k=5)]
    assert found[0] == "send_message"
    # A name the mode denied never comes back, however close it is.
    allowed = {record.name for record in records} - {found[0]}
    assert found[0] not in [match.tool.name for match in hybrid.search("dm", k=5, allowed=allowed)]
    assert hybrid.search("   ", k=5) == []


@pytest.mark.req("TD-6")
def test_embeddings_are_computed_once_per_catalog_version_and_stored(tmp_path):
    records = reference_records()
    encoder = WordEncoder()
    first = hybrid_index_for(records, cache_dir=tmp_path, encode=encoder)
    assert hybrid_index_for(records, cache_dir=tmp_path, encode=encoder) is first
    assert encoder.calls == 2  # the tools' texts, then their names
    fingerprint = catalog_fingerprint(records)
    stored = sorted(path.name for path in tmp_path.glob("*.npy"))
    assert stored == [f"all-MiniLM-L6-v2-{part}-{fingerprint}.npy" for part in ("name", "text")]
    # Another process (here: the same tools listed in another order) reads the files, not the model.
    fresh = WordEncoder()
    reordered = list(reversed(records))
    vectors = tool_embeddings(reordered, fingerprint=fingerprint, encode=fresh, cache_dir=tmp_path)
    assert fresh.calls == 0
    texts = WordEncoder()([tool_text(tool) for tool in reordered])
    names = WordEncoder()([name_words(tool) for tool in reordered])
    assert np.allclose(vectors, texts + NAME_WEIGHT * names)


@pytest.mark.req("TD-6", "TS-1")
def test_a_tools_name_counts_beside_its_whole_text():
    """Of two tools whose texts say a query's words equally often, the one whose name says them ranks
    first: in the text a name is one phrase among many sentences."""
    named = ToolRecord(
        name="convert_units",
        group="Data",
        description="Takes a value and answers in another system; handles temperature, length and weight.",
        input_schema={"type": "object"},
    )
    mentions = ToolRecord(
        name="lookup_facts",
        group="Data",
        description="Answers questions about facts, and can also convert units when asked to.",
        input_schema={"type": "object"},
    )
    encoder = WordEncoder()
    tools = [mentions, named]
    hybrid = HybridIndex(
        ToolIndex(tools), tool_embeddings(tools, fingerprint="x", encode=encoder, cache_dir=None), encoder
    )
    assert [match.tool.name for match in hybrid.search("convert units", k=2)] == ["convert_units", "lookup_facts"]


@pytest.mark.req("TD-6")
@pytest.mark.django_db
def test_the_hybrid_setting_gives_runs_and_the_mcp_search_the_hybrid_index(settings, tmp_path):
    from toolcatalog.mcp_server import _catalog_index
    from toolcatalog.selectors import catalog_records
    from toolcatalog.services import catalog_load_builtins
    from toolcatalog.toolbox import run_toolbox, search_index

    catalog_load_builtins()
    records = catalog_records()
    # Built with the stand-in encoder and cached for this catalog version, so the
    # settings' path below finds it instead of loading the real model.
    hybrid = hybrid_index_for(records, cache_dir=tmp_path, encode=WordEncoder())
    settings.CC_TOOL_SEARCH_RANKER = "bm25"
    assert search_index(records) is not hybrid
    settings.CC_TOOL_SEARCH_RANKER = "hybrid"
    assert search_index(records) is hybrid
    assert _catalog_index()[0] is hybrid
    toolbox = run_toolbox(workspace=tmp_path, deferral=False)
    found = toolbox.execute("search_tools", {"query": "replace text in a file"})
    assert found["matches"][0]["name"] == "edit_file"
    assert toolbox._index() is hybrid


@pytest.mark.req("TS-2")
def test_the_numpy_model_matches_the_torch_version():
    # Vectors and token ids from sentence-transformers on torch (tests/data/minilm-reference.json says which).
    tests = next(folder for folder in Path(__file__).resolve().parents if folder.name == "tests")
    reference = json.loads((tests / "data" / "minilm-reference.json").read_text())
    model = minilm.MiniLM()
    for text, ids in zip(reference["texts"], reference["token_ids"], strict=True):
        assert model.tokenizer.encode(text) == ids
    ours = model.encode(reference["texts"])
    expected = np.asarray(reference["vectors"], dtype=np.float32)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # int8 weights: within a hair of the float32 model, far closer than any two different texts.
    assert (ours * expected).sum(axis=1).min() > 0.995
    assert (ours @ expected.T - np.eye(len(expected))).max() < 0.9
    # Batching pads shorter texts; padding must not change a text's vector.
    alone = model.encode([reference["texts"][0]])[0]
    assert np.allclose(alone, ours[0], atol=1e-5)
