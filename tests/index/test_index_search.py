"""Search results of the inverted index equal a naive brute force (exact, tie-aware)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from index_testlib import random_codes, reference_search

from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion, InvertedIndex, SearchResult

DIM = 40


def _build(
    path: Path, codes: sp.csr_matrix, batches: int = 1, block_rows: int = 16
) -> InvertedIndex:
    """Index ``codes`` in ``batches`` adds and reopen it with small scoring blocks."""
    n = codes.shape[0]
    ids = [f"id{i}" for i in range(n)]
    index = InvertedIndex.create(path, codes.shape[1])
    bounds = np.linspace(0, n, batches + 1).astype(int)
    for lo, hi in itertools.pairwise(bounds):
        index.add(codes[lo:hi], ids[lo:hi])
    return InvertedIndex.open(path, block_rows=block_rows)


def _assert_same(hit: SearchResult, rows: np.ndarray, scores: np.ndarray) -> None:
    np.testing.assert_array_equal(hit.rows, rows)
    np.testing.assert_array_equal(hit.scores, scores.astype(np.float32))
    assert hit.ids == [f"id{r}" for r in rows]
    assert hit.rows.dtype == np.int64 and hit.scores.dtype == np.float32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[sp.csr_matrix, InvertedIndex]:
    """A 300-item signed dyadic corpus indexed in 3 adds (several segments), 16-row blocks."""
    rng = np.random.default_rng(7)
    codes = random_codes(rng, 300, DIM, max_nnz=5, signed=True)
    index = _build(tmp_path_factory.mktemp("corpus") / "ix", codes, batches=3)
    return codes, index


def _dense_query(rng: np.random.Generator, m: int, signed: bool = True) -> np.ndarray:
    q = np.zeros(DIM, np.float32)
    dims = rng.choice(DIM, size=m, replace=False)
    w = rng.choice(np.array([0.5, 1.0, 2.0], np.float32), size=m)
    if signed:
        w = w * rng.choice(np.array([-1.0, 1.0], np.float32), size=m)
    q[dims] = w
    return q


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("batches", [1, 4])
def test_topk_equals_brute_force(tmp_path: Path, seed: int, batches: int) -> None:
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, 500, DIM, max_nnz=4, signed=seed % 2 == 1)
    index = _build(tmp_path / "ix", codes, batches=batches, block_rows=32)
    for _ in range(15):
        q = _dense_query(rng, int(rng.integers(1, 5)), signed=seed % 2 == 1)
        k = int(rng.choice([1, 3, 10, 50, 600]))
        rows, scores = reference_search(codes, q, k)
        _assert_same(index.search(q, k), rows, scores)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 320),
    qnnz=st.integers(0, 6),
    mode=st.sampled_from([None, "filter", "penalty"]),
    n_excl=st.integers(1, 4),
    threshold=st.sampled_from([0.0, 0.5, 1.0]),
    penalty=st.sampled_from([0.5, 1.0, 2.0]),
    use_allowed=st.booleans(),
)
def test_search_property(
    corpus: tuple[sp.csr_matrix, InvertedIndex],
    seed: int,
    k: int,
    qnnz: int,
    mode: str | None,
    n_excl: int,
    threshold: float,
    penalty: float,
    use_allowed: bool,
) -> None:
    codes, index = corpus
    rng = np.random.default_rng(seed)
    q = _dense_query(rng, qnnz)
    exclude = None
    if mode is not None:
        dims = rng.choice(DIM, size=n_excl, replace=False).tolist()
        weights = rng.choice([0.5, 1.0, 2.0], size=n_excl).tolist() if mode == "penalty" else None
        exclude = Exclusion(
            dims=dims,
            weights=weights,
            threshold=threshold,
            mode=mode,  # type: ignore[arg-type]
            penalty=penalty,
        )
    allowed = rng.random(codes.shape[0]) < 0.6 if use_allowed else None
    rows, scores = reference_search(codes, q, k, exclude, allowed)
    hit = index.search(q, k, exclude=exclude, allowed=allowed)
    _assert_same(hit, rows, scores)
    if exclude is not None and exclude.mode == "filter":
        x = codes[hit.rows][:, exclude.dims].toarray()
        assert not (x > exclude.threshold).any()
    if allowed is not None:
        assert allowed[hit.rows].all()


def test_filter_never_returns_active_items(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    codes = random_codes(rng, 800, DIM, max_nnz=8, signed=True, dyadic=False)
    index = _build(tmp_path / "ix", codes, batches=2, block_rows=64)
    dense = codes.toarray()
    for _ in range(30):
        dims = rng.choice(DIM, size=int(rng.integers(1, 5)), replace=False)
        thr = float(rng.choice([0.0, 0.3, 0.9]))
        hit = index.search(_dense_query(rng, 4), 100, exclude=Exclusion(dims=dims, threshold=thr))
        assert len(hit) == 100
        assert not (dense[hit.rows][:, dims] > thr).any()


def test_penalty_equals_brute_force_real_values(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    codes = random_codes(rng, 600, DIM, max_nnz=6, dyadic=False)
    index = _build(tmp_path / "ix", codes, block_rows=64)
    for _ in range(20):
        q = np.abs(_dense_query(rng, 5))
        ex = Exclusion(dims=[1, 2, 3], weights=[1.0, 0.5, 2.0], mode="penalty", penalty=0.7)
        hit = index.search(q, 20, exclude=ex)
        _rows, scores = reference_search(codes, q, 20, ex)
        np.testing.assert_allclose(hit.scores, scores, rtol=1e-5, atol=1e-5)
        # rows may differ only inside groups of (numerically) tied scores
        ref_all = codes.toarray().astype(np.float64) @ q - 0.7 * (
            codes.toarray()[:, [1, 2, 3]] @ np.array([1.0, 0.5, 2.0])
        )
        np.testing.assert_allclose(ref_all[hit.rows], hit.scores, rtol=1e-5, atol=1e-5)


def test_zero_overlap_items_fill_in_by_row_and_negatives_rank_last(tmp_path: Path) -> None:
    codes = sp.csr_matrix(
        np.array(
            [
                [0, 0, 1, 0],  # row 0: no overlap with the query -> 0
                [1, 0, 0, 0],  # row 1: 1
                [0, -1, 0, 0],  # row 2: -2 (negative, ranks last)
                [0, 0, 0, 3],  # row 3: 0
                [2, 0, 0, 0],  # row 4: 2
            ],
            np.float32,
        )
    )
    index = _build(tmp_path / "ix", codes, block_rows=2)
    q = (np.array([0, 1]), np.array([1.0, 2.0]))
    hit = index.search(q, 10)
    assert hit.rows.tolist() == [4, 1, 0, 3, 2]
    assert hit.scores.tolist() == [2.0, 1.0, 0.0, 0.0, -2.0]
    assert index.search(q, 3).rows.tolist() == [4, 1, 0]


def test_large_sparse_index_default_blocks(tmp_path: Path) -> None:
    """Many items, few postings per query: exercises the touched-rows path across blocks."""
    rng = np.random.default_rng(3)
    n, dim = 40_000, 2000
    cols = rng.integers(0, dim, size=(n, 3))
    vals = rng.choice(np.array([0.5, 1.0, 2.0], np.float32), size=(n, 3))
    codes = sp.csr_matrix(
        (vals.ravel(), (np.repeat(np.arange(n), 3), cols.ravel())), shape=(n, dim)
    )
    codes.sum_duplicates()
    index = InvertedIndex.build(tmp_path / "ix", codes, [f"id{i}" for i in range(n)])
    for _ in range(10):
        q = np.zeros(dim, np.float32)
        q[rng.choice(dim, size=3, replace=False)] = rng.choice([0.5, 1.0], size=3)
        for k in (5, 100):
            rows, scores = reference_search(codes, q, k)
            _assert_same(index.search(q, k), rows, scores)
        ex = Exclusion(dims=np.flatnonzero(q)[:1])
        rows, scores = reference_search(codes, q, 50, ex)
        _assert_same(index.search(q, 50, exclude=ex), rows, scores)


def test_query_forms_agree(corpus: tuple[sp.csr_matrix, InvertedIndex]) -> None:
    _, index = corpus
    q = np.zeros(DIM, np.float32)
    q[[3, 7, 20]] = [1.0, -0.5, 2.0]
    want = index.search(q, 25)
    forms = [
        sp.csr_matrix(q[None, :]),
        sp.coo_matrix(q[None, :]),
        q[None, :],
        (np.array([3, 7, 20]), np.array([1.0, -0.5, 2.0])),
        ([20, 3, 7], [2.0, 1.0, -0.5]),  # unsorted
        ([20, 3, 7, 3], [2.0, 0.5, -0.5, 0.5]),  # duplicate dim: weights add up
        ([3, 7, 20, 9], [1.0, -0.5, 2.0, 0.0]),  # explicit zero weight
    ]
    for form in forms:
        hit = index.search(form, 25)
        np.testing.assert_array_equal(hit.rows, want.rows)
        np.testing.assert_array_equal(hit.scores, want.scores)


def test_search_batch_equals_single(corpus: tuple[sp.csr_matrix, InvertedIndex]) -> None:
    _, index = corpus
    rng = np.random.default_rng(1)
    qs = np.stack([_dense_query(rng, 3) for _ in range(6)])
    exs = [None, Exclusion([1, 2]), None, Exclusion([5], mode="penalty"), None, None]
    allowed = np.arange(0, 300, 2)
    batch = index.search_batch(sp.csr_matrix(qs), k=7, exclude=exs, allowed=allowed)
    assert len(batch) == 6
    for q, ex, hit in zip(qs, exs, batch, strict=True):
        single = index.search(q, 7, exclude=ex, allowed=allowed)
        np.testing.assert_array_equal(hit.rows, single.rows)
        np.testing.assert_array_equal(hit.scores, single.scores)
    one_ex = index.search_batch(qs, k=5, exclude=Exclusion([1, 2]))
    for q, hit in zip(qs, one_ex, strict=True):
        np.testing.assert_array_equal(hit.rows, index.search(q, 5, Exclusion([1, 2])).rows)


def test_allowed_rows_and_mask_agree(corpus: tuple[sp.csr_matrix, InvertedIndex]) -> None:
    codes, index = corpus
    rows = np.array([5, 17, 18, 100, 299])
    mask = np.zeros(codes.shape[0], bool)
    mask[rows] = True
    q = _dense_query(np.random.default_rng(2), 4)
    a = index.search(q, 10, allowed=rows)
    b = index.search(q, 10, allowed=mask)
    np.testing.assert_array_equal(a.rows, b.rows)
    assert set(a.rows.tolist()) == set(rows.tolist())  # k > |allowed|: all of them come back
    assert len(index.search(q, 10, allowed=np.zeros(0, np.int64))) == 0


def test_k_larger_than_index_and_empty_index(tmp_path: Path) -> None:
    codes = sp.csr_matrix(np.eye(3, 5, dtype=np.float32))
    index = InvertedIndex.build(tmp_path / "ix", codes, ["a", "b", "c"])
    hit = index.search(np.ones(5, np.float32), 100)
    assert hit.ids == ["a", "b", "c"]
    empty = InvertedIndex.create(tmp_path / "empty", 5)
    assert len(empty.search(np.ones(5, np.float32), 3)) == 0


@pytest.mark.parametrize(
    "query",
    [
        np.ones(DIM + 1, np.float32),
        sp.csr_matrix(np.ones((2, DIM), np.float32)),
        np.full(DIM, np.nan, np.float32),
        ([0, 1], [1.0, np.inf]),
        ([0, DIM], [1.0, 1.0]),
        ([-1], [1.0]),
        ([0, 1], [1.0]),
        ([0.5], [1.0]),
        "cat",
    ],
)
def test_bad_queries_raise(corpus: tuple[sp.csr_matrix, InvertedIndex], query: object) -> None:
    _, index = corpus
    with pytest.raises(SparsemmError):
        index.search(query, 5)


def test_bad_search_arguments_raise(corpus: tuple[sp.csr_matrix, InvertedIndex]) -> None:
    _, index = corpus
    q = np.ones(DIM, np.float32)
    for k in (0, -1, 1.5, True, "3"):
        with pytest.raises(SparsemmError):
            index.search(q, k)  # type: ignore[arg-type]
    for bad_allowed in (np.ones(3, bool), np.array([0, 300]), np.array([-1]), np.array([0.5])):
        with pytest.raises(SparsemmError):
            index.search(q, 5, allowed=bad_allowed)
    with pytest.raises(SparsemmError):
        index.search(q, 5, exclude=Exclusion(dims=[DIM]))
    with pytest.raises(SparsemmError):
        index.search(q, 5, exclude=Exclusion(dims=[1, 2], weights=[1.0], mode="penalty"))
    with pytest.raises(SparsemmError):
        index.search(q, 5, exclude=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(SparsemmError):
        Exclusion(dims=[1], mode="drop")  # type: ignore[arg-type]
    with pytest.raises(SparsemmError):
        Exclusion(dims=[1], threshold=-0.1)
    with pytest.raises(SparsemmError):
        Exclusion(dims=[1], mode="penalty", penalty=float("nan"))
    with pytest.raises(SparsemmError):
        index.search_batch(np.ones((2, DIM)), 5, exclude=[None])
    with pytest.raises(SparsemmError):
        index.search_batch(np.ones((2, DIM + 1)), 5)


def test_concurrent_searches_agree(corpus: tuple[sp.csr_matrix, InvertedIndex]) -> None:
    """Each thread scores in its own workspace (the kernels release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    _, index = corpus
    rng = np.random.default_rng(4)
    qs = [_dense_query(rng, 4) for _ in range(40)]
    want = [index.search(q, 9).rows.tolist() for q in qs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda q: index.search(q, 9).rows.tolist(), qs * 3))
    assert got == want * 3
