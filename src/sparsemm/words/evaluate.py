"""Inspecting sparse word vectors: how sparse they are, a dimension's top words, a word's
top dimensions.

- ``sparsity_stats``: share of exact zeros and mean number of active dimensions per word
  (``sparsemm spine train`` reports it).
- ``top_words`` / ``word_dims``: ``sparsemm spine inspect``, and a dimension's SPINE label
  words when an index is built.

The quality measures of ``sparsemm spine eval`` (WordSim-353, DistRatio) are in
:mod:`sparsemm_experiments.word_quality`.
"""

from __future__ import annotations

from typing import TypeAlias, TypedDict

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.words.spine import SparseWordVectors

Matrix: TypeAlias = "np.ndarray | sp.spmatrix | sp.sparray"  # dense or scipy sparse (n, d)


class SparsityStats(TypedDict):
    zero_share: float
    mean_active_dims: float


def sparsity_stats(matrix: Matrix) -> SparsityStats:
    """``zero_share`` = share of entries exactly 0; ``mean_active_dims`` = mean number of
    non-zero entries per row. Works for dense arrays and scipy sparse matrices."""
    if sp.issparse(matrix):
        n, d = matrix.shape
        nnz = int(sp.csr_matrix(matrix).count_nonzero())  # ignores stored explicit zeros
    else:
        arr = np.asarray(matrix)
        if arr.ndim != 2:
            raise SparsemmError(f"expected a 2-D matrix, got shape {arr.shape}")
        n, d = arr.shape
        nnz = int(np.count_nonzero(arr))
    if n == 0 or d == 0:
        raise SparsemmError("sparsity_stats of an empty matrix is undefined")
    return {"zero_share": 1.0 - nnz / (n * d), "mean_active_dims": nnz / n}


def top_words(sparse_vectors: SparseWordVectors, dim: int, k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` words with the largest value on ``dim`` (only non-zero values; ties keep
    vocabulary order, i.e. the more frequent word first for a GloVe-ordered vocabulary)."""
    if not 0 <= dim < sparse_vectors.dim:
        raise SparsemmError(f"dimension {dim} is out of range 0..{sparse_vectors.dim - 1}")
    col = sp.csc_matrix(sparse_vectors.matrix[:, [dim]])
    rows, vals = col.indices, col.data
    order = np.lexsort((rows, -vals))[:k]  # value descending, then row ascending
    return [(sparse_vectors.words[rows[i]], float(vals[i])) for i in order if vals[i] != 0]


def word_dims(sparse_vectors: SparseWordVectors, word: str, k: int = 10) -> list[tuple[int, float]]:
    """The ``k`` dimensions with the largest value for ``word`` (non-zero only)."""
    row = sparse_vectors.row(word)
    order = np.argsort(-row, kind="stable")[:k]
    return [(int(j), float(row[j])) for j in order if row[j] != 0]
