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
