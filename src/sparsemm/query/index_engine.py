"""The index engine: strategy ``filter`` scored by the inverted index itself.

The index scores the include text's code (its inner product is the cosine: it holds
unit-length codes) and drops every item over an excluded term's dimensions as a hard
:class:`~sparsemm.index.Exclusion`; B's dimensions and threshold come from the ``filter``
strategy, so the ranking equals ``search(..., strategy="filter", dims="query")``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion
from sparsemm.query.parse import Query
from sparsemm.query.strategies import HardFilter, get_strategy

if TYPE_CHECKING:
    from sparsemm.query.handle import IndexedCollection


def filter_search(
    h: IndexedCollection, q: Query, k: int = 10, **params: Any
) -> tuple[HardFilter, np.ndarray, list[float]]:
    """(the strategy, rows, scores) of the top ``k`` of a checked query by ``filter``
    through the index (see the module docstring)."""
    strat = get_strategy("filter", h.text_context, **{"dims": "query", **params})
    assert isinstance(strat, HardFilter)
    if not q.include:
        raise SparsemmError(
            "the index engine needs something to include; an exclusion-only query is "
            "ranked by the default strategy (drop --engine index)"
        )
    a = q.include_text
    ex = None
    if q.exclude:
        dims = np.unique(
            np.concatenate([np.flatnonzero(strat.b_weights(a, b) > 0) for b in q.exclude])
        )
        ex = Exclusion(dims, threshold=float(strat.p["threshold"]), mode="filter")
    qa = h.text_context.term_code(a)
    qa = qa / max(float(np.linalg.norm(qa)), 1e-12)  # scores = cosine, as in `search`
    res = h.store.search(qa, k=k, exclude=ex)
    keep = [i for i, s in enumerate(res.scores) if s > 0]  # no concept in common: no match
    rows = np.asarray(res.rows, dtype=np.int64)[keep]
    scores = [res.scores[i] for i in keep]
    return strat, rows, scores
