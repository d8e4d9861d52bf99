"""The SR sentence bias built from SPINE word vectors.

The SR model (sparse disentangled representations for exclusion queries) steers its sparse
code for an image/caption towards the SPINE dimensions of the words in the caption. That
"sentence bias" is, per caption, the mean of the SPINE vectors of its content words,
L2-normalised (SPINE: Subramanian et al. 2018, AAAI). Captions are split into words by
:func:`sparsemm.text.tokenize` (its rule is in :mod:`sparsemm.text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from sparsemm.text import STOP_WORDS, tokenize

if TYPE_CHECKING:
    from sparsemm.words.spine import SparseWordVectors


def caption_word_counts(
    captions: Sequence[str], vocabulary: dict[str, int], stop_words: frozenset[str] = STOP_WORDS
) -> sp.csr_matrix:
    """Sparse ``(n_captions, len(vocabulary))`` float32 counts of each known token.

    Tokens that are not in ``vocabulary`` (word -> column) are ignored.
    """
    indptr = [0]
    indices: list[int] = []
    for caption in captions:
        for tok in tokenize(caption, stop_words):
            col = vocabulary.get(tok)
            if col is not None:
                indices.append(col)
        indptr.append(len(indices))
    data = np.ones(len(indices), dtype=np.float32)
    counts = sp.csr_matrix(
        (data, np.asarray(indices, dtype=np.int64), np.asarray(indptr, dtype=np.int64)),
        shape=(len(captions), len(vocabulary)),
    )
    counts.sum_duplicates()  # repeated words become counts > 1
    return counts


def l2_normalize_rows(mat: sp.csr_matrix) -> sp.csr_matrix:
    """Divide each row by its L2 norm; all-zero rows stay zero."""
    mat = sp.csr_matrix(mat, dtype=np.float32)
    norms = np.sqrt(np.asarray(mat.multiply(mat).sum(axis=1)).ravel())
    scale = np.zeros_like(norms)
    nonzero = norms > 0
    scale[nonzero] = 1.0 / norms[nonzero]
    out = sp.csr_matrix(sp.diags(scale.astype(np.float32)) @ mat, dtype=np.float32)
    out.eliminate_zeros()
    return out


def sentence_bias(captions: Sequence[str], sparse_vectors: SparseWordVectors) -> sp.csr_matrix:
    """SR sentence bias: ``(n_captions, hidden)`` float32 CSR.

    Row c = L2-normalise( mean over the token occurrences w of caption c that are in the
    vocabulary of ``sparse_vectors`` and not stop words, of SPINE(w) ). A word used twice
    counts twice. A caption with no known word gets an all-zero row (no bias), so callers can
    tell "no information" from a real bias by the row's nnz.

    Computed as ``(C / rowsum(C)) @ W`` with C the caption-by-word count matrix and W the
    ``(n_words, hidden)`` SPINE matrix, then row-normalised.
    """
    counts = caption_word_counts(captions, sparse_vectors.index)
    n_tokens = np.asarray(counts.sum(axis=1)).ravel()
    inv = np.zeros_like(n_tokens, dtype=np.float32)
    inv[n_tokens > 0] = 1.0 / n_tokens[n_tokens > 0]
    mean = sp.diags(inv) @ counts @ sparse_vectors.matrix
    return l2_normalize_rows(mean)
