"""Persistence of the inverted index: round trips, incremental adds, crashes, locking, errors."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from index_testlib import random_codes

from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.index import inverted as inverted_mod
from sparsemm.index import segments as segments_mod

DIM = 30


def _codes(n: int, seed: int = 0) -> sp.csr_matrix:
    return random_codes(np.random.default_rng(seed), n, DIM, max_nnz=6)


def _ids(lo: int, hi: int) -> list[str]:
    return [f"item-{i}" for i in range(lo, hi)]


def _queries(seed: int = 1, m: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.choice(np.array([0.0, 0.0, 0.0, 0.5, 1.0]), size=(m, DIM)).astype(np.float32)


def _same_index(a: InvertedIndex, b: InvertedIndex) -> None:
    assert len(a) == len(b) and a.dim == b.dim and a.ids == b.ids
    rows = np.arange(len(a))
    assert (a.codes(rows) != b.codes(rows)).nnz == 0
    for q in _queries():
        ha, hb = a.search(q, 15), b.search(q, 15)
        np.testing.assert_array_equal(ha.rows, hb.rows)
        np.testing.assert_array_equal(ha.scores, hb.scores)


@contextmanager
def _held_lock(root: Path) -> Iterator[None]:
    """Hold the writer lock through a separate open file, as another process would."""
    with open(root / segments_mod.LOCK_FILE, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def test_round_trip(tmp_path: Path) -> None:
    codes = _codes(120)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(0, 120), meta={"model": "toy"})
    opened = InvertedIndex.open(tmp_path / "ix")
    _same_index(index, opened)
    assert opened.meta == {"model": "toy"}
    assert (opened.codes(np.arange(120)) != codes).nnz == 0
    assert opened.codes([7]).shape == (1, DIM)
    assert opened.row_of(["item-3", "item-0"]).tolist() == [3, 0]
    assert opened.row_of("item-9").tolist() == [9]
    manifest = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    assert manifest["format"] == "sparsemm.index" and manifest["version"] == 3
    assert manifest["dim"] == DIM and manifest["count"] == 120
    assert manifest["nnz"] == codes.nnz == opened.nnz
    seg = tmp_path / "ix" / manifest["segments"][0]["name"]
    post_rows = np.load(seg / "post_rows.npy", mmap_mode="r", allow_pickle=False)
    assert post_rows.dtype == np.uint8 and post_rows.shape == (codes.nnz,)  # gaps, no filler


def test_inputs_are_canonicalised_and_not_mutated(tmp_path: Path) -> None:
    dense = np.zeros((3, DIM), np.float64)
    dense[0, 4] = 1.5
    dense[2, [1, 2]] = [2.0, -1.0]
    index = InvertedIndex.build(tmp_path / "dense", dense, ["a", "b", "c"])
    np.testing.assert_array_equal(index.codes([0, 1, 2]).toarray(), dense)
    # duplicates are summed, explicit zeros dropped; the caller's matrix is left alone
    coo = sp.coo_matrix(([1.0, 1.0, 0.0], ([0, 0, 1], [3, 3, 5])), shape=(2, DIM))
    before = coo.copy()
    index2 = InvertedIndex.build(tmp_path / "dup", coo, ["x", "y"])
    assert index2.nnz == 1
    assert index2.codes([0]).toarray()[0, 3] == 2.0
    assert (coo != before).nnz == 0 and coo.nnz == 3


def test_incremental_add_equals_one_shot(tmp_path: Path) -> None:
    codes = _codes(400, seed=3)
    one_shot = InvertedIndex.build(tmp_path / "one", codes, _ids(0, 400))
    inc = InvertedIndex.create(tmp_path / "inc", DIM)
    bounds = [0, 1, 2, 50, 51, 120, 200, 333, 334, 400]
    for lo, hi in itertools.pairwise(bounds):
        inc.add(codes[lo:hi], _ids(lo, hi))
        assert len(inc) == hi
    assert 1 <= inc.num_segments <= 5  # merged geometrically, not one segment per add
    _same_index(one_shot, inc)
    _same_index(one_shot, InvertedIndex.open(tmp_path / "inc"))
    inc.compact()
    assert inc.num_segments == 1
    _same_index(one_shot, InvertedIndex.open(tmp_path / "inc"))
    # only live segment folders remain
    names = {p.name for p in (tmp_path / "inc").iterdir() if p.is_dir()}
    manifest = json.loads((tmp_path / "inc" / "manifest.json").read_text())
    assert names == {s["name"] for s in manifest["segments"]}


def test_empty_add_is_noop(tmp_path: Path) -> None:
    index = InvertedIndex.create(tmp_path / "ix", DIM)
    index.add(sp.csr_matrix((0, DIM), dtype=np.float32), [])
    assert len(index) == 0 and index.num_segments == 0


def test_reader_is_a_snapshot_until_reload(tmp_path: Path) -> None:
    writer = InvertedIndex.build(tmp_path / "ix", _codes(10), _ids(0, 10))
    reader = InvertedIndex.open(tmp_path / "ix")
    writer.add(_codes(10, seed=1), _ids(10, 20))
    assert len(reader) == 10 and len(writer) == 20
    reader.reload()
    assert len(reader) == 20 and reader.ids[-1] == "item-19"


def test_two_writers_do_not_lose_updates(tmp_path: Path) -> None:
    a = InvertedIndex.build(tmp_path / "ix", _codes(10), _ids(0, 10))
    b = InvertedIndex.open(tmp_path / "ix")
    a.add(_codes(5, seed=1), _ids(10, 15))
    with pytest.raises(SparsemmError, match="already in index"):
        b.add(_codes(1, seed=2), ["item-12"])  # b refreshes under the lock and sees a's add
    b.add(_codes(5, seed=2), _ids(15, 20))
    final = InvertedIndex.open(tmp_path / "ix")
    assert list(final.ids) == _ids(0, 20)


def _fail_on_call(n: int, real: Any) -> Any:
    calls = {"n": 0}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise OSError("simulated crash")
        return real(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("fail_at", [1, 3, 6])
def test_crash_while_writing_segment_keeps_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    root = tmp_path / "ix"
    index = InvertedIndex.build(root, _codes(50), _ids(0, 50))
    before = InvertedIndex.open(root)
    monkeypatch.setattr(segments_mod, "save_npy", _fail_on_call(fail_at, segments_mod.save_npy))
    with pytest.raises(OSError, match="simulated crash"):
        index.add(_codes(60, seed=1), _ids(50, 110))
    monkeypatch.undo()
    assert len(index) == 50  # the in-memory object was not changed either
    after = InvertedIndex.open(root)
    _same_index(before, after)
    # the next writer succeeds and sweeps the orphaned segment folder
    index.add(_codes(60, seed=1), _ids(50, 110))
    final = InvertedIndex.open(root)
    assert len(final) == 110
    manifest = json.loads((root / "manifest.json").read_text())
    assert {p.name for p in root.iterdir() if p.is_dir()} == {
        s["name"] for s in manifest["segments"]
    }


def test_crash_at_manifest_swap_keeps_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ix"
    index = InvertedIndex.build(root, _codes(50), _ids(0, 50))
    before = InvertedIndex.open(root)
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst).name == "manifest.json":
            raise OSError("simulated crash at commit")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="simulated crash"):
        index.add(_codes(60, seed=1), _ids(50, 110))
    monkeypatch.undo()
    _same_index(before, InvertedIndex.open(root))
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]
    index.add(_codes(60, seed=1), _ids(50, 110))  # not a duplicate: nothing was committed
    assert len(InvertedIndex.open(root)) == 110


def test_failed_merge_leaves_the_add_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ix"
    index = InvertedIndex.build(root, _codes(40), _ids(0, 40))

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise OSError("simulated crash during merge")

    monkeypatch.setattr(inverted_mod, "merge_segments", boom)
    index.add(_codes(40, seed=1), _ids(40, 80))  # would merge 40 + 40
    monkeypatch.undo()
    assert index.num_segments == 2
    reopened = InvertedIndex.open(root)
    assert len(reopened) == 80 and reopened.num_segments == 2
    one_shot = InvertedIndex.build(
        tmp_path / "one", sp.vstack([_codes(40), _codes(40, seed=1)]), _ids(0, 80)
    )
    _same_index(one_shot, reopened)


def test_lock_contention_raises(tmp_path: Path) -> None:
    root = tmp_path / "ix"
    index = InvertedIndex.build(root, _codes(10), _ids(0, 10))
    with _held_lock(root):
        with pytest.raises(SparsemmError, match="another process"):
            index.add(_codes(5, seed=1), _ids(10, 15))
        with pytest.raises(SparsemmError, match="another process"):
            index.compact()
        assert len(index.search(np.ones(DIM, np.float32), 3)) == 3  # readers are not blocked
    index.add(_codes(5, seed=1), _ids(10, 15))
    assert len(InvertedIndex.open(root)) == 15


def test_lock_held_by_another_process(tmp_path: Path) -> None:
    root = tmp_path / "ix"
    index = InvertedIndex.build(root, _codes(10), _ids(0, 10))
    script = (
        "import fcntl, sys\n"
        f"fh = open({str(root / '.lock')!r}, 'a+')\n"
        "fcntl.flock(fh.fileno(), fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(SparsemmError, match="another process"):
            index.add(_codes(5, seed=1), _ids(10, 15))
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    index.add(_codes(5, seed=1), _ids(10, 15))
    assert len(index) == 15


def test_create_refuses_to_clobber(tmp_path: Path) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(10), _ids(0, 10))
    with pytest.raises(SparsemmError, match="already exists"):
        InvertedIndex.create(root, DIM)
    fresh = InvertedIndex.create(root, DIM + 1, overwrite=True)
    assert len(fresh) == 0 and fresh.dim == DIM + 1
    assert len(InvertedIndex.open(root)) == 0
    assert not [p for p in root.iterdir() if p.is_dir()]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(SparsemmError, match="not an empty folder"):
        InvertedIndex.create(other, DIM)
    with pytest.raises(SparsemmError):
        InvertedIndex.create(tmp_path / "bad", 0)
    with pytest.raises(SparsemmError, match="JSON"):
        InvertedIndex.create(tmp_path / "bad", DIM, meta={"x": object()})


def test_build_with_bad_input_keeps_the_old_index(tmp_path: Path) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(10), _ids(0, 10))
    with pytest.raises(SparsemmError, match="NaN"):
        InvertedIndex.build(root, np.full((2, DIM), np.nan), ["a", "b"], overwrite=True)
    assert len(InvertedIndex.open(root)) == 10


@pytest.mark.parametrize(
    ("codes", "ids", "match"),
    [
        (sp.csr_matrix((2, DIM + 1), dtype=np.float32), ["a", "b"], "dimension"),
        (np.full((2, DIM), np.nan), ["a", "b"], "NaN or inf"),
        (sp.csr_matrix(([np.inf], ([1], [0])), shape=(2, DIM)), ["a", "b"], "NaN or inf"),
        (sp.csr_matrix((2, DIM)), ["a", "a"], "duplicate id"),
        (sp.csr_matrix((2, DIM)), ["a", ""], "non-empty"),
        (sp.csr_matrix((2, DIM)), ["a"], "must match"),
        (sp.csr_matrix((2, DIM)), "ab", "list of strings"),
        (np.ones(DIM), ["a"], "2-D"),
        (np.array([["x"] * DIM]), ["a"], "numeric"),
    ],
)
def test_bad_adds_raise(tmp_path: Path, codes: Any, ids: Any, match: str) -> None:
    index = InvertedIndex.build(tmp_path / "ix", _codes(5), _ids(0, 5))
    with pytest.raises(SparsemmError, match=match):
        index.add(codes, ids)
    assert len(InvertedIndex.open(tmp_path / "ix")) == 5


def test_duplicate_of_existing_id_raises(tmp_path: Path) -> None:
    index = InvertedIndex.build(tmp_path / "ix", _codes(5), _ids(0, 5))
    with pytest.raises(SparsemmError, match="already in index"):
        index.add(_codes(2), ["new", "item-4"])
    assert len(InvertedIndex.open(tmp_path / "ix")) == 5


def test_bad_lookups_raise(tmp_path: Path) -> None:
    index = InvertedIndex.build(tmp_path / "ix", _codes(5), _ids(0, 5))
    with pytest.raises(SparsemmError, match="not in index"):
        index.row_of(["item-0", "nope"])
    with pytest.raises(SparsemmError):
        index.codes([5])
    with pytest.raises(SparsemmError):
        index.codes([0.5])  # type: ignore[list-item]


def test_open_rejects_non_indexes_and_damage(tmp_path: Path) -> None:
    with pytest.raises(SparsemmError, match="not a sparsemm index"):
        InvertedIndex.open(tmp_path)
    root = tmp_path / "ix"
    InvertedIndex.build(root, _codes(5), _ids(0, 5))
    manifest = json.loads((root / "manifest.json").read_text())

    newer = dict(manifest, version=99)
    (root / "manifest.json").write_text(json.dumps(newer))
    with pytest.raises(SparsemmError, match="newer sparsemm"):
        InvertedIndex.open(root)

    (root / "manifest.json").write_text(json.dumps(dict(manifest, format="something")))
    with pytest.raises(SparsemmError, match=r"not a sparsemm\.index manifest"):
        InvertedIndex.open(root)

    (root / "manifest.json").write_text(json.dumps(dict(manifest, count=6)))
    with pytest.raises(SparsemmError, match="disagree"):
        InvertedIndex.open(root)

    (root / "manifest.json").write_text(json.dumps(manifest))
    seg = root / manifest["segments"][0]["name"]
    good_rows = np.load(seg / "post_rows.npy")
    bad_rows = good_rows.copy()
    assert good_rows.dtype == np.uint8  # gap-coded
    bad_rows[0] = 250  # same shape and dtype, a row out of range: must not reach the kernels
    np.save(seg / "post_rows.npy", bad_rows)
    with pytest.raises(SparsemmError, match="does not match"):
        InvertedIndex.open(root)
    bad_rows[0] = 0  # a gap of 0: a list no longer ascending
    np.save(seg / "post_rows.npy", bad_rows)
    with pytest.raises(SparsemmError, match="does not match"):
        InvertedIndex.open(root)
    np.save(seg / "post_rows.npy", good_rows)
    assert len(InvertedIndex.open(root)) == 5
    np.save(seg / "post_imps.npy", np.zeros(3, np.uint8))
    with pytest.raises(SparsemmError, match="does not match"):
        InvertedIndex.open(root)
    (seg / "post_imps.npy").unlink()
    with pytest.raises(SparsemmError, match="missing"):
        InvertedIndex.open(root)
