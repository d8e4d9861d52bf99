"""Ranking a parsed query: every item in memory (:func:`rank_query`), or a store's items
without reading every code (the served strategies' ``rank_store``).

:func:`score_query` scores a parsed :class:`~sparsemm.query.parse.Query` (include terms,
excluded terms, either side may be empty but not both) over the items of an
:class:`~sparsemm.query.strategies.ExclusionContext` by a registered strategy's
``score_query``; for sparse strategies an item that shares no concept dimension with the
include text's code is not a match (whatever the score scale), so it is left out.
:func:`rank_query` ranks them, ties to the lower row: strategies not served through the
index, CLIP's ``match`` and the benchmarks rank there.

How ``sparsemm search``, the web API and :class:`~sparsemm.query.searcher.Searcher` answer a
query without scoring (or loading) every item's code: the default scorer ranks a
:class:`~sparsemm.index.store.Store` with :meth:`Match.rank_store
<sparsemm.query.strategies.match.Match.rank_store>` and ``hybrid`` with :meth:`Hybrid.rank_store
<sparsemm.query.strategies.hybrid.Hybrid.rank_store>`, in the same three steps, from the
parts below:

1. **Candidates.** Each score is bounded from above by a non-decreasing function of inner
   products of the item's code with non-negative weights (codes are non-negative: checked,
   a store holding a negative value is ranked by a scan instead). The index returns the
   exact top ``n`` items of each inner product (a :class:`ProxyList`). A query vector is
   cut to its ``proxy_dims`` largest weights (:func:`cut`); the dropped weights add at most
   their L2 norm to any unit non-negative code (Cauchy-Schwarz), which is added to that
   list's bound. From an :class:`~sparsemm.index.inverted.InvertedIndex` the lists come
   from ``search_quantized``: each posting value read as one byte, every item's score
   within a returned ``err`` of its exact one, so err is added to the list's bound too.
   Such a search reads 3 bytes a posting instead of 6, and a query of a hundred dims over
   a million items reads tens of millions of postings: memory traffic is what it waits on.
2. **Rescoring.** The candidates' codes are read from the store's row store and scored by
   the full strategy (the same ``score_query`` as over every item, including the "no
   concept in common" rule), in a context of just those rows (:class:`Pool`); the hits
   keep the codes read for them, so a search reads each hit's code once.
3. **Certificate.** An item outside every list scores at most the bound the lists' n-th
   scores give. When the k-th best rescored candidate beats it (by a float32 margin) the
   result is provably the top k of ranking every item. When only the err stands in the
   way and a larger pool would need a new search, the quantised lists are searched again
   exactly at the same size. Otherwise ``n`` grows fourfold, up to ``max_candidates``,
   read from the rows each list's search already returned (``fetch`` of them:
   :func:`pool_sizes`). A pool that would pass a quarter of the items is not grown: the
   query is ranked by :func:`scan_rank`, which costs less and is exact by construction.

Queries no list can bound are ranked by scanning the store's rows in chunks (never every
code at once): exclusion-only queries (ranked by absence), detectors fitted at query time
on a reference set (older models without their own detectors) and stores holding negative
code values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.query.parse import Query
from sparsemm.query.request import DEFAULT_STRATEGY
from sparsemm.query.strategies.base import Strategy, top_rows
from sparsemm.query.strategies.context import ExclusionContext
from sparsemm.query.strategies.registry import get_strategy

if TYPE_CHECKING:
    from sparsemm.index.store import Store

# Float32 margin of the certificate, times the query vectors' L2 norms: the index sums at
# most a row's non-zeros (a few hundred) of float32 products w_d x_d, whose absolute sum is
# at most ||w|| for a unit code, so its rounding error stays below ~256 * 6e-8 * ||w||.
MARGIN = 2e-5
SCAN_ROWS = 65536  # rows per chunk when a query is ranked by scanning the row store
# Rows an index search fetches by default: the largest pool size (the first pool times a
# power of 4) within 1 / FETCH_SHARE of the items and FETCH_MAX. The heap of a larger fetch
# costs every search; a smaller one sends the queries whose pool outgrows it to a second
# search. Measured with Hybrid.rank_store alone on one core (benchmarks/two_stage.py): at 100k
# items 256 rows beat 1,024 (COCO label pairs p50 3.09 / 3.73 ms, collages 0.99 / 1.54 ms);
# at 1M, 1,024 beat 4,096 (COCO 26.7 / 29.3 ms) and 512 (mean 40.2 / 47.4 ms: more second
# searches).
FETCH_MAX = 1024
FETCH_SHARE = 500
# A pool that would grow past 1 / SCAN_SHARE of the items is replaced by the exact scan.
SCAN_SHARE = 4


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


@dataclass
class ServedResult:
    """Top hits of one query through the served path, best first."""

    rows: np.ndarray  # (k,) int64 collection rows
    scores: np.ndarray  # (k,) float64 exact scores of the strategy
    candidates: int  # rows rescored (the last round's pool, or every row for a scan)
    certified: bool  # provably the brute-force top k (always True for a scan)
    rounds: int  # pool sizes tried (0: scanned)
    mode: str  # "two-stage" | "unit lists" | "scan"
    searches: int  # index searches run (each list is searched again only past `fetch`)
    # (k, dim) sorted CSR codes of ``rows``: those read to rescore them (none is read twice)
    codes: sp.csr_matrix


def cut(v: np.ndarray, proxy_dims: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(dims, weights, residual) of the positive part of ``v``: its ``proxy_dims`` largest
    weights and the L2 norm of those left out (the most they add to a unit non-negative
    code's inner product, by Cauchy-Schwarz). v+ . x >= v . x for any x >= 0."""
    v = np.maximum(v, 0.0)
    nz = np.flatnonzero(v)
    keep = nz[np.argsort(-np.abs(v[nz]), kind="stable")[:proxy_dims]]
    rest = np.ones(len(v), dtype=bool)
    rest[keep] = False
    residual = float(np.linalg.norm(v[rest]))
    keep = np.sort(keep)
    return keep.astype(np.int64), v[keep].astype(np.float32), residual


class ProxyList:
    """One linear upper bound's index search (dims, weights; residual and constant added to
    its bound), fetched once with ``fetch`` rows and read by prefixes as the pool grows: the
    top ``n`` of a top ``K`` list (K >= n) is its first n rows, so a larger pool needs no new
    search until it passes K (an index search costs about the same for k = 256 as for
    k = 4096: the scan over the posting lists dominates, not the heap)."""

    def __init__(self, dims: np.ndarray, w: np.ndarray, residual: float, const: float) -> None:
        self.dims, self.w, self.extra = dims, w, residual + const
        self.rows = np.zeros(0, np.int64)
        self.scores = np.zeros(0, np.float64)
        self.asked = 0  # k of the last search (0: not searched yet)
        self.err = 0.0  # most an item's score in the search differs from its exact one
        self.used_err = 0.0  # the err in the bound top() last returned
        self.quantized = True  # searches with search_quantized (exact for Qdrant: err 0)
        self.searches = 0

    def top(self, source: Store, n: int, fetch: int, cap: int) -> tuple[np.ndarray, float]:
        """(rows, bound): the top ``n`` rows by the inner product, and the largest value of
        this bound for an item outside them: the n-th score plus residual and constant;
        -inf when they are every item; the constant alone (score 0) when the source returned
        fewer (a :class:`~sparsemm.index.store.Store` may leave out items scoring <= 0, as
        Qdrant does, so every item it left out scores <= 0). The first search fetches
        ``fetch`` rows; a pool that outgrows them is searched again once, for ``cap`` rows
        (the largest pool)."""
        total = len(source)
        if not len(self.dims):  # the proxy is 0 for every item
            rows = np.arange(min(n, total), dtype=np.int64)
            return rows, (-np.inf if n >= total else self.extra)
        if self.asked < n and len(self.rows) >= self.asked:  # the fetched rows run out
            self.asked = max(n, cap if self.searches else fetch)
            self._search(source)
        self.used_err = 0.0
        if len(self.rows) >= total and n >= len(self.rows):
            return self.rows, -np.inf
        if len(self.rows) < n:  # the source had no more rows with a positive score
            return self.rows, self.extra
        self.used_err = self.err
        return self.rows[:n], float(self.scores[n - 1]) + self.extra + self.err

    def _search(self, source: Store) -> None:
        if self.quantized:
            # the inverted index reads one byte per posting value: scores within err of the
            # exact ones, so the bound adds err (rows are all the served path reads)
            res, self.err = source.search_quantized((self.dims, self.w), k=self.asked)
        else:
            res, self.err = source.search((self.dims, self.w), k=self.asked, with_ids=False), 0.0
        self.rows = np.asarray(res.rows, dtype=np.int64)
        self.scores = np.asarray(res.scores, dtype=np.float64)
        self.searches += 1

    def exact(self, source: Store) -> None:
        """Search again, exactly, for the same rows: when only the quantised search's err
        kept the last bound from certifying the result."""
        self.quantized = False
        self._search(source)


def _rescore(
    source: Store, strat: Strategy, query: Query, rows: np.ndarray
) -> tuple[np.ndarray, sp.csr_matrix]:
    """(len(rows),) exact scores of ``rows`` (ascending) by the full strategy, and the codes
    read for them."""
    codes = source.codes(rows)
    sub = strat.over(codes)
    return score_query(sub.ctx, query, sub), codes


def check_pool(k: int, offset: int, candidates: int, max_candidates: int) -> None:
    """SparsemmError for a page or a candidate pool a served ranking cannot take."""
    if k < 1 or offset < 0:
        raise SparsemmError("k must be >= 1 and offset >= 0")
    if candidates < 1 or max_candidates < candidates:
        raise SparsemmError("need 1 <= candidates <= max_candidates")


def pool_sizes(total: int, n: int, fetch: int | None, cap: int) -> tuple[int, int]:
    """(fetch, cap) for a first pool of ``n`` of ``total`` items: the rows each index search
    returns (None: a pool size n, 4n, ... within 1 / FETCH_SHARE of the items and FETCH_MAX,
    so a grown pool ends where a fetch does) and the largest pool (``cap`` = max_candidates
    at most), which a list past its fetched rows is searched once more for."""
    if fetch is None:
        fetch = n
        while fetch * 4 <= min(FETCH_MAX, total // FETCH_SHARE):
            fetch *= 4
    return max(fetch, n), max(n, min(cap, total // SCAN_SHARE))


class Pool:
    """A served ranking's candidates: the rows rescored so far (ascending, as over every
    item: ties in ``top_rows`` go to the lower row), their exact scores, ``top`` (the
    positions of the best ``want``, best first), and the codes of the top's rows in that
    order, kept from the rescoring read so the hits carry their codes back (read once a
    search). A row below the top ``want`` stays below as rows join, so only the top's codes
    are kept."""

    def __init__(self, dim: int, want: int) -> None:
        self.want = want
        self.rows = np.zeros(0, np.int64)
        self.scores = np.zeros(0)
        self.top = np.zeros(0, np.int64)
        self._codes = sp.csr_matrix((0, dim), dtype=np.float32)  # of rows[top], in order

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def kth(self) -> float:
        """The ``want``-th best exact score so far; -inf while fewer are finite."""
        return float(self.scores[self.top[-1]]) if len(self.top) == self.want else -np.inf

    def add(self, source: Store, strat: Strategy, query: Query, rows: np.ndarray) -> None:
        """Rescore the rows of ``rows`` not among the candidates yet and merge them in."""
        new = np.setdiff1d(rows, self.rows)  # sorted, unique
        if not len(new):
            return
        scores, codes = _rescore(source, strat, query, new)
        held = np.concatenate([self.rows[self.top], new])  # the rows whose codes are here
        r = np.concatenate([self.rows, new])
        order = np.argsort(r, kind="stable")
        self.rows, self.scores = r[order], np.concatenate([self.scores, scores])[order]
        self.top = top_rows(self.scores, self.want)
        codes = sp.vstack([self._codes, codes], format="csr")
        self._codes = codes[_positions(held, self.rows[self.top])]  # within old top and new

    def served(
        self, certified: bool, rounds: int, mode: str, searches: int, offset: int
    ) -> ServedResult:
        """The result: the top after ``offset``, with the codes of its rows."""
        top = self.top[offset:]
        codes = sp.csr_matrix(self._codes[offset:])
        codes.sort_indices()
        return ServedResult(
            self.rows[top], self.scores[top], len(self), certified, rounds, mode, searches, codes
        )


def _positions(among: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Where each of ``rows`` is in ``among`` (every one of them is there once)."""
    order = np.argsort(among, kind="stable")
    return order[np.searchsorted(among, rows, sorter=order)]


def scan_rank(
    source: Store,
    ctx: ExclusionContext,
    query: Query,
    strategy: str | Strategy = "hybrid",
    k: int = 10,
    offset: int = 0,
    chunk: int = SCAN_ROWS,
    **params: Any,
) -> ServedResult:
    """Rank every row by reading the row store ``chunk`` rows at a time: exact, memory
    O(chunk), for queries the candidate bound does not cover."""
    strat = build_strategy(ctx, strategy, **params)
    want = offset + k
    best_rows = np.zeros(0, np.int64)
    best_scores = np.zeros(0)
    best_codes = sp.csr_matrix((0, source.dim), dtype=np.float32)
    n = len(source)
    for lo in range(0, n, chunk):
        rows = np.arange(lo, min(lo + chunk, n), dtype=np.int64)
        s, codes = _rescore(source, strat, query, rows)
        top = top_rows(s, want)
        r = np.concatenate([best_rows, rows[top]])
        v = np.concatenate([best_scores, s[top]])
        # ties go to the lower row: order by (-score, row)
        keep = np.lexsort((r, -v))[:want]
        best_rows, best_scores = r[keep], v[keep]
        best_codes = sp.vstack([best_codes, codes[top]], format="csr")[keep]
    sel = np.flatnonzero(np.isfinite(best_scores))[offset:]
    best_codes = sp.csr_matrix(best_codes[sel])
    best_codes.sort_indices()
    return ServedResult(best_rows[sel], best_scores[sel], n, True, 0, "scan", 0, best_codes)
