"""benchmarks/grow_collection.py: a larger collection drawn from a real one, readable and
indexable like any other."""

from __future__ import annotations

import sys
from pathlib import Path

import grow_collection  # benchmarks/ is on sys.path (conftest)
import numpy as np
import pytest

from fakes import KeywordEncoder, keyword_collection
from sparsemm.data.collection import open_collection


class _Enc(KeywordEncoder):
    name = "growkw"
    keywords = ("dog", "cat", "tree")


def _run(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["grow_collection.py", *args])
    grow_collection.main()


def test_grown_items_copy_their_source_and_stay_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = keyword_collection(tmp_path / "src", _Enc(), {"a": ["dog"], "b": ["cat", "tree"]})
    _run(monkeypatch, str(src), str(tmp_path / "big"), "--items", "40", "--noise", "0.1")
    big = open_collection(tmp_path / "big")
    source = open_collection(src)
    assert len(big.items) == 40 and len(set(big.ids)) == 40
    emb = big.image_embeddings()
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    by_id = {it["id"]: it for it in source.items}
    for it, e in zip(big.items, emb, strict=True):
        orig = by_id[it["id"].split("~")[0]]
        assert it["captions"] == orig["captions"] and it["labels"] == orig["labels"]
        row = source.ids.index(orig["id"])
        assert float(e @ source.image_embeddings()[row]) > 0.9  # near its source item
    assert big.manifest["grown_from"]["noise"] == 0.1


def test_bad_source_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match=r"^error: .*not a sparsemm collection"):
        _run(monkeypatch, str(tmp_path / "nothing"), str(tmp_path / "out"))
    with pytest.raises(SystemExit, match="--items"):
        _run(monkeypatch, str(tmp_path / "nothing"), str(tmp_path / "out"), "--items", "0")
    assert not (tmp_path / "out").exists()
