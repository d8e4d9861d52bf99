"""Sparse-code strategies: code similarity, code arithmetic, the SR paper's two-step, the
hard filter and the soft penalty on an excluded term's dimensions.
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


class CodeA(Strategy):
    """cos(code(A), x) over the sparse codes: A alone."""

    requires = ("codes", "text_encoder", "query_coder")
    kind = "sparse"

    def scores(self, a: str, b: str) -> np.ndarray:
        return self.ctx.code_scores(self.ctx.term_code(a))


class CodeArith(Strategy):
    """cos(code(A)/|code(A)| - w code(B)/|code(B)|, x) over the sparse codes."""

    requires = ("codes", "text_encoder", "query_coder")
    kind = "sparse"
    params: ClassVar[dict[str, Any]] = {"w": 0.5}

    def scores(self, a: str, b: str) -> np.ndarray:
        qa, qb = normalize_rows(self.ctx.term_code(a)), normalize_rows(self.ctx.term_code(b))
        return np.asarray(self.ctx.codes_unit @ (qa - self.p["w"] * qb), dtype=np.float64)


class _TermDims(Strategy):
    """Shared machinery: a term's top-K items and the dimension sets built from them."""

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


class PaperTwoStep(_TermDims):
    """SR paper Sec. 4.3: D = D_A minus D_B; rank by mass on D (see module docstring)."""

    params: ClassVar[dict[str, Any]] = {"top_k": 50, "share": 0.5, "pool": "topk"}

    def scores(self, a: str, b: str) -> np.ndarray:
        k, share = self.p["top_k"], self.p["share"]
        da, db = self.item_dims(a, k, share), self.item_dims(b, k, share)
        mass = self.ctx.mass_on(np.setdiff1d(da, db))
        sim = self.ctx.code_scores(self.ctx.term_code(a))
        # Lexicographic (mass on D, then A's similarity): sim is a cosine in [-1, 1].
        score = mass * 4.0 + (sim + 1.0) / 2.0
        if self.p["pool"] == "topk":
            out = np.full(self.ctx.n_items, -np.inf)
            pool = self.top_items(a, k)
            out[pool] = score[pool]
            return out
        if self.p["pool"] != "all":
            raise SparsemmError(f"pool must be 'topk' or 'all', got {self.p['pool']!r}")
        return score


class HardFilter(_TermDims):
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


class SoftPenalty(_TermDims):
    """cos(code(A), x) - lam * sum_j b_j x_j over B's dims (weights from ``b_weights``)."""

    params: ClassVar[dict[str, Any]] = {
        "dims": "specific",
        "share": 0.5,
        "top_k": 50,
        "ratio": 2.0,
        "lam": 1.0,
    }

    def scores(self, a: str, b: str) -> np.ndarray:
        s = self.ctx.code_scores(self.ctx.term_code(a))
        w = self.b_weights(a, b)
        w = w / max(float(np.linalg.norm(w)), 1e-12)
        pen = np.asarray(self.ctx.codes_unit @ w, dtype=np.float64).ravel()
        return s - self.p["lam"] * pen


register_strategy("code_a", CodeA, "sparse: cos(code(A), x), B ignored (reference)")
register_strategy(
    "paper",
    PaperTwoStep,
    "sparse: SR paper two-step, re-rank A's top-K by mass on D_A minus D_B",
    grid={"top_k": [10, 25, 50, 100], "share": [0.3, 0.5, 0.7, 0.9], "pool": ["topk", "all"]},
)
register_strategy(
    "code_arith",
    CodeArith,
    "sparse: cos(code(A) - w code(B), x)",
    grid={"w": [0.25, 0.5, 0.75, 1.0, 1.5]},
)
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
register_strategy(
    "penalty",
    SoftPenalty,
    "sparse: cos(code(A), x) - lam * (x on B's dims)",
    grid={
        "dims": ["specific", "query", "bias"],
        "ratio": [1.0, 2.0, 4.0],
        "lam": [0.25, 0.5, 1.0, 2.0],
    },
)
