"""Baselines the sparse models are measured against.

* :mod:`sparsemm.baselines.splice` - SpLiCE (Bhalla et al., NeurIPS 2024): non-negative
  sparse decomposition of dense embeddings over a concept vocabulary
  (:class:`SpliceDecomposer`, the batched solver :func:`nonneg_lasso`).
* :mod:`sparsemm_experiments.baselines.bm25` - BM25 over item captions.

The dense single-line query, embedding-arithmetic and content-based exclusion (CBE,
Yoshikawa & Tajima, ICMR 2024) baselines are exclusion strategies in
:mod:`sparsemm.query.strategies` (``slq``, ``avg_emb``, ``avg_emb_0.5``, ``cbe``).
"""

from __future__ import annotations

from sparsemm.baselines.splice import (
    SpliceDecomposer,
    embed_concepts,
    load_concepts,
    nonneg_lasso,
    splice_query_coder,
)

__all__ = [
    "SpliceDecomposer",
    "embed_concepts",
    "load_concepts",
    "nonneg_lasso",
    "splice_query_coder",
]
