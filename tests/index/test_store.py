"""The store interface on the local backend: sparse/dense/hybrid search equal naive references,
the dense part's crash safety, resumable uploads, and the exact rescoring kernel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from index_testlib import random_codes, reference_search

from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion, InvertedIndex, LocalStore, SearchResult, fuse_rrf, open_store
from sparsemm.index.scoring import dense_scores, sparse_query_terms, sparse_rescore

DIM, DD = 30, 8


def _data(n: int = 120, seed: int = 0) -> tuple[sp.csr_matrix, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    codes = random_codes(rng, n, DIM, max_nnz=6)
    # dyadic dense values: exact float sums, so ties are real and must go to the lower row
    dense = rng.choice(np.array([-1.0, -0.5, 0.0, 0.5, 1.0], np.float32), size=(n, DD))
    return codes, dense, [f"it{i}" for i in range(n)]


def _query(rng: np.random.Generator, m: int = 4) -> np.ndarray:
    q = np.zeros(DIM, np.float32)
    q[rng.choice(DIM, size=m, replace=False)] = rng.choice(np.array([0.5, 1.0, 2.0]), size=m)
    return q


def _dense_reference(
    dense: np.ndarray, codes: sp.csr_matrix, v: np.ndarray, k: int, ex: Exclusion | None
) -> np.ndarray:
    scores = dense.astype(np.float64) @ v.astype(np.float64)
    keep = np.ones(len(scores), bool)
    if ex is not None:
        keep &= ~(codes[:, np.asarray(ex.dims)].toarray() > ex.threshold).any(axis=1)
    rows = np.flatnonzero(keep)
    return rows[np.lexsort((rows, -scores[rows]))][:k]


@pytest.fixture()
def store(tmp_path: Path) -> tuple[LocalStore, sp.csr_matrix, np.ndarray]:
    codes, dense, ids = _data()
    s = LocalStore.build(tmp_path / "ix", codes[:70], ids[:70], dense=dense[:70])
    s.add(codes[70:], ids[70:], dense[70:])  # two commits: chunks and segments
    return LocalStore.open(tmp_path / "ix"), codes, dense


def test_sparse_search_is_the_positive_part_of_the_reference(store) -> None:
    s, codes, _ = store
    rng = np.random.default_rng(1)
    for _ in range(20):
        q = _query(rng)
        for ex in (None, Exclusion(rng.choice(DIM, 3, replace=False), threshold=0.5)):
            rows, scores = reference_search(codes, q, len(s), ex)
            want = rows[scores > 0][:7]
            got = s.search(q, 7, ex)
            np.testing.assert_array_equal(got.rows, want)
            assert got.ids == [f"it{r}" for r in want] and (got.scores > 0).all()


def test_dense_search_equals_reference_ties_by_row(store) -> None:
    s, codes, dense = store
    assert s.dense_dim == DD and len(s) == 120
    rng = np.random.default_rng(2)
    for _ in range(20):
        v = rng.choice(np.array([-1.0, 0.5, 1.0]), size=DD)
        for ex in (None, Exclusion(rng.choice(DIM, 4, replace=False))):
            got = s.search_dense(v, 9, ex)
            np.testing.assert_array_equal(got.rows, _dense_reference(dense, codes, v, 9, ex))
    with pytest.raises(SparsemmError, match="filter exclusions"):
        s.search_dense(v, 3, Exclusion([1], mode="penalty"))
    with pytest.raises(SparsemmError, match="expected 8 values"):
        s.search_dense(np.ones(3), 3)


def test_hybrid_is_rrf_of_the_two_lists(store) -> None:
    s, _, _ = store
    rng = np.random.default_rng(3)
    q, v = _query(rng, 6), rng.standard_normal(DD)
    sp_res, de_res = s.search(q, 20), s.search_dense(v, 20)
    got = s.search_hybrid(q, v, 5, candidates=20, rrf_k=10)
    fused: dict[int, float] = {}
    for res in (sp_res, de_res):
        for rank, r in enumerate(res.rows.tolist(), start=1):
            fused[r] = fused.get(r, 0.0) + 1.0 / (10 + rank)
    want = sorted(
        (r for r in fused if r in set(sp_res.rows.tolist())), key=lambda r: (-fused[r], r)
    )
    np.testing.assert_array_equal(got.rows, want[:5])
    np.testing.assert_allclose(got.scores, [fused[r] for r in want[:5]], rtol=1e-6)


def test_fuse_rrf_weights_and_ties() -> None:
    a = SearchResult(np.array([5, 3]), ["a5", "a3"], np.zeros(2, np.float32))
    b = SearchResult(np.array([3, 5]), ["a3", "a5"], np.zeros(2, np.float32))
    res = fuse_rrf([a, b], 2, rrf_k=1)
    assert res.rows.tolist() == [3, 5]  # equal fused scores: lower row first
    res = fuse_rrf([a, b], 2, rrf_k=1, weights=[2.0, 1.0])
    assert res.rows.tolist() == [5, 3] and res.scores[0] == pytest.approx(2 / 2 + 1 / 3)
    with pytest.raises(SparsemmError, match="weights"):
        fuse_rrf([a, b], 2, weights=[1.0])


def test_rescore_kernel_matches_the_index_bit_for_bit(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    codes = random_codes(rng, 400, DIM, max_nnz=10, signed=True, dyadic=False)
    index = InvertedIndex.build(tmp_path / "ix", codes, [str(i) for i in range(400)])
    for _ in range(10):
        q = rng.standard_normal(DIM).astype(np.float32) * (rng.random(DIM) < 0.4)
        ex = Exclusion(rng.choice(DIM, 3, replace=False), mode="penalty", penalty=0.3)
        hit = index.search(q, 50, ex)
        terms = sparse_query_terms(q, ex, DIM)
        sub = codes[hit.rows]
        sub.sort_indices()
        got = sparse_rescore(
            terms.terms_dims, terms.terms_w, sub.indptr.astype(np.int64), sub.indices, sub.data
        )
        np.testing.assert_array_equal(got, hit.scores)  # float32, same summation order


def test_dense_scores_do_not_depend_on_the_batch() -> None:
    rng = np.random.default_rng(5)
    mat = rng.standard_normal((50, 33)).astype(np.float32)
    q = rng.standard_normal(33).astype(np.float32)
    full = dense_scores(mat, q)
    np.testing.assert_array_equal(full[[7, 3, 40]], dense_scores(mat[[7, 3, 40]], q))
    np.testing.assert_allclose(full, mat.astype(np.float64) @ q, rtol=1e-6)


def test_rows_above_matches_the_filter(tmp_path: Path) -> None:
    codes, _, ids = _data(60)
    index = InvertedIndex.build(tmp_path / "ix", codes[:30], ids[:30])
    index.add(codes[30:], ids[30:])
    got = index._rows_above(np.array([2, 7]), 0.5)
    np.testing.assert_array_equal(got, (codes[:, [2, 7]].toarray() > 0.5).any(axis=1))


def test_orphan_dense_chunk_is_ignored_and_replaced(tmp_path: Path, monkeypatch) -> None:
    codes, dense, ids = _data(40)
    s = LocalStore.build(tmp_path / "ix", codes[:20], ids[:20], dense=dense[:20])

    def crash(*a: object, **k: object) -> None:
        raise OSError("disk died")

    monkeypatch.setattr(InvertedIndex, "add", crash)
    with pytest.raises(OSError):  # dense chunk committed, sparse rows not: an orphan tail
        s.add(codes[20:], ids[20:], dense[20:])
    monkeypatch.undo()
    s = LocalStore.open(tmp_path / "ix")
    assert len(s) == 20
    s.add(codes[20:], ids[20:], dense[20:] * 2)
    s = LocalStore.open(tmp_path / "ix")
    v = np.ones(DD)
    np.testing.assert_array_equal(
        s.search_dense(v, 5).rows,
        _dense_reference(np.vstack([dense[:20], dense[20:] * 2]), codes, v, 5, None),
    )
    assert len(list((tmp_path / "ix").glob("dense-*/chunk-*.npy"))) == 2


def test_overwrite_and_plain_indexes(tmp_path: Path) -> None:
    codes, dense, ids = _data(30)
    LocalStore.build(tmp_path / "ix", codes, ids, dense=dense)
    with pytest.raises(SparsemmError, match="already exists"):
        LocalStore.build(tmp_path / "ix", codes, ids, dense=dense)
    s = LocalStore.build(
        tmp_path / "ix", codes[:10], ids[:10], dense=dense[:10] + 1, overwrite=True
    )
    assert len(s) == 10 and len(list((tmp_path / "ix").glob("dense-*"))) == 1
    # an index rebuilt without dense vectors (e.g. by build_index) drops the dense part
    InvertedIndex.build(tmp_path / "ix", codes, ids, overwrite=True)
    s = open_store("local", path=tmp_path / "ix")
    assert s.dense_dim is None and len(s) == 30
    with pytest.raises(SparsemmError, match="no dense vectors"):
        s.search_dense(np.ones(DD), 3)
    with pytest.raises(SparsemmError, match="no dense vectors"):
        s.add(codes[:1], ["new"], dense[:1])


def test_upload_resumes_and_refuses_other_data(tmp_path: Path) -> None:
    codes, dense, ids = _data(50)
    s = LocalStore.create(tmp_path / "ix", DIM, dense_dim=DD)
    s.add(codes[:20], ids[:20], dense[:20])  # an upload interrupted after 20 items
    assert s.upload(codes, ids, dense) == 30
    assert list(s.ids) == ids and s.upload(codes, ids, dense) == 0
    other = codes.copy()
    other.data[0] += 1
    with pytest.raises(SparsemmError, match="not the first"):
        s.upload(other, ids, dense)
    with pytest.raises(SparsemmError, match="not the first"):
        s.upload(codes[:10], ids[:10], dense[:10])


def test_open_store_errors(tmp_path: Path) -> None:
    with pytest.raises(SparsemmError, match="unknown store backend"):
        open_store("faiss", path=tmp_path)
    with pytest.raises(SparsemmError, match="index folder"):
        open_store("local")
    with pytest.raises(SparsemmError, match="collection name"):
        open_store("qdrant", url=":memory:")


@pytest.mark.parametrize("block_rows", [16, 100, 64, 4096])
def test_long_posting_lists_scored_as_dense_rows(tmp_path: Path, block_rows: int) -> None:
    """Dims present in >= 1/2 of the rows are scored from in-memory dense value rows: the
    same rows and float32 scores as the reference, alone or mixed with short lists."""
    rng = np.random.default_rng(9)
    n = 700
    codes = random_codes(rng, n, DIM, max_nnz=3, signed=True).tolil()
    for d, density in ((0, 0.97), (1, 0.65), (2, 0.15), (3, 1.0)):
        rows = np.flatnonzero(rng.random(n) < density)
        codes[rows, d] = rng.choice(np.array([0.25, 0.5, 1.0, -0.5], np.float32), len(rows))
    codes = sp.csr_matrix(codes, dtype=np.float32)
    ids = [str(i) for i in range(n)]
    InvertedIndex.build(tmp_path / "ix", codes[:300], ids[:300]).add(codes[300:], ids[300:])
    index = InvertedIndex.open(tmp_path / "ix", block_rows=block_rows)
    slot, dense = index._segments[0].dense_lists()
    assert (slot[[0, 1, 3]] >= 0).all() and slot[2] == -1 and dense.shape == (3, n)
    for q_dims in ([0], [1], [3, 7], [0, 1, 2, 5], [2, 9, 11]):
        q = np.zeros(DIM, np.float32)
        q[q_dims] = rng.choice(np.array([0.5, 1.0, -1.0, 2.0]), len(q_dims))
        for ex in (None, Exclusion([4, 1], threshold=0.25), Exclusion([0], mode="penalty")):
            for k in (1, 10, n):
                rows, scores = reference_search(codes, q, k, ex)
                hit = index.search(q, k, ex)
                np.testing.assert_array_equal(hit.rows, rows)
                np.testing.assert_array_equal(hit.scores, scores.astype(np.float32))
