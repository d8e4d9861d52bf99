"""The v2 and v3 segment layouts (posting rows local to 65536-row blocks, as uint16; v3 with
one-byte impacts as posting values) search like brute force across block boundaries, and
indexes written in the v1 layout (int32 rows and dims, one posting list per dim) or the v2
layout (float32 posting values) still open, search, grow and compact."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from index_testlib import random_codes, reference_search, write_old_layout

from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion, InvertedIndex
from sparsemm.index import search as search_mod
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


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("block_rows", [8, 32, 100])
def test_many_row_blocks_search_like_brute_force(
    tmp_path: Path, small_blocks: int, block_rows: int, signed: bool
) -> None:
    rng = np.random.default_rng(block_rows)
    codes = random_codes(rng, 1000, DIM, max_nnz=6, signed=signed)
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
    assert seg.layout == (2 if signed else 3)
    assert seg.post_blocks.shape == (DIM, -(-1000 // small_blocks) + 1)
    _check_against_brute_force(InvertedIndex.open(tmp_path / "ix"), codes, rng)


def test_real_row_blocks_across_65536_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 140_000  # three 65536-row blocks, the last one partial
    codes = random_codes(rng, n, DIM, max_nnz=3)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(n))
    (seg,) = index._segments
    assert seg.post_blocks.shape == (DIM, 4)
    assert seg.post_rows.dtype == np.uint8 and seg.row_dims.dtype == np.uint8
    assert seg.layout == 3 and seg.post_vals.dtype == np.uint8
    entries = len(seg.post_rows)  # postings plus fillers (gaps over 255 rows)
    assert (
        codes.nnz <= entries < 1.01 * codes.nnz and entries == codes.nnz + seg.list_stats[3].sum()
    )
    # 1 + 1 bytes a posting, 1 + 4 a row-store entry (24 dims: no filler), the row and block
    # pointers, the stats
    nbytes = 2 * entries + 5 * codes.nnz + 8 * (n + 1) + 8 * DIM * 4 + 4 * 8 * DIM
    assert index.nbytes == nbytes
    _check_against_brute_force(InvertedIndex.open(tmp_path / "ix"), codes, rng, queries=8)


@pytest.mark.parametrize("layout", [1, 2])
def test_older_indexes_open_search_grow_and_compact(tmp_path: Path, layout: int) -> None:
    rng = np.random.default_rng(5)
    codes = random_codes(rng, 900, DIM, max_nnz=5)
    root = tmp_path / "ix"
    index = InvertedIndex.create(root, DIM)
    index.add(codes[:600], _ids(600))
    index.add(codes[600:700], _ids(100, 600))
    write_old_layout(root, layout)
    old = InvertedIndex.open(root)
    assert [s.layout for s in old._segments] == [layout, layout]
    assert all(s.post_vals.dtype == np.float32 for s in old._segments)
    _check_against_brute_force(old, codes[:700], rng)
    old.add(codes[700:], _ids(200, 700))  # a new v3 segment beside (or merged with) old ones
    assert json.loads((root / "manifest.json").read_text())["version"] == 3
    assert old._segments[-1].layout == 3
    _check_against_brute_force(InvertedIndex.open(root), codes, rng)
    old.compact()
    assert [s.layout for s in old._segments] == [3]
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


def test_v3_impacts_search_bit_identical_to_v2_values(tmp_path: Path) -> None:
    """On values that do not sum exactly (uniform, not dyadic), a v3 index (candidates from
    impacts, rescored from the row store) returns the rows and float32 scores of the same
    codes in v2 (float32 posting values): the rescoring adds in the accumulator's order."""
    rng = np.random.default_rng(11)
    codes = random_codes(rng, 3000, DIM, max_nnz=8, dyadic=False)
    codes = codes.tolil()
    codes[::2, 5] = 0.75  # a list of half the rows: a dense row in either layout
    codes = codes.tocsr()
    roots = {3: tmp_path / "v3", 2: tmp_path / "v2"}
    for root in roots.values():
        InvertedIndex.build(root, codes, _ids(3000))
    write_old_layout(roots[2], 2)
    v3, v2 = InvertedIndex.open(roots[3]), InvertedIndex.open(roots[2])
    assert v3._segments[0].layout == 3 and v2._segments[0].layout == 2
    for t, q in enumerate(_queries(rng, 60)):
        k = int(rng.choice([1, 10, 100]))
        exclude = None
        if t % 3 == 1:
            dims = rng.choice(DIM, size=2, replace=False).tolist()
            exclude = Exclusion(dims=dims, threshold=float(rng.choice([0.0, 0.3])))
        elif t % 3 == 2:
            exclude = Exclusion(dims=[int(rng.integers(DIM))], mode="penalty", penalty=0.5)
        for pruning in (False, True):
            v3.pruning = v2.pruning = pruning
            a = v3.search(q, k, exclude=exclude)
            b = v2.search(q, k, exclude=exclude)
            np.testing.assert_array_equal(a.rows, b.rows)
            np.testing.assert_array_equal(a.scores, b.scores)


@pytest.mark.parametrize("layout", [2, 3])
def test_subnormal_values_and_thresholds_filter_like_brute_force(
    tmp_path: Path, layout: int
) -> None:
    """A filter threshold is compared in float64 with the float32 values (1e-39 as float32
    is just above 1e-39), and impacts of subnormal values decide nothing by themselves."""
    rng = np.random.default_rng(21)
    n = 500
    codes = sp.random(n, DIM, density=0.4, format="csr", dtype=np.float32, random_state=21)
    codes.data = rng.choice(np.array([1e-40, 1e-39, 0.5, 1.0], np.float32), codes.nnz)
    root = tmp_path / "ix"
    InvertedIndex.build(root, codes, _ids(n))
    if layout == 2:
        write_old_layout(root, 2)
    index = InvertedIndex.open(root)
    assert index._segments[0].layout == layout
    for t, q in enumerate(_queries(rng, 40)):
        q = np.abs(q)
        dims = rng.choice(DIM, size=3, replace=False).tolist()
        exclude = Exclusion(dims=dims, threshold=[0.0, 1e-39, 1e-40][t % 3])
        rows, scores = reference_search(codes, q, 10, exclude, None)
        hit = index.search(q, 10, exclude=exclude)
        np.testing.assert_array_equal(hit.rows, rows)
        np.testing.assert_array_equal(hit.scores, scores.astype(np.float32))


def _wide_codes(rng: np.random.Generator, n: int, dim: int) -> sp.csr_matrix:
    """Rows mostly on the first 200 dims with a few far ones: a delta-coded row store with
    filler entries (gaps over 255), and many empty posting lists."""
    per_row = rng.integers(0, 25, n)
    rows = np.repeat(np.arange(n), per_row)
    near = rng.random(rows.size) < 0.97
    cols = np.where(near, rng.integers(0, 200, rows.size), rng.integers(0, dim, rows.size))
    vals = rng.choice(DYADIC_WIDE, size=rows.size)
    codes = sp.csr_matrix((vals, (rows, cols)), shape=(n, dim), dtype=np.float32)
    codes.sum_duplicates()
    return codes


DYADIC_WIDE = np.array([0.25, 0.5, 1.0, 2.0], np.float32)


def test_delta_coded_row_store_with_fillers_round_trips_and_searches(tmp_path: Path) -> None:
    dim = 1500
    rng = np.random.default_rng(31)
    codes = _wide_codes(rng, 1200, dim)
    index = InvertedIndex.create(tmp_path / "ix", dim)
    for lo, hi in [(0, 700), (700, 1000), (1000, 1200)]:  # merges decode and re-encode
        index.add(codes[lo:hi], _ids(hi - lo, lo))
    index = InvertedIndex.open(tmp_path / "ix")
    for seg in index._segments:
        assert seg.row_dims.dtype == np.uint8
        assert len(seg.row_dims) > seg.nnz  # fillers
    assert (index.codes(np.arange(1200)) != codes).nnz == 0
    assert (index.codes([5, 1100, 5]) != codes[[5, 1100, 5]]).nnz == 0
    for t in range(40):
        q = np.zeros(dim, np.float32)
        dims = np.unique(np.r_[rng.integers(0, 200, 8), rng.integers(0, dim, 2)])
        q[dims] = rng.choice(DYADIC_WIDE, size=dims.size)
        exclude = None
        if t % 2:
            exclude = Exclusion(dims=[int(dims[0]), int(rng.integers(200, dim))])
        rows, scores = reference_search(codes, q, 10, exclude, None)
        for pruning in (False, True):
            index.pruning = pruning
            hit = index.search(q, 10, exclude=exclude)
            np.testing.assert_array_equal(hit.rows, rows)
            np.testing.assert_array_equal(hit.scores, scores.astype(np.float32))
        # many lists are empty: the approximate mode's truncated lists must still tile
        full = index.search(q, 10, exclude=exclude, approx=1.0)
        np.testing.assert_array_equal(full.rows, rows)


def test_wide_sparse_rows_keep_absolute_row_dims(tmp_path: Path) -> None:
    """30,000 dims and 20 values a row: fillers would outnumber the bytes saved."""
    n, dim = 300, 30_000
    codes = sp.random(n, dim, density=20 / dim, format="csr", dtype=np.float32, random_state=32)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(n))
    assert index._segments[0].row_dims.dtype == np.uint16
    assert (index.codes(np.arange(n)) != codes).nnz == 0
    q = np.zeros(dim, np.float32)
    q[codes[7].indices] = 1.0
    rows, scores = reference_search(codes, q, 5, None, None)
    hit = index.search(q, 5)
    np.testing.assert_array_equal(hit.rows, rows)
    np.testing.assert_allclose(hit.scores, scores, rtol=1e-6)


def test_subnormal_scaled_weights_stay_within_the_error_bound(tmp_path: Path) -> None:
    """A weight times a list's impact step below float32's normal range rounds by far more
    than its relative error; the bound's absolute term keeps the true best a candidate
    (found by review: k above the pruning limit returned rows 0..10 without row 11)."""
    codes = np.zeros((12, 1), np.float32)
    codes[:11, 0] = np.float32(0.99e-30)
    codes[11, 0] = np.float32(1e-30)
    index = InvertedIndex.build(tmp_path / "ix", sp.csr_matrix(codes), _ids(12))
    w = np.float32(3.7341102e-12)
    rows, _ = reference_search(sp.csr_matrix(codes), np.array([w], np.float32), 11, None, None)
    assert rows[0] == 11
    for pruning in (False, True):
        index.pruning = pruning
        np.testing.assert_array_equal(index.search(np.array([w], np.float32), 11).rows, rows)
    hits, err = index.search_quantized((np.array([0]), np.array([w], np.float32)), 1)
    exact = np.float64(w) * codes[:, 0].astype(np.float64)
    assert abs(float(hits.scores[0]) - exact[hits.rows[0]]) <= err
    assert exact.max() <= float(hits.scores[0]) + err


def test_overflowing_scores_keep_the_tie_rule(tmp_path: Path) -> None:
    """Scores that overflow to +inf tie, and the lower row wins as with float32 postings,
    also when the impacts put the lower row's approximate score below +inf (the review's
    case: rows reach the touched-rows scan in posting order, 350 before 320)."""
    fmax = float(np.finfo(np.float32).max)
    first = sp.lil_matrix((300, 3), dtype=np.float32)
    first[0, 2] = 1.0  # fills the k = 1 heap
    second = sp.lil_matrix((200, 3), dtype=np.float32)
    dmax1 = np.float32(fmax * (255 / 254.2) / 2)
    second[50, 0] = np.float32(fmax * 0.9)  # row 350: 2 * v = +inf, impact score +inf
    second[20, 1] = np.float32(dmax1 / np.float32(255) * np.float32(254.4))  # row 320
    second[100, 1] = dmax1  # row 400: +inf
    root = tmp_path / "ix"
    index = InvertedIndex.create(root, 3)
    index.add(first.tocsr(), _ids(300))
    index.add(second.tocsr(), _ids(200, 300))
    q = (np.array([0, 1, 2]), np.array([2.0, 2.0, 1.0], np.float32))
    index = InvertedIndex.open(root)
    got = []
    for pruning in (False, True):
        index.pruning = pruning
        got.append(index.search(q, 1).rows.tolist())
    write_old_layout(root, 2)
    v2 = InvertedIndex.open(root)
    assert got == [[320], [320]] == [v2.search(q, 1).rows.tolist()] * 2


def test_a_search_scores_the_segments_it_sized_its_workspace_for(tmp_path: Path) -> None:
    """An add() committed between a search's workspace and its scan (another thread on the
    same object) must not give a gap-coded segment a shorter accumulator than its blocks."""
    dim = 50
    rng = np.random.default_rng(0)

    def one_per_row(n: int, value: float) -> sp.csr_matrix:
        data = np.full(n, value, np.float32)
        return sp.csr_matrix((data, (np.arange(n), rng.integers(0, dim, n))), shape=(n, dim))

    root = tmp_path / "ix"
    InvertedIndex.create(root, dim).add(one_per_row(20_000, -1.0), _ids(20_000))  # v2
    index = InvertedIndex.open(root, block_rows=64)
    sized = index._workspace
    added: list[bool] = []

    def add_between(segs: list) -> tuple:
        ws = sized(segs)
        if not added:
            added.append(True)
            index.add(one_per_row(15_000, 1.0), _ids(15_000, 20_000))  # gap-coded v3
        return ws

    index._workspace = add_between  # type: ignore[method-assign]
    q = (np.arange(dim), np.ones(dim, np.float32))
    first = index.search(q, 5)  # scores the one segment it saw
    assert index._segments[-1].post_rows.dtype == np.uint8
    assert first.scores.tolist() == [-1.0] * 5
    assert index.search(q, 5).scores.tolist() == [1.0] * 5


@pytest.mark.parametrize("dyadic", [True, False])
def test_pool_first_search_equals_the_rescoring_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dyadic: bool
) -> None:
    """The exact search's first phase (a pool by impact score, rescored, certified) returns
    what the scan that rescores as it goes returns, and falls back to it when the pool
    cannot be certified (exact ties at the k-th score, with dyadic values, do that)."""
    rng = np.random.default_rng(51 + dyadic)
    codes = random_codes(rng, 4000, DIM, max_nnz=8, dyadic=dyadic)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(4000))
    calls = {"pool": 0, "scan": 0}
    scan = InvertedIndex._scan

    def counted(self: InvertedIndex, *args: object, **kw: object) -> object:
        calls["pool" if kw.get("rescore") is False else "scan"] += 1
        return scan(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(InvertedIndex, "_scan", counted)
    queries = _queries(rng, 40)
    got = [index.search(q, k) for q in queries for k in (1, 10, 60)]
    assert calls["pool"] == len(got) and 0 < calls["scan"] < len(got)
    monkeypatch.setattr(search_mod, "POOL_MAX_K", 0)  # the rescoring scan only
    want = [index.search(q, k) for q in queries for k in (1, 10, 60)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a.rows, b.rows)
        np.testing.assert_array_equal(a.scores, b.scores)
