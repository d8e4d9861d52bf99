"""Max-score pruning is exact: the same rows and bit-identical scores as the plain scan and
as brute force, with weights of any sign, ties, exclusions and row subsets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from index_testlib import random_codes, reference_search

from sparsemm.index import Exclusion, InvertedIndex

DIM = 30


def _query(rng: np.random.Generator, m: int, signed: bool) -> np.ndarray:
    """A few heavy weights and many light ones: the light lists are what pruning skips."""
    q = np.zeros(DIM, np.float32)
    dims = rng.choice(DIM, size=m, replace=False)
    w = np.where(rng.random(m) < 0.25, 4.0, rng.choice([0.25, 0.5], size=m)).astype(np.float32)
    if signed:
        w = w * np.where(rng.random(m) < 0.2, -1.0, 1.0).astype(np.float32)
    q[dims] = w
    return q


@pytest.mark.parametrize("dyadic", [True, False])
@pytest.mark.parametrize("signed", [False, True])
def test_pruned_equals_plain_scan_and_brute_force(
    tmp_path: Path, dyadic: bool, signed: bool
) -> None:
    rng = np.random.default_rng(11 + 2 * dyadic + signed)
    codes = random_codes(rng, 4000, DIM, max_nnz=10, signed=signed, dyadic=dyadic)
    ids = [f"id{i}" for i in range(codes.shape[0])]
    InvertedIndex.build(tmp_path / "ix", codes, ids)
    index = InvertedIndex.open(tmp_path / "ix", block_rows=128)
    for t in range(40):
        q = _query(rng, int(rng.integers(3, 16)), signed)
        k = int(rng.choice([1, 3, 10, 100, 1000]))
        exclude = None
        if t % 3 == 1:
            exclude = Exclusion(dims=rng.choice(DIM, size=2, replace=False).tolist())
        elif t % 3 == 2:
            exclude = Exclusion(dims=[int(rng.integers(DIM))], mode="penalty", penalty=0.5)
        allowed = rng.random(codes.shape[0]) < 0.7 if t % 4 == 3 else None
        index.pruning = False
        plain = index.search(q, k, exclude=exclude, allowed=allowed)
        index.pruning = True
        pruned = index.search(q, k, exclude=exclude, allowed=allowed)
        np.testing.assert_array_equal(pruned.rows, plain.rows)
        assert pruned.scores.tobytes() == plain.scores.tobytes()  # bit-identical
        rows, scores = reference_search(codes, q, k, exclude, allowed)
        if dyadic:  # exact in float32: the reference ranking, ties included
            np.testing.assert_array_equal(pruned.rows, rows)
            np.testing.assert_array_equal(pruned.scores, scores.astype(np.float32))
        else:
            np.testing.assert_allclose(pruned.scores, scores, rtol=1e-5, atol=1e-5)


def test_approx_full_share_is_exact_and_partial_share_recalls(tmp_path: Path) -> None:
    """approx=1.0 keeps every posting (the exact top-k, exact scores); a smaller share keeps
    scores exact for what it returns and recalls most of the exact top-10 on random data."""
    rng = np.random.default_rng(5)
    codes = random_codes(rng, 3000, DIM, max_nnz=8, dyadic=False)
    ids = [f"id{i}" for i in range(codes.shape[0])]
    index = InvertedIndex.build(tmp_path / "ix", codes, ids)
    recalls = []
    for t in range(30):
        q = _query(rng, int(rng.integers(3, 12)), signed=t % 2 == 1)
        exclude = Exclusion(dims=[int(rng.integers(DIM))]) if t % 3 == 0 else None
        exact = index.search(q, 10, exclude=exclude)
        full = index.search(q, 10, exclude=exclude, approx=1.0)
        np.testing.assert_array_equal(full.rows, exact.rows)
        assert full.scores.tobytes() == exact.scores.tobytes()
        part = index.search(q, 10, exclude=exclude, approx=0.5)
        ref = dict(zip(exact.rows.tolist(), exact.scores.tolist(), strict=True))
        all_scores = np.asarray(codes @ q.astype(np.float64)).ravel()
        np.testing.assert_allclose(part.scores, all_scores[part.rows], rtol=1e-5, atol=1e-5)
        assert list(part.scores) == sorted(part.scores, reverse=True)
        if exclude is not None:
            assert not (codes[part.rows][:, exclude.dims].toarray() > 0).any()
        recalls.append(len(set(part.rows.tolist()) & set(ref)) / len(ref))
    assert np.mean(recalls) >= 0.9


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, True, "half"])
def test_approx_share_is_checked(tmp_path: Path, bad: object) -> None:
    from sparsemm.errors import SparsemmError

    codes = random_codes(np.random.default_rng(0), 50, DIM, max_nnz=4)
    index = InvertedIndex.build(tmp_path / "ix", codes, [f"id{i}" for i in range(50)])
    with pytest.raises(SparsemmError, match="approx"):
        index.search(np.ones(DIM, np.float32), 5, approx=bad)  # type: ignore[arg-type]
