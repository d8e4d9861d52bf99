"""Rebuilding an index in place is atomic, and readers survive segments vanishing under them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from index_testlib import random_codes

from sparsemm.data.collection import write_collection
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.index import inverted as inverted_mod
from sparsemm.index import segments as segments_mod
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.query.handle import INDEX_DIR
from sparsemm.query.indexing import build_index
from sparsemm.query.searcher import Searcher

DIM = 30


def _codes(n: int, seed: int = 0) -> sp.csr_matrix:
    return random_codes(np.random.default_rng(seed), n, DIM, max_nnz=6)


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def _segment_dirs(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir()}


def _manifest(root: Path) -> dict[str, Any]:
    return dict(json.loads((root / "manifest.json").read_text()))


def _crash(*args: Any, **kwargs: Any) -> Any:
    raise OSError("simulated crash while writing the segment")


# ---------------------------------------------------------------------------------------------
# build(overwrite=True) is atomic
# ---------------------------------------------------------------------------------------------


def test_crash_mid_rebuild_keeps_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(40), _ids("old", 40), meta={"model": "old"})
    monkeypatch.setattr(inverted_mod, "write_segment", _crash)
    with pytest.raises(OSError, match="simulated crash"):
        InvertedIndex.build(root, _codes(25, 1), _ids("new", 25), overwrite=True, meta={"m": 2})
    monkeypatch.undo()
    old = InvertedIndex.open(root)
    assert old.ids == tuple(_ids("old", 40)) and old.meta == {"model": "old"}
    assert (old.codes(np.arange(40)) != _codes(40)).nnz == 0
    # the retry succeeds and leaves only the new segment
    new = InvertedIndex.build(root, _codes(25, 1), _ids("new", 25), overwrite=True, meta={"m": 2})
    assert InvertedIndex.open(root).ids == tuple(_ids("new", 25)) and new.meta == {"m": 2}
    assert _segment_dirs(root) == {s["name"] for s in _manifest(root)["segments"]}


@pytest.mark.parametrize("fail_at", [1, 3, 6])
def test_crash_part_way_through_the_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    """A half-written segment folder is left behind, never named by the manifest."""
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(40), _ids("old", 40))
    real, calls = segments_mod.save_npy, [0]

    def save_npy(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] == fail_at:
            raise OSError("simulated crash")
        real(*args, **kwargs)

    monkeypatch.setattr(segments_mod, "save_npy", save_npy)
    with pytest.raises(OSError, match="simulated crash"):
        InvertedIndex.build(root, _codes(25, 1), _ids("new", 25), overwrite=True)
    monkeypatch.undo()
    assert InvertedIndex.open(root).ids == tuple(_ids("old", 40))


def test_crash_at_the_manifest_swap_keeps_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(40), _ids("old", 40))
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst).name == "manifest.json":
            raise OSError("simulated crash at commit")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="simulated crash"):
        InvertedIndex.build(root, _codes(25, 1), _ids("new", 25), overwrite=True)
    monkeypatch.undo()
    assert InvertedIndex.open(root).ids == tuple(_ids("old", 40))


def test_old_index_is_readable_until_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(40), _ids("old", 40))
    seen: list[tuple[str, ...]] = []
    real = inverted_mod.write_segment

    def write_segment(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)  # the new segment is complete, the manifest not yet swapped
        seen.append(InvertedIndex.open(root).ids)

    monkeypatch.setattr(inverted_mod, "write_segment", write_segment)
    InvertedIndex.build(root, _codes(25, 1), _ids("new", 25), overwrite=True)
    assert seen == [tuple(_ids("old", 40))]
    assert InvertedIndex.open(root).ids == tuple(_ids("new", 25))


def test_rebuild_with_another_dim_and_stale_writer(tmp_path: Path) -> None:
    root = tmp_path / "ix"
    stale = InvertedIndex.build(root, _codes(10), _ids("old", 10))
    wider = sp.random(5, DIM + 4, density=0.2, format="csr", random_state=0)
    InvertedIndex.build(root, wider, _ids("new", 5), overwrite=True)
    with pytest.raises(SparsemmError, match="dimension"):
        stale.add(_codes(2, 3), ["x", "y"])
    assert len(InvertedIndex.open(root)) == 5 and InvertedIndex.open(root).dim == DIM + 4


def test_rebuild_to_empty_and_refusals(tmp_path: Path) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(10), _ids("old", 10))
    with pytest.raises(SparsemmError, match="already exists"):
        InvertedIndex.build(root, _codes(3, 1), _ids("new", 3))
    empty = InvertedIndex.build(root, sp.csr_matrix((0, DIM)), [], overwrite=True)
    assert len(empty) == 0 and len(InvertedIndex.open(root)) == 0
    assert not _segment_dirs(root)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SparsemmError, match="not a folder"):
        InvertedIndex.build(afile, _codes(3), _ids("a", 3))


def test_crash_in_a_fresh_folder_can_be_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ix"
    real, calls = segments_mod.save_npy, [0]

    def save_npy(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] == 3:
            raise OSError("simulated crash")
        real(*args, **kwargs)

    monkeypatch.setattr(segments_mod, "save_npy", save_npy)
    with pytest.raises(OSError, match="simulated crash"):
        InvertedIndex.build(root, _codes(10), _ids("a", 10))
    monkeypatch.undo()
    with pytest.raises(SparsemmError, match="not a sparsemm index"):
        InvertedIndex.open(root)  # nothing was committed
    index = InvertedIndex.build(root, _codes(10), _ids("a", 10))  # no overwrite needed
    assert len(index) == 10
    assert _segment_dirs(root) == {s["name"] for s in _manifest(root)["segments"]}


# ---------------------------------------------------------------------------------------------
# A reader whose segment files are deleted between its manifest read and its loads retries
# ---------------------------------------------------------------------------------------------


def _rebuild_before_first(
    monkeypatch: pytest.MonkeyPatch, name: str, root: Path, when: Callable[[Path], bool]
) -> list[int]:
    """Patch ``segments_mod.<name>`` so that, the first time it is asked for a path matching
    ``when``, the index at ``root`` is rebuilt (old segments deleted) before the real read."""
    real = getattr(segments_mod, name)
    fired: list[int] = []

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        if not fired and when(Path(path)):
            fired.append(1)
            InvertedIndex.build(root, _codes(7, 5), _ids("new", 7), overwrite=True)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(segments_mod, name, reader)
    return fired


@pytest.mark.parametrize(
    ("name", "filename"),
    [("load_npy", "post_blocks.npy"), ("load_npy", "row_vals.npy"), ("read_json", "ids.json")],
)
def test_reader_retries_when_a_merge_deletes_a_segment_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, filename: str
) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(20), _ids("old", 20))
    fired = _rebuild_before_first(monkeypatch, name, root, lambda p: p.name == filename)
    index = InvertedIndex.open(root)
    assert fired and index.ids == tuple(_ids("new", 7))


def test_reader_retries_when_a_merge_deletes_a_file_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file exists when checked and is gone when read: still a retry, not an error."""
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(20), _ids("old", 20))
    real_load = np.load
    fired: list[int] = []

    def load(path: Any, *args: Any, **kwargs: Any) -> Any:
        if not fired and Path(path).name == "post_rows.npy":
            fired.append(1)
            InvertedIndex.build(root, _codes(7, 5), _ids("new", 7), overwrite=True)
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(np, "load", load)
    index = InvertedIndex.open(root)
    assert fired and index.ids == tuple(_ids("new", 7))


def test_a_missing_file_without_a_new_commit_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(20), _ids("old", 20))
    seg = root / _manifest(root)["segments"][0]["name"]
    (seg / "ids.json").unlink()
    with pytest.raises(SparsemmError, match=r"incomplete: .*ids\.json is missing"):
        InvertedIndex.open(root)


# ---------------------------------------------------------------------------------------------
# build_index: the codes and their dimension labels are one commit
# ---------------------------------------------------------------------------------------------

WORDS = ("dog", "cat", "pizza", "car")


def _collection(tmp_path: Path, n_copies: int = 6) -> Path:
    items, image_emb = [], []
    for c in range(n_copies):
        for j, w in enumerate(WORDS):
            items.append({"id": f"{w}{c}", "captions": [f"a {w}", f"one {w} here"]})
            image_emb.append(np.eye(len(WORDS), dtype=np.float32)[j])
    col = tmp_path / "col"
    write_collection(col, items, {"name": "toy", "dim": len(WORDS)}, np.stack(image_emb))
    return col


def _identity_sr(tmp_path: Path) -> Path:
    d = len(WORDS)
    model = SRModel(SRConfig(text_dim=d, image_dim=d, latent_dim=d, top_k=2))
    with torch.no_grad():
        for enc in (model.enc_text, model.enc_image):
            if enc is not None:
                enc.weight.copy_(torch.eye(d))
                enc.bias.zero_()
    model.save_pretrained(tmp_path / "sr")
    return tmp_path / "sr"


def test_build_index_commits_labels_with_the_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    col, sr = _collection(tmp_path), _identity_sr(tmp_path)
    root = col / INDEX_DIR
    build_index(col, sr)
    labels = InvertedIndex.open(root).meta["labels"]
    assert not (root / "labels.json").exists()
    searcher = Searcher(col)
    assert searcher.labels_data == labels["data"]
    assert [names[:1] for names in labels["data"]] == [[w] for w in WORDS]  # first names
    before = _manifest(root)

    # a crash while the rebuilt index is written leaves the old index *and* its labels
    monkeypatch.setattr(inverted_mod, "write_segment", _crash)
    with pytest.raises(OSError, match="simulated crash"):
        build_index(col, sr)
    monkeypatch.undo()
    assert _manifest(root) == before
    assert Searcher(col).labels_data == labels["data"]


def test_searcher_reads_labels_json_of_older_indexes(tmp_path: Path) -> None:
    col, sr = _collection(tmp_path), _identity_sr(tmp_path)
    build_index(col, sr)
    root = col / INDEX_DIR
    index = InvertedIndex.open(root)
    meta = {k: v for k, v in index.meta.items() if k != "labels"}
    codes = index.codes(np.arange(len(index)))
    InvertedIndex.build(root, codes, list(index.ids), overwrite=True, meta=meta)
    legacy = [["old"]] * len(WORDS)
    (root / "labels.json").write_text(json.dumps({"data": legacy, "spine": []}))
    assert Searcher(col).labels_data == legacy
    build_index(col, sr)  # a rebuild moves the labels into the manifest
    assert not (root / "labels.json").exists()
    assert Searcher(col).labels_data != legacy
