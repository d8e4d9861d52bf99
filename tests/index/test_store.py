"""The one store interface: the inverted index and the Qdrant backend are both a Store,
open_store opens each, the inverted index keeps the interface's result rule, and the
exact rescoring kernel the Qdrant backend uses matches the index bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from index_testlib import random_codes, reference_search

from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion, InvertedIndex, Store, open_store
from sparsemm.index.scoring import sparse_query_terms, sparse_rescore

DIM = 30


def _data(n: int = 120, seed: int = 0) -> tuple[sp.csr_matrix, list[str]]:
    rng = np.random.default_rng(seed)
    return random_codes(rng, n, DIM, max_nnz=6), [f"it{i}" for i in range(n)]


def _query(rng: np.random.Generator, m: int = 4) -> np.ndarray:
    q = np.zeros(DIM, np.float32)
    q[rng.choice(DIM, size=m, replace=False)] = rng.choice(np.array([0.5, 1.0, 2.0]), size=m)
    return q


@pytest.mark.filterwarnings("ignore:.*local Qdrant:UserWarning")
@pytest.mark.filterwarnings("ignore:Local mode performs exact:UserWarning")
def test_both_backends_are_the_store_and_open_store_opens_each(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import sparsemm.index.qdrant as qmod
    from sparsemm.index.qdrant import QdrantStore

    assert issubclass(InvertedIndex, Store) and issubclass(QdrantStore, Store)
    assert (InvertedIndex.backend, QdrantStore.backend) == ("local", "qdrant")
    codes, ids = _data(40)
    InvertedIndex.build(tmp_path / "ix", codes, ids)
    with open_store("local", path=tmp_path / "ix") as local:
        assert isinstance(local, InvertedIndex) and (len(local), local.dim) == (40, DIM)
    client = qmod.connect(":memory:")
    QdrantStore.create(client, "items", DIM).upload(codes, ids)
    seen: list[Any] = []
    monkeypatch.setattr(qmod, "connect", lambda url, **kw: seen.append((url, kw)) or client)
    with open_store("qdrant", url="http://q:6333", collection="items", api_key="key") as qd:
        assert isinstance(qd, QdrantStore) and (len(qd), qd.dim) == (40, DIM)
        assert not qd.nonnegative  # cannot vouch: a served query without an answer scans
    assert seen == [("http://q:6333", {"api_key": "key"})]


def test_the_index_search_keeps_the_store_rule(tmp_path: Path) -> None:
    """Hits scoring > 0 are the reference's, best first (ties by row), with their ids;
    anything after them scores <= 0. Codes come back by row, indices sorted."""
    codes, ids = _data()
    InvertedIndex.build(tmp_path / "ix", codes[:70], ids[:70]).add(codes[70:], ids[70:])
    s: Store = InvertedIndex.open(tmp_path / "ix")
    rng = np.random.default_rng(1)
    for _ in range(20):
        q = _query(rng)
        for ex in (None, Exclusion(rng.choice(DIM, 3, replace=False), threshold=0.5)):
            rows, scores = reference_search(codes, q, len(s), ex)
            want = rows[scores > 0][:7]
            got = s.search(q, 7, ex)
            pos = got.scores > 0
            np.testing.assert_array_equal(got.rows[pos], want)
            assert [i for i, p in zip(got.ids, pos, strict=True) if p] == [f"it{r}" for r in want]
            assert (np.diff(pos.astype(int)) <= 0).all()  # the positive hits come first
    rows = np.array([100, 3, 69, 70])
    got = s.codes(rows)
    assert got.has_sorted_indices and got.dtype == np.float32
    assert (got != codes[rows]).nnz == 0


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
