"""CachedTextEncoder: each distinct text reaches the backbone once, results unchanged."""

from __future__ import annotations

import numpy as np

from sparsemm.encoders.base import CachedTextEncoder


class Counting:
    name = "counting"
    dim = 3

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):  # type: ignore[no-untyped-def]
        self.calls.append(list(texts))
        out = np.array([[len(t), t.count("a"), 1.0] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True) if normalize else out


def test_each_text_is_encoded_once_and_rows_match_the_backbone() -> None:
    base = Counting()
    enc = CachedTextEncoder(base, size=8)
    first = enc.encode_text(["a cat", "a dog", "a cat"])
    assert base.calls == [["a cat", "a dog"]]
    second = enc.encode_text(["a dog", "a bag"])
    assert base.calls[-1] == ["a bag"]
    np.testing.assert_array_equal(second[0], first[1])
    np.testing.assert_array_equal(first, Counting().encode_text(["a cat", "a dog", "a cat"]))
    assert enc.dim == 3 and enc.name == "counting"  # everything else is the backbone's


def test_unnormalised_calls_bypass_the_cache_and_the_cache_is_bounded() -> None:
    base = Counting()
    enc = CachedTextEncoder(base, size=2)
    raw = enc.encode_text(["abc"], normalize=False)
    assert raw[0, 0] == 3.0 and len(enc.cache) == 0
    enc.encode_text(["x", "y", "z"])
    assert len(enc.cache) == 2
    enc.encode_text(["x"])  # evicted: encoded again
    assert base.calls[-1] == ["x"]
    assert enc.encode_text([]).shape == (0, 3)
