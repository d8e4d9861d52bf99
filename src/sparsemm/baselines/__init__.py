"""Baselines the sparse models are measured against, and which the library builds on.

* :mod:`sparsemm.baselines.splice` - SpLiCE (Bhalla et al., NeurIPS 2024): non-negative
  sparse decomposition of dense embeddings over a concept vocabulary
  (:class:`SpliceDecomposer`, the batched solver :func:`nonneg_lasso`), which the CLIP/SigLIP
  concept model codes items with.
* :mod:`sparsemm_experiments.baselines` - what only the research runs use: BM25 over item
  captions, and SpLiCE's concept-embedding cache, query coder and persistence.

The dense single-line query, embedding-arithmetic and content-based exclusion (CBE,
Yoshikawa & Tajima, ICMR 2024) baselines are exclusion strategies in
:mod:`sparsemm.query.strategies` (``slq``, ``avg_emb``, ``avg_emb_0.5``, ``cbe``).
"""

from __future__ import annotations

from sparsemm.baselines.splice import SpliceDecomposer, load_concepts, nonneg_lasso

__all__ = ["SpliceDecomposer", "load_concepts", "nonneg_lasso"]
