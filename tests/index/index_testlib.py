"""Shared helpers for the inverted-index tests: random codes and a naive reference search."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsemm.index import Exclusion

# Dyadic values (k / 4) keep every score exact in float32, so ties are real ties and the
# index must reproduce the reference ranking exactly, tie rule included.
DYADIC = np.array([0.25, 0.5, 0.75, 1.0, 1.5, 2.0], dtype=np.float32)


def random_codes(
    rng: np.random.Generator,
    n: int,
    dim: int,
    max_nnz: int,
    signed: bool = False,
    dyadic: bool = True,
) -> sp.csr_matrix:
    """(n, dim) float32 CSR with 0..max_nnz entries per row (some rows empty)."""
    rows, cols = [], []
    for i in range(n):
        m = int(rng.integers(0, max_nnz + 1))
        rows.extend([i] * m)
        cols.extend(rng.choice(dim, size=m, replace=False).tolist())
    if dyadic:
        vals = rng.choice(DYADIC, size=len(rows))
    else:
        vals = rng.random(len(rows), dtype=np.float32) + np.float32(0.01)
    if signed:
        vals = vals * rng.choice(np.array([-1.0, 1.0], np.float32), size=len(rows))
    return sp.csr_matrix((vals.astype(np.float32), (rows, cols)), shape=(n, dim), dtype=np.float32)


def reference_search(
    codes: sp.csr_matrix,
    query: np.ndarray,
    k: int,
    exclude: Exclusion | None = None,
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Naive brute force: (rows, scores float64) of the top k, ties by lower row."""
    x = sp.csc_matrix(codes, dtype=np.float64)
    scores = np.asarray(x @ np.asarray(query, np.float64)).ravel()
    keep = np.ones(x.shape[0], bool)
    if exclude is not None:
        dims = np.asarray(exclude.dims, np.int64)
        excluded = x[:, dims].toarray()  # (n, len(dims))
        if exclude.mode == "filter":
            keep &= ~(excluded > exclude.threshold).any(axis=1)
        else:
            w = np.ones(len(dims)) if exclude.weights is None else np.asarray(exclude.weights)
            scores = scores - exclude.penalty * (excluded @ w)
    if allowed is not None:
        keep &= allowed
    rows = np.flatnonzero(keep)
    order = np.lexsort((rows, -scores[rows]))
    top = rows[order][:k]
    return top, scores[top]
