"""A dimension's top words in sparse word vectors: the SPINE label words of a dimension
when an index is built (``sparsemm spine inspect`` shows them too).

Sparsity, a word's top dimensions and the quality measures of ``sparsemm spine eval``
(WordSim-353, DistRatio) are in :mod:`sparsemm_experiments.word_quality`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.words.spine import SparseWordVectors


def top_words(sparse_vectors: SparseWordVectors, dim: int, k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` words with the largest value on ``dim`` (only non-zero values; ties keep
    vocabulary order, i.e. the more frequent word first for a GloVe-ordered vocabulary)."""
    if not 0 <= dim < sparse_vectors.dim:
        raise SparsemmError(f"dimension {dim} is out of range 0..{sparse_vectors.dim - 1}")
    col = sp.csc_matrix(sparse_vectors.matrix[:, [dim]])
    rows, vals = col.indices, col.data
    order = np.lexsort((rows, -vals))[:k]  # value descending, then row ascending
    return [(sparse_vectors.words[rows[i]], float(vals[i])) for i in order if vals[i] != 0]
