"""The strategy interface (:class:`Strategy`) and the ranking helpers every family uses."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.query.strategies.context import ExclusionContext

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ helpers


def top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows of the k best finite scores, best first; ties broken by the lower row."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    order = order[np.isfinite(scores[order])]
    return order[:k].astype(np.int64)


def active_dims(codes: sp.csr_matrix, rows: np.ndarray, share: float) -> np.ndarray:
    """Union over ``rows`` of each row's active dimensions (sorted int array).

    A row's active dimensions are the smallest set of its dimensions whose absolute values
    sum to at least ``share`` of the row's L1 norm (largest values first) - the SR paper's
    selection of the dimensions an item is "about" (Sec. 4.3).
    """
    out: set[int] = set()
    for r in np.asarray(rows, dtype=np.int64):
        lo, hi = codes.indptr[r], codes.indptr[r + 1]
        vals = np.abs(codes.data[lo:hi])
        if not len(vals) or vals.sum() <= 0:
            continue
        order = np.argsort(-vals, kind="stable")
        cum = np.cumsum(vals[order])
        n = int(np.searchsorted(cum, share * cum[-1] - 1e-12)) + 1
        out.update(codes.indices[lo:hi][order[:n]].tolist())
    return np.array(sorted(out), dtype=np.int64)


def vector_active_dims(vec: np.ndarray, share: float) -> np.ndarray:
    """Active dimensions (mass share ``share``) of one dense (d,) vector."""
    row = sp.csr_matrix(np.asarray(vec, dtype=np.float32)[None, :])
    return active_dims(row, np.array([0]), share)


def mean_rows(codes: sp.csr_matrix, rows: np.ndarray) -> np.ndarray:
    """(d,) float64 mean of the absolute values of ``codes[rows]``."""
    return np.asarray(abs(codes[rows]).mean(axis=0), dtype=np.float64).ravel()


def log_sigmoid(z: np.ndarray) -> np.ndarray:
    """log(sigmoid(z)), without overflow for large |z|."""
    return -np.logaddexp(0.0, -z)


# --------------------------------------------------------------------------- strategies


class Strategy(ABC):
    """Base class: ``scores(a, b)`` over all items (-inf = dropped), ``rank`` = its top k."""

    requires: ClassVar[tuple[str, ...]] = ()
    kind: ClassVar[str] = "dense"  # "dense" | "sparse": which representation it ranks with
    params: ClassVar[dict[str, Any]] = {}

    @classmethod
    def kind_of(cls, defaults: Mapping[str, Any]) -> str:
        """The representation a strategy registered with ``defaults`` ranks with."""
        return cls.kind

    def __init__(self, ctx: ExclusionContext, **params: Any) -> None:
        unknown = set(params) - set(self.params)
        if unknown:
            raise SparsemmError(
                f"{type(self).__name__} has no parameter(s) {sorted(unknown)}; it takes "
                f"{sorted(self.params) or 'none'}"
            )
        ctx.require(*self.requires)
        self.ctx = ctx
        self.p: dict[str, Any] = {**self.params, **params}

    def over(self, codes: sp.csr_matrix) -> Strategy:
        """This strategy, with its parameters, over just ``codes`` (ExclusionContext.sub)."""
        return type(self)(self.ctx.sub(codes), **self.p)

    @abstractmethod
    def scores(self, a: str, b: str) -> np.ndarray:
        """(n_items,) float64 scores for "a but not b"; -inf marks an item left out."""

    def similarity(self, term: str) -> np.ndarray:
        """(n_items,) cosine of the term's query with the items, in the strategy's space
        (sparse codes or dense embeddings)."""
        if self.kind == "sparse":
            return self.ctx.code_scores(self.ctx.term_code(term))
        assert self.ctx.items_dense is not None
        return np.asarray(self.ctx.items_dense @ self.ctx.term_embedding(term), dtype=np.float64)

    def score_query(self, include: Sequence[str], exclude: Sequence[str]) -> np.ndarray:
        """(n_items,) scores of a whole query: several include terms (read as one text,
        "cat and dog") and any number of excluded terms, or none.

        Generic rule: the include text alone when nothing is excluded (cosine in the
        strategy's space); else the worst of ``scores(a, b)`` over the excluded terms (an
        item must survive every exclusion); with nothing included, items are ranked by
        absence (minus their best similarity to an excluded term). Strategies that model a
        whole query override this (:class:`Hybrid`).
        """
        a = " and ".join(include)
        if not include:
            return -np.max(np.stack([self.similarity(b) for b in exclude]), axis=0)
        if not exclude:
            return self.similarity(a)
        return np.min(np.stack([self.scores(a, b) for b in exclude]), axis=0)

    def rank(self, a: str, b: str, k: int) -> np.ndarray:
        """Rows of the top-``k`` items, best first (fewer when items are left out)."""
        if k < 1:
            raise SparsemmError(f"k must be a positive integer, got {k}")
        return top_rows(self.scores(a, b), k)

    def prepare(self, terms: Iterable[str]) -> None:
        """Batch the text encoding of ``terms`` before many ``rank`` calls (optional)."""
        self.ctx.prefetch(terms, codes=self.kind == "sparse")

    def rank_many(self, pairs: Sequence[tuple[str, str]], k: int) -> np.ndarray:
        """(q, k) int64 rankings for many (a, b) pairs; -1 pads short rankings."""
        self.prepare({t for pair in pairs for t in pair})
        out = np.full((len(pairs), k), -1, dtype=np.int64)
        for i, (a, b) in enumerate(pairs):
            rows = self.rank(a, b, k)
            out[i, : len(rows)] = rows
        return out
