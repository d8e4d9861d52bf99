"""``InvertedIndex.search_quantized``: posting values read as one byte each, with a bound.

Every item's approximate score lies within ``err`` of its exact one, the hits are the top k
by approximate score (ranking rule: higher score, then lower row), and so no item outside
the hits scores more than the k-th approximate score + err: what the served path's
certificate relies on. Checked against exact brute force over several segments, row blocks,
long lists (kept as dense rows) and short ones, sparse and dense queries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from index_testlib import random_codes, write_old_layout

from sparsemm.index import InvertedIndex
from sparsemm.index import segments as segmod

DIM = 40
EMPTY = 39  # a dim no item has


def _ids(n: int, start: int = 0) -> list[str]:
    return [f"id{i}" for i in range(start, start + n)]


def _check(index: InvertedIndex, codes: sp.csr_matrix, rng: np.random.Generator) -> None:
    n = codes.shape[0]
    for t in range(30):
        q = np.zeros(DIM, np.float32)
        m = int(rng.integers(1, 3)) if t % 3 == 0 else int(rng.integers(5, DIM))
        dims = rng.choice(DIM, size=m, replace=False)
        q[dims] = rng.random(m).astype(np.float32) * 3 + np.float32(0.01)
        q[EMPTY] = 5.0
        k = int(rng.choice([1, 10, 100, n + 5]))
        hits, err = index.search_quantized(q, k=k)
        exact = codes.astype(np.float64) @ q.astype(np.float64)
        assert len(hits.rows) == min(k, n) and hits.ids == []
        # a byte per value: half a step (the list's max / 255) per query weight, and
        # nothing for a list without postings (dim EMPTY)
        dmax = np.asarray(abs(codes).max(axis=0).todense()).ravel()
        step = float(np.abs(q) @ (dmax / 255.0)) / 2
        assert 0 <= err <= step * 1.01 and (err > 0) == (step > 0)
        assert np.abs(exact[hits.rows] - hits.scores).max() <= err
        order = np.lexsort((hits.rows, -hits.scores.astype(np.float64)))
        np.testing.assert_array_equal(order, np.arange(len(hits.rows)))  # ranking rule
        outside = np.setdiff1d(np.arange(n), hits.rows)
        if outside.size:
            assert exact[outside].max() <= float(hits.scores[-1]) + err
        # the hits hold the exact top k except for items within 2 err of the k-th score
        true_top = np.lexsort((np.arange(n), -exact))[: len(hits.rows)]
        missed = np.setdiff1d(true_top, hits.rows)
        if missed.size:
            assert exact[missed].min() >= 0
            assert exact[missed].max() <= float(hits.scores[-1]) + err


@pytest.fixture()
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segmod, "BLOCK_SHIFT", 6)
    monkeypatch.setattr(segmod, "ROW_BLOCK", 64)


@pytest.mark.parametrize("layout", [2, 3])
def test_bound_holds_across_segments_and_blocks(
    tmp_path: Path, small_blocks: None, layout: int
) -> None:
    rng = np.random.default_rng(7)
    codes = random_codes(rng, 1500, DIM, max_nnz=12, dyadic=False).tolil()
    codes[:, 5] = 0.75  # a list covering every row: kept as a dense row of impacts
    codes[::3, 6] = 1e-4  # tiny values next to a large one share a scale
    codes[7, 6] = 9.0
    codes[:, EMPTY] = 0
    codes = codes.tocsr()
    index = InvertedIndex.create(tmp_path / "ix", DIM)
    for lo, hi in [(0, 1400), (1400, 1420), (1420, 1500)]:
        index.add(codes[lo:hi], _ids(hi - lo, lo))
    if layout == 2:  # impacts built in memory from float32 values, not read from disk
        write_old_layout(tmp_path / "ix", 2)
    index = InvertedIndex.open(tmp_path / "ix")
    assert len(index._segments) >= 2
    assert all(s.layout == layout for s in index._segments)
    index.warm(quantized=True)
    assert all(s._impacts is not None for s in index._segments)
    _check(index, codes, rng)


def test_negative_values_are_searched_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    codes = random_codes(rng, 600, DIM, max_nnz=8, signed=True)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(600))
    q = np.zeros(DIM, np.float32)
    q[[1, 4, 9]] = [1.0, 0.5, 2.0]
    hits, err = index.search_quantized(q, k=20)
    exact = index.search(q, k=20)
    assert err == 0.0
    np.testing.assert_array_equal(hits.rows, exact.rows)
    np.testing.assert_array_equal(hits.scores, exact.scores)


def _deviation(tmp_path: Path, codes: np.ndarray, dims: np.ndarray, w: np.ndarray) -> tuple:
    index = InvertedIndex.build(tmp_path / "ix", sp.csr_matrix(codes), _ids(len(codes)))
    hits, err = index.search_quantized((dims, w), k=len(codes))
    exact = codes[:, dims].astype(np.float64) @ w.astype(np.float64)
    return float(np.abs(exact[hits.rows] - hits.scores).max()), err


def test_bound_holds_for_subnormal_maxima(tmp_path: Path) -> None:
    """A list whose largest value is subnormal: its float32 scale rounds down or to 0, and
    err is measured per list, so it still bounds the deviation."""
    for top in (np.float32(1e-44), np.float32(2.0**-149 * 255 * 2.4)):
        codes = np.zeros((3, 4), np.float32)
        codes[0, 0], codes[1, 0], codes[2, 1] = top, top * np.float32(0.5), 1.0
        dev, err = _deviation(tmp_path / str(top), codes, np.array([0]), np.array([1e30]))
        assert 0 < dev <= err


def test_bound_covers_float32_rounding(tmp_path: Path) -> None:
    """Weights picked so that every float32 addition of 300 terms rounds down, on values
    half a step below their impacts (after a review found the first err too small here)."""
    nq, f32 = 300, np.float32
    rng = np.random.default_rng(0)
    step = f32(f32(1.0) / f32(255.0))
    x = f32((254.5 - 1e-3) * float(step))  # impact 254, about half a step above it
    total, w = f32(0.0), []
    for _ in range(nq):
        cands = rng.uniform(0.5, 1.0, 64).astype(np.float32)
        terms = [f32(f32(c * step) * f32(254)) for c in cands]
        loss = [float(f32(total + t)) - (float(total) + float(t)) for t in terms]
        best = int(np.argmin(loss))
        w.append(cands[best])
        total = f32(total + terms[best])
    codes = np.zeros((2, nq), np.float32)
    codes[0], codes[1] = 1.0, x
    dev, err = _deviation(tmp_path, codes, np.arange(nq), np.array(w, np.float32))
    assert 0.4 < dev <= err


def test_impact_memory_is_reported(tmp_path: Path) -> None:
    codes = random_codes(np.random.default_rng(2), 300, DIM, max_nnz=6)
    index = InvertedIndex.build(tmp_path / "ix", codes, _ids(300))
    assert index.impact_nbytes == 0
    index.warm(quantized=True)
    (seg,) = index._segments
    parts = seg.impact_lists()
    # a v3 segment maps its impacts from disk: only the per-list arrays and dense rows count
    assert seg.layout == 3 and index.impact_nbytes == sum(a.nbytes for a in parts[1:])
    imp = parts[0]
    assert imp.nbytes == codes.nnz
    write_old_layout(tmp_path / "ix", 2)  # float32 posting values: impacts built in memory
    index = InvertedIndex.open(tmp_path / "ix")
    assert index.impact_nbytes == 0
    index.warm(quantized=True)
    assert index.impact_nbytes == sum(a.nbytes for a in index._segments[0].impact_lists())
