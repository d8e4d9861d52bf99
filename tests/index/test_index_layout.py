"""The v2 segment layout (posting rows local to 65536-row blocks, as uint16) searches like
brute force across block boundaries, and indexes written in the v1 layout (int32 rows and
dims, one posting list per dim) still open, search, grow and compact."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from index_testlib import random_codes, reference_search

from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion, InvertedIndex
from sparsemm.index import segments as segmod

DIM = 24


def _ids(n: int, start: int = 0) -> list[str]:
    return [f"id{i}" for i in range(start, start + n)]


def _queries(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    out = []
    for _ in range(count):
        q = np.zeros(DIM, np.float32)
        m = int(rng.integers(1, 10))
        dims = rng.choice(DIM, size=m, replace=False)
        q[dims] = rng.choice(np.array([0.25, 0.5, 1.0, 4.0], np.float32), size=m)
        q[dims[:1]] *= -1 if rng.random() < 0.3 else 1
        out.append(q)
    return out


def _check_against_brute_force(
    index: InvertedIndex, codes: sp.csr_matrix, rng: np.random.Generator, queries: int = 30
) -> None:
    n = codes.shape[0]
    for t, q in enumerate(_queries(rng, queries)):
        k = int(rng.choice([1, 5, 10, 50]))
        exclude = None
        if t % 3 == 1:
            exclude = Exclusion(dims=rng.choice(DIM, size=2, replace=False).tolist())
        elif t % 3 == 2:
            exclude = Exclusion(dims=[int(rng.integers(DIM))], mode="penalty", penalty=0.5)
        allowed = rng.random(n) < 0.6 if t % 4 == 3 else None
        rows, scores = reference_search(codes, q, k, exclude, allowed)
        for pruning in (False, True):
            index.pruning = pruning
            hit = index.search(q, k, exclude=exclude, allowed=allowed)
            np.testing.assert_array_equal(hit.rows, rows)
            np.testing.assert_array_equal(hit.scores, scores.astype(np.float32))
        full = index.search(q, k, exclude=exclude, allowed=allowed, approx=1.0)
        np.testing.assert_array_equal(full.rows, rows)  # keeping every posting is exact
    index.pruning = True
    picked = rng.choice(n, size=min(n, 50), replace=False)
    assert (index.codes(picked) != codes[picked]).nnz == 0


@pytest.fixture()
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Row blocks of 32 rows instead of 65536: many blocks (and empty ones) in small data."""
    monkeypatch.setattr(segmod, "BLOCK_SHIFT", 5)
    monkeypatch.setattr(segmod, "ROW_BLOCK", 32)
    return 32


@pytest.mark.parametrize("block_rows", [8, 32, 100])
def test_many_row_blocks_search_like_brute_force(
    tmp_path: Path, small_blocks: int, block_rows: int
) -> None:
    rng = np.random.default_rng(block_rows)
    codes = random_codes(rng, 1000, DIM, max_nnz=6, signed=True)
    codes = codes.tolil()
    codes[:, 3] = 1.0  # a list covering every row: scored as a dense value row
    codes = codes.tocsr()
    index = InvertedIndex.create(tmp_path / "ix", DIM)
    for lo, hi in [(0, 250), (250, 270), (270, 1000)]:  # uneven adds, merged into segments
        index.add(codes[lo:hi], _ids(hi - lo, lo))
    index = InvertedIndex.open(tmp_path / "ix", block_rows=block_rows)
    assert any(len(s.post_blocks[0]) > 2 for s in index._segments)
    _check_against_brute_force(index, codes, rng)
    index.compact()
    (seg,) = index._segments
    assert seg.layout == 2 and seg.post_blocks.shape == (DIM, -(-1000 // small_blocks) + 1)
    _check_against_brute_force(InvertedIndex.open(tmp_path / "ix"), codes, rng)


def test_real_row_blocks_across_65536_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 140_000  # three 65536-row blocks, the last one partial
    codes = random_codes(rng, n, DIM, max_nnz=3)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(n))
    (seg,) = index._segments
    assert seg.post_blocks.shape == (DIM, 4)
    assert seg.post_rows.dtype == np.uint16 and seg.row_dims.dtype == np.uint16
    assert index.nbytes == 12 * codes.nnz + 8 * (n + 1) + 8 * DIM * 4
    _check_against_brute_force(InvertedIndex.open(tmp_path / "ix"), codes, rng, queries=8)


def _write_v1(root: Path) -> None:
    """Rewrite every segment of ``root`` in the v1 layout, as sparsemm wrote it before v2."""
    manifest = json.loads((root / "manifest.json").read_text())
    index = InvertedIndex.open(root)
    for meta, seg in zip(manifest["segments"], index._segments, strict=True):
        folder = root / meta["name"]
        v1 = {
            "post_indptr": np.asarray(seg.post_indptr, np.int64),
            "post_rows": np.concatenate([seg.list_rows(d) for d in range(DIM)]).astype(np.int32),
            "post_vals": np.array(seg.post_vals),
            "row_indptr": np.array(seg.row_indptr),
            "row_dims": np.array(seg.row_dims, np.int32),
            "row_vals": np.array(seg.row_vals),
        }
        (folder / "post_blocks.npy").unlink()
        digests = {}
        for name, arr in v1.items():  # new files: the open index still maps the old ones
            np.save(folder / f"{name}.tmp.npy", arr)
            (folder / f"{name}.tmp.npy").replace(folder / f"{name}.npy")
        for fname in segmod.SEG_FILES_V1:
            digests[fname] = hashlib.sha256((folder / fname).read_bytes()).hexdigest()
        meta["sha256"] = digests
    manifest["version"] = 1
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_v1_indexes_open_search_grow_and_compact(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    codes = random_codes(rng, 900, DIM, max_nnz=5)
    root = tmp_path / "ix"
    index = InvertedIndex.create(root, DIM)
    index.add(codes[:600], _ids(600))
    index.add(codes[600:700], _ids(100, 600))
    _write_v1(root)
    old = InvertedIndex.open(root)
    assert [s.layout for s in old._segments] == [1, 1]
    assert all(s.post_rows.dtype == np.int32 for s in old._segments)
    _check_against_brute_force(old, codes[:700], rng)
    old.add(codes[700:], _ids(200, 700))  # a new v2 segment beside (or merged with) v1 ones
    assert json.loads((root / "manifest.json").read_text())["version"] == 2
    _check_against_brute_force(InvertedIndex.open(root), codes, rng)
    old.compact()
    assert [s.layout for s in old._segments] == [2]
    _check_against_brute_force(InvertedIndex.open(root), codes, rng)


def test_damaged_block_pointers_are_refused(tmp_path: Path, small_blocks: int) -> None:
    rng = np.random.default_rng(9)
    root = tmp_path / "ix"
    InvertedIndex.build(root, random_codes(rng, 200, DIM, max_nnz=5), _ids(200))
    manifest = json.loads((root / "manifest.json").read_text())
    folder = root / manifest["segments"][0]["name"]
    good = np.load(folder / "post_blocks.npy")
    for damage in ("swap", "shape", "rows"):
        blocks = good.copy()
        rows = np.load(folder / "post_rows.npy")
        if damage == "swap":  # a list's block pointers no longer ascend
            d = int(np.flatnonzero(blocks[:, 2] > blocks[:, 1])[0])
            blocks[d, 1], blocks[d, 2] = blocks[d, 2], blocks[d, 1]
        elif damage == "shape":  # one block too few for the segment's rows
            blocks = np.ascontiguousarray(blocks[:, :-1])
        else:  # a block-local row beyond its block
            rows = rows.copy()
            rows[0] = small_blocks
        for name, arr in (("post_blocks", blocks), ("post_rows", rows)):
            np.save(folder / f"{name}.tmp.npy", arr)
            (folder / f"{name}.tmp.npy").replace(folder / f"{name}.npy")
        for fname in manifest["segments"][0]["sha256"]:  # checksums forged to match
            data = (folder / fname).read_bytes()
            manifest["segments"][0]["sha256"][fname] = hashlib.sha256(data).hexdigest()
        (root / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(SparsemmError, match="does not match the manifest"):
            InvertedIndex.open(root)


@pytest.mark.parametrize("signed", [False, True])
def test_excluded_query_dims_search_like_brute_force(
    tmp_path: Path, small_blocks: int, signed: bool
) -> None:
    """Excluding some of the query's own dims ("sports but not basketball"): such a list is
    walked once, banning rows above the threshold and adding the rest. Thresholds that ban
    a whole list (every value above) and part of one (values 0.25-2.0 around 0.6), heaps
    that fill within the first block and ones that do not, pruning on and off."""
    rng = np.random.default_rng(11)
    codes = random_codes(rng, 700, DIM, max_nnz=8, signed=signed)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(700))
    for t, q in enumerate(_queries(rng, 60)):
        dims = np.flatnonzero(q)
        banned = rng.choice(dims, size=min(len(dims), 1 + t % 2), replace=False).tolist()
        if t % 3 == 0:
            banned.append(int(rng.integers(DIM)))  # and one that may not be in the query
        threshold = (0.0, 0.6, 1.2)[t % 3]
        exclude = Exclusion(dims=banned, threshold=threshold)
        k = int(rng.choice([1, 10, 40]))
        rows, scores = reference_search(codes, q, k, exclude, None)
        for pruning in (False, True):
            index.pruning = pruning
            hit = index.search(q, k, exclude=exclude)
            np.testing.assert_array_equal(hit.rows, rows)
            np.testing.assert_array_equal(hit.scores, scores.astype(np.float32))
