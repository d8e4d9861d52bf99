"""The hard filter on an excluded term's dimensions (``filter``), and the machinery of the
strategies that pick a term's dimensions from its top items (:class:`TermDims`).

Code similarity and arithmetic, the SR paper's two-step and the soft penalty, the baselines
that use the same machinery, are research code (``sparsemm_experiments.baselines.strategies``,
registered through the ``sparsemm.strategies`` entry points).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.query.strategies.base import (
    Strategy,
    active_dims,
    mean_rows,
    top_rows,
    vector_active_dims,
)
from sparsemm.query.strategies.registry import register_strategy

logger = logging.getLogger(__name__)


class TermDims(Strategy):
    """Shared machinery: a term's top-K items and the dimension sets built from them (the
    hard filter here; the paper's two-step and the soft penalty of the research package)."""

    requires = ("codes", "text_encoder", "query_coder")
    kind = "sparse"

    def top_items(self, term: str, k: int) -> np.ndarray:
        key = ("top_items", term, k)
        if key not in self.ctx.cache:
            self.ctx.cache[key] = top_rows(self.ctx.code_scores(self.ctx.term_code(term)), k)
        rows: np.ndarray = self.ctx.cache[key]
        return rows

    def item_dims(self, term: str, k: int, share: float) -> np.ndarray:
        """The paper's D_term: union of active dims (mass ``share``) of the term's top k."""
        key = ("item_dims", term, k, share)
        if key not in self.ctx.cache:
            self.ctx.cache[key] = active_dims(self.ctx.codes_unit, self.top_items(term, k), share)
        dims: np.ndarray = self.ctx.cache[key]
        return dims

    def mean_top(self, term: str, k: int) -> np.ndarray:
        """(d,) mean |value| of the unit codes of the term's top-k items (cached)."""
        key = ("mean_top", term, k)
        if key not in self.ctx.cache:
            self.ctx.cache[key] = mean_rows(self.ctx.codes_unit, self.top_items(term, k))
        mean: np.ndarray = self.ctx.cache[key]
        return mean

    def b_weights(self, a: str, b: str) -> np.ndarray:
        """(d,) non-negative weights of B's dimensions, per the ``dims`` parameter.

        ``query``: B's query code restricted to its active dims (mass ``share``);
        ``items``: 1 on the paper's D_B; ``specific``: dims whose mean value over B's top-K
        items exceeds ``ratio`` x the mean over A's top-K items, weighted by that mean;
        ``bias``: the SPINE sentence bias of B's text (the query's own concept dims).
        """
        mode, share, k = self.p["dims"], self.p["share"], self.p["top_k"]
        # "query" and "bias" weights depend on B alone: computed once per (B, share)
        key = ("b_weights", mode, b, share)
        if mode in ("query", "bias") and key in self.ctx.cache:
            cached: np.ndarray = self.ctx.cache[key]
            return cached.copy()
        d = self.ctx.codes_unit.shape[1]
        w = np.zeros(d)
        if mode == "query":
            qb = np.abs(normalize_rows(self.ctx.term_code(b)))
            dims = vector_active_dims(qb, share)
            w[dims] = qb[dims]
        elif mode == "items":
            w[self.item_dims(b, k, share)] = 1.0
        elif mode == "specific":
            mb, ma = self.mean_top(b, k), self.mean_top(a, k)
            sel = mb > self.p["ratio"] * ma
            w[sel] = mb[sel]
            w /= max(float(np.linalg.norm(w)), 1e-12)
        elif mode == "bias":
            self.ctx.require("word_vectors")
            from sparsemm.words.bias import sentence_bias

            bias = sentence_bias([self.ctx.term_text(b)], self.ctx.word_vectors)
            row = np.asarray(bias.toarray(), dtype=np.float64).ravel()
            if row.shape[0] != d:
                raise SparsemmError(
                    f"SPINE vectors have {row.shape[0]} dims but the codes have {d}"
                )
            dims = vector_active_dims(row, share)
            w[dims] = row[dims]
        else:
            raise SparsemmError(f"unknown B-dimension source {mode!r}")
        if mode in ("query", "bias"):
            self.ctx.cache[key] = w.copy()
        return w


class HardFilter(TermDims):
    """cos(code(A), x), dropping items with a value > threshold on any of B's dims."""

    params: ClassVar[dict[str, Any]] = {
        "dims": "query",
        "share": 0.3,
        "top_k": 50,
        "ratio": 2.0,
        "threshold": 0.1,
    }

    def scores(self, a: str, b: str) -> np.ndarray:
        s = self.ctx.code_scores(self.ctx.term_code(a))
        dims = np.flatnonzero(self.b_weights(a, b) > 0)
        if len(dims):
            s = np.where(self.ctx.peak_over(dims, self.p["threshold"]), -np.inf, s)
        return s


register_strategy(
    "filter",
    HardFilter,
    "sparse: cos(code(A), x), drop items active on B's dims",
    grid={
        "dims": ["query", "items", "specific", "bias"],
        "share": [0.1, 0.3, 0.5],
        "threshold": [0.05, 0.1, 0.2, 0.3],
    },
)
