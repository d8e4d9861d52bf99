"""The library's word-vector inspection: sparsity, a dimension's top words, a word's top
dimensions."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.words.evaluate import top_words
from sparsemm.words.spine import SparseWordVectors
from sparsemm_experiments.word_quality import sparsity_stats, word_dims


def test_sparsity_stats_by_hand() -> None:
    dense = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    assert sparsity_stats(dense) == {"zero_share": pytest.approx(4 / 6), "mean_active_dims": 1.0}
    # an explicitly stored zero is not "active"
    stored = sp.csr_matrix((np.array([1.0, 0.0, 2.0]), [1, 2, 0], [0, 2, 3]), shape=(2, 3))
    assert stored.nnz == 3
    assert sparsity_stats(stored) == sparsity_stats(dense)


def test_top_words_and_word_dims() -> None:
    matrix = sp.csr_matrix(
        np.array([[0.5, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.2, 0.0], [0.0, 0.0, 0.0]])
    )
    sv = SparseWordVectors(["a", "b", "c", "d"], matrix)
    # ties on dim 0 keep vocabulary order; zeros are never listed
    assert top_words(sv, 0, 10) == [("b", 1.0), ("c", 1.0), ("a", 0.5)]
    assert top_words(sv, 0, 2) == [("b", 1.0), ("c", 1.0)]
    assert top_words(sv, 2, 5) == []
    assert word_dims(sv, "a", 5) == [(1, 1.0), (0, 0.5)]
    assert word_dims(sv, "d", 5) == []
    with pytest.raises(SparsemmError, match="out of range"):
        top_words(sv, 3, 5)
    with pytest.raises(SparsemmError, match="not in the SPINE vocabulary"):
        word_dims(sv, "zebra", 5)
