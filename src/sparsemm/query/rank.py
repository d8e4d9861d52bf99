"""Ranking every item: :func:`score_query` scores a query over a context's items and
:func:`rank_query` ranks them. Strategies not served through the index, CLIP's ``match``
and the benchmarks (``bench exclusion``, ``bench negation``) rank here; the served default
through the index (:mod:`sparsemm.query.two_stage`) rescores its candidates with the same
scores and is tested equal to :func:`rank_query`.

A parsed :class:`~sparsemm.query.parse.Query` (include terms, excluded terms, either side may
be empty but not both) is scored over the items of an
:class:`~sparsemm.query.strategies.ExclusionContext` by a registered strategy's
``score_query``. For sparse strategies an item that shares no concept dimension with the
include text's code is not a match (whatever the score scale: cosines, log-probabilities),
so it is left out. Ties go to the lower row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.query.parse import Query
from sparsemm.query.request import DEFAULT_STRATEGY
from sparsemm.query.strategies import ExclusionContext, Strategy, get_strategy, top_rows


def build_strategy(ctx: ExclusionContext, strategy: str | Strategy, **params: Any) -> Strategy:
    """A strategy instance: a registered name (with ``params``) or one already built."""
    if isinstance(strategy, Strategy):
        if params:
            raise SparsemmError("pass parameters when naming a strategy, not with an instance")
        return strategy
    return get_strategy(strategy, ctx, **params)


def score_query(
    ctx: ExclusionContext, query: Query, strategy: str | Strategy = DEFAULT_STRATEGY, **params: Any
) -> np.ndarray:
    """(n_items,) float64 scores of ``query``; -inf marks an item left out."""
    # an instance as it is (build_strategy refuses one with params)
    strat = (
        strategy
        if isinstance(strategy, Strategy) and not params
        else build_strategy(ctx, strategy, **params)
    )
    scores = np.asarray(strat.score_query(query.include, query.exclude), dtype=np.float64)
    if strat.kind == "sparse" and query.include and getattr(strat, "overlap_rule", True):
        # The include code's cosine, as the strategy computes it (cached by the detector
        # strategies, which score with it too).
        overlap = strat.similarity(query.include_text) > 0
        scores = np.where(overlap, scores, -np.inf)
    return scores


def rank_query(
    ctx: ExclusionContext,
    query: Query,
    strategy: str | Strategy = DEFAULT_STRATEGY,
    k: int = 10,
    offset: int = 0,
    **params: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, scores) of the top ``k`` items after ``offset``, best first (fewer when items
    are left out)."""
    if k < 1 or offset < 0:
        raise SparsemmError("k must be >= 1 and offset >= 0")
    scores = score_query(ctx, query, strategy, **params)
    rows = top_rows(scores, offset + k)[offset:]
    return rows, scores[rows]
