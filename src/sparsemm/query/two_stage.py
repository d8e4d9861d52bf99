"""The served scorer through the inverted index: candidates first, then exact rescoring.

An opt-in path toward serving the default scorer at scale (issue 16); `rank_query` over
every item stays the default and the reference it is measured against.

1. **Candidates.** The index returns the exact top ``candidates`` items by inner product with
   a linear proxy of the include score. The proxy is the include text's unit query code
   (times alpha, or alpha_phrase when no include term has a detector) plus delta times the
   scaled weights of each include term's detector. Only the positive part is kept (codes
   are non-negative), cut to its ``proxy_dims`` largest dims so the index reads few
   posting lists. Exclusions only lower a score (every exclusion term is <= 0), so they
   are left to step 2.
2. **Rescoring.** The candidates' codes are read from the index's per-segment row store (the
   memory-mapped forward index) and scored by the full strategy in a context of just those
   items. The model's detectors and the text caches are shared with the full context.

The result is exact whenever the true top-k lies among the candidates;
``benchmarks/two_stage.py`` measures recall@10 against brute force. A query with nothing
to include has no proxy and is ranked over every item.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.eval.retrieval import normalize_rows
from sparsemm.index import InvertedIndex
from sparsemm.query.parse import Query
from sparsemm.query.rank import build_strategy, rank_query
from sparsemm.query.strategies import ExclusionContext, Hybrid


def include_proxy(
    strat: Hybrid, query: Query, proxy_dims: int = 64, exclusions: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(dims, weights) of the include score's linear proxy (see the module docstring);
    ``exclusions`` also subtracts the excluded terms' detector weights and codes."""
    ctx = strat.ctx
    p = strat.p
    alpha, detected = strat.include_alpha(query.include)
    v = alpha * normalize_rows(ctx.term_code(query.include_text)).astype(np.float64)
    for t in detected:
        v = v + p["delta"] * strat.detector_weights(t)
    if exclusions:
        for b in query.exclude:
            if strat.has_detector(b) and p["beta"]:
                v = v - p["beta"] * np.maximum(strat.detector_weights(b), 0.0)
            v = v - p["gamma"] * normalize_rows(ctx.term_code(b)).astype(np.float64)
    else:
        v = np.maximum(v, 0.0)
    dims = np.argsort(-np.abs(v), kind="stable")[:proxy_dims]
    dims = np.sort(dims[v[dims] != 0])
    return dims.astype(np.int64), v[dims].astype(np.float32)


def two_stage_rank(
    index: InvertedIndex,
    ctx: ExclusionContext,
    query: Query,
    strategy: str = "hybrid",
    k: int = 10,
    candidates: int = 1000,
    proxy_dims: int = 64,
    exclusions: bool = False,
    **params: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, scores) of the top ``k`` items: index candidates, exactly rescored."""
    if candidates < k:
        raise SparsemmError(f"candidates ({candidates}) must be at least k ({k})")
    strat = build_strategy(ctx, strategy, **params)
    if not isinstance(strat, Hybrid) or not query.include:
        return rank_query(ctx, query, strat, k=k)
    dims, weights = include_proxy(strat, query, proxy_dims, exclusions)
    if not len(dims):
        return np.zeros(0, np.int64), np.zeros(0)
    rows = np.asarray(index.search((dims, weights), k=candidates).rows, dtype=np.int64)
    sub = ExclusionContext(
        items_codes=index.codes(rows),
        text_encoder=ctx.text_encoder,
        query_coder=ctx.query_coder,
        reference=ctx.reference,
        template=ctx.template,
        cache_size=ctx.cache_size,
        detectors=ctx.detectors,
    )
    sub._emb, sub._code = ctx._emb, ctx._code  # texts are coded once for both contexts
    local, scores = rank_query(sub, query, strategy, k=k, **params)
    return rows[local], scores
