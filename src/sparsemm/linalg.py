"""Array helpers shared by every layer (bottom layer: imports nothing of sparsemm but its
error type): row normalisation of dense and sparse matrices, the check of an embedding
matrix."""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError

# Dense ndarray or any scipy sparse matrix; typed loosely because scipy ships no stubs.
Matrix: TypeAlias = Any


def normalize_rows(x: Matrix) -> Matrix:
    """L2-normalise the rows of a dense (n, d) array (or one (d,) row) or a sparse (n, d)
    matrix: x / max(||x||, 1e-12), so zero rows stay zero. float32 out (CSR, duplicates
    summed, indices in the input's order, for sparse input)."""
    if sp.issparse(x):
        # On the arrays directly: the served path normalises a few hundred candidate rows
        # per query, where scipy's diags @ x cost ~0.5 ms of object overhead.
        x = sp.csr_matrix(x, dtype=np.float32)
        x.sum_duplicates()
        counts = np.diff(x.indptr)
        sums = np.zeros(x.shape[0], np.float32)
        full = counts > 0
        if x.nnz:
            sums[full] = np.add.reduceat(x.data * x.data, x.indptr[:-1][full])
        inv = (1.0 / np.maximum(np.sqrt(sums), np.float32(1e-12))).astype(np.float32)
        data = x.data * np.repeat(inv, counts)
        out = sp.csr_matrix((data, x.indices.copy(), x.indptr.copy()), shape=x.shape)
        out.eliminate_zeros()  # as the product did: stored zeros are not kept
        return out
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def check_embeddings(arr: np.ndarray, dim: int | None, what: str) -> np.ndarray:
    """Validate a dense (n, d) float matrix: right shape, finite values."""
    arr = np.asarray(arr)
    if arr.ndim != 2:
        raise SparsemmError(f"{what}: expected a 2-D (n, d) array, got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise SparsemmError(f"{what}: expected dimension {dim}, got {arr.shape[1]}")
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).any(axis=1).sum())
        raise SparsemmError(f"{what}: {bad} row(s) contain NaN or inf; re-encode those items")
    return arr.astype(np.float32, copy=False)
