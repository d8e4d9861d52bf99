"""What a store backend that scores elsewhere needs to give the inverted index's exact
results (:class:`~sparsemm.index.qdrant.QdrantStore` over Qdrant): exact float32 scoring of
candidate rows as the inverted index's kernel sums them, the checked form of a sparse query
and its exclusion plan, top-k selection with the index's tie rule, and the check of batch
sizes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from numba import njit

from sparsemm.errors import SparsemmError
from sparsemm.index.inputs import (
    Exclusion,
    Plan,
    QueryLike,
    SearchResult,
    as_query,
    plan_exclusion,
)

U32 = 2.0**-24  # unit roundoff of float32


# --------------------------------------------------------------------------------------------
# Exact scoring as the inverted index's kernel does it
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def sparse_rescore(
    qdims: np.ndarray, qw: np.ndarray, indptr: np.ndarray, idx: np.ndarray, vals: np.ndarray
) -> np.ndarray:  # pragma: no cover - numba
    """Scores (n,) f32 of CSR rows, accumulated exactly as the inverted index's kernel does:
    float32, terms added in query order (query dims ascending, then penalty dims)."""
    n = indptr.shape[0] - 1
    out = np.zeros(n, np.float32)
    for r in range(n):
        lo = indptr[r]
        hi = indptr[r + 1]
        acc = np.float32(0.0)
        for j in range(qdims.shape[0]):
            d = qdims[j]
            a, b = lo, hi
            while a < b:  # rows' dims are ascending: binary search
                m = (a + b) >> 1
                if idx[m] < d:
                    a = m + 1
                else:
                    b = m
            if a < hi and idx[a] == d:
                acc += qw[j] * vals[a]
        out[r] = acc
    return out


def sparse_query_terms(query: QueryLike, exclude: Exclusion | None, dim: int) -> QueryTerms:
    """Normalise a sparse query and exclusion exactly as :class:`InvertedIndex` does."""
    dims, w = as_query(query, dim)
    plan = plan_exclusion(exclude, dim)
    terms_d, terms_w = dims, w
    if plan.extra_dims.size:
        terms_d = np.concatenate([dims, plan.extra_dims])
        terms_w = np.concatenate([w, plan.extra_w])
    return QueryTerms(dims=dims, w=w, terms_dims=terms_d, terms_w=terms_w, plan=plan)


class QueryTerms:
    """A checked sparse query: its own (dims, w), all scored terms and the exclusion plan."""

    __slots__ = ("dims", "plan", "terms_dims", "terms_w", "w")

    def __init__(
        self,
        dims: np.ndarray,
        w: np.ndarray,
        terms_dims: np.ndarray,
        terms_w: np.ndarray,
        plan: Plan,
    ) -> None:
        self.dims, self.w = dims, w
        self.terms_dims, self.terms_w = terms_dims, terms_w
        self.plan = plan

    def merged(self) -> tuple[list[int], list[float]]:
        """One weight per dim (query + penalty terms summed): the vector sent to an engine."""
        uniq, inv = np.unique(self.terms_dims, return_inverse=True)
        w = np.bincount(inv, weights=self.terms_w.astype(np.float64), minlength=len(uniq))
        keep = w != 0
        return uniq[keep].tolist(), w[keep].tolist()

    def error_bound(self, max_norm: float) -> float:
        """Bound on |engine score - exact float32 score| for any item of norm <= max_norm.

        Both are float sums of at most m products (weights rounded to float32 or not), each
        within gamma_m * sum_t |w_t x_t| of the real value, and sum_t |w_t x_t| <=
        ||w||_1 * max_d |x_d| <= ||w||_1 * ||x||_2 (a dim may appear in several terms);
        doubled for margin.
        """
        m = len(self.terms_w) + 2
        w1 = float(np.abs(self.terms_w.astype(np.float64)).sum())
        return 4.0 * m * U32 * w1 * max_norm + 1e-30


def top_k_pairs(rows: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (score desc, row asc) of parallel arrays."""
    if len(rows) > k:
        part = np.argpartition(-scores, k - 1)[:k]
        kth = scores[part].min()
        # every row tying with the k-th score competes on its row number
        cand = np.flatnonzero(scores >= kth)
        rows, scores = rows[cand], scores[cand]
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]


def ranked(
    rows: np.ndarray, scores: np.ndarray, k: int, ids: Sequence[str] | Mapping[int, str]
) -> SearchResult:
    """The top k of parallel (rows, scores) (:func:`top_k_pairs`), with ``ids[row]`` as ids."""
    top_rows, top_scores = top_k_pairs(rows, scores, k)
    return SearchResult(rows=top_rows, ids=[ids[r] for r in top_rows.tolist()], scores=top_scores)


def iter_batches(n: int, batch_size: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) bounds of consecutive batches covering n items."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SparsemmError(f"batch_size must be a positive integer, got {batch_size!r}")
    for lo in range(0, n, batch_size):
        yield lo, min(n, lo + batch_size)
