"""Ranking: every item (:func:`rank_query`), or the served scorer through the inverted index.

:func:`score_query` scores a parsed :class:`~sparsemm.query.parse.Query` (include terms,
excluded terms, either side may be empty but not both) over the items of an
:class:`~sparsemm.query.strategies.ExclusionContext` by a registered strategy's
``score_query``; for sparse strategies an item that shares no concept dimension with the
include text's code is not a match (whatever the score scale), so it is left out.
:func:`rank_query` ranks them, ties to the lower row: strategies not served through the
index, CLIP's ``match`` and the benchmarks rank there. The served path below rescores its
candidates with the same scores and is tested equal to it.

How ``sparsemm search``, the web API and :class:`~sparsemm.query.searcher.Searcher` answer a
query without scoring (or loading) every item's code. The default scorer, ``match``, is
served by :func:`served_match`: an include term's probability is bounded from its units'
lists (:mod:`sparsemm.query.unit_lists`, computed when an SR index is built), with the
include text's code list bounding the tie-break of the top 1% step, or, without them, by
non-decreasing functions of inner products with non-negative weights (the code lists of
:class:`~sparsemm.query.scorers.TermBound`); it is always exact (a result no pool proves is
ranked by a scan). :func:`count_matches` counts the items above a threshold the same way.
The rest of this docstring describes :func:`served_rank`, which serves ``hybrid`` (and
whose candidate lists, rescoring and certificate ``served_match`` shares).

The hybrid score of an item with unit code x (:class:`~sparsemm.query.strategies.Hybrid`)::

    s(x) = A(x) + delta sum_{t in T} log sigma(z_t(x)) + beta sum_j log(1 - P(B_j | x) / c_j)
    A(x) = v_A . x,   v_A = alpha q_I - gamma sum_j q_{B_j}      (q: unit query codes)
    z_t(x) = w_t . x + b_t                                        (detector logits of T)

Every log term is <= 0 and log sigma(z) <= min(0, z), so with P(x) = A(x) + delta sum_t z_t(x)
(linear in x)::

    s(x) <= min(A(x), P(x))

1. **Candidates.** The index returns the exact top ``n`` items by ``A+`` and (when an include
   term has a detector) the top ``n`` by ``P+``: the inner products of the stored unit codes
   with the positive parts of v_A and v_P. Codes are non-negative (checked: a store holding
   a negative value is ranked by a scan instead), so A <= A+ and P <= P+, and the negative
   weights (the excluded terms' codes in A, a detector's negative weights in P) need not
   be read, which makes each index search cheaper. A query vector is then cut to its
   ``proxy_dims`` largest weights; the dropped weights add at most their L2 norm to any
   unit non-negative code (Cauchy-Schwarz), which is added to that list's bound. From an
   :class:`~sparsemm.index.inverted.InvertedIndex` the lists come from
   ``search_quantized``: each posting value read as one byte, every item's score within a
   returned ``err`` of its exact one, so err is added to the list's bound too. Such a
   search reads 3 bytes a posting instead of 6, and a query of a hundred dims over a
   million items reads tens of millions of postings: memory traffic is what it waits on.
2. **Rescoring.** The candidates' codes are read from the index's memory-mapped row store and
   scored by the full strategy (the same ``score_query`` as brute force, including the "no
   concept in common" rule), in a context of just those rows.
3. **Certificate.** An item outside both lists scores at most
   ``bound = min(a_n + r_A, p_n + r_P)``, where a_n and p_n are the n-th scores of the two
   lists and r their residuals (P's with its bias; each with its search's err). When the
   k-th best rescored candidate beats ``bound`` (by a float32 margin) the result is
   provably the brute-force top k. When only the err stands in the way and a larger pool
   would need a new search, the quantised lists are searched again exactly at the same
   size. Otherwise ``n`` grows fourfold, up to ``max_candidates``, read from the rows each
   list's search already returned (``fetch`` of them: the first pool size, or from 512k
   items the second, 1,024; a larger heap slows every search, a smaller one sends more
   queries to a second search). While the first list's grown pool still lies within its
   fetched rows, the second list is not searched yet: rescoring costs less than a
   search. A result that is still not certified is returned with
   ``certified=False`` (counted by ``benchmarks/two_stage.py``). A pool that would pass a
   quarter of the items is not grown: the query is ranked by the exact scan below, which
   costs less.

Queries this cannot bound are ranked by scanning the index's row store in chunks (never
every code at once): exclusion-only queries (ranked by absence), detectors fitted at
query time on a reference set (older models without their own detectors) and stores
holding negative code values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.index.store import Store
from sparsemm.linalg import normalize_rows
from sparsemm.query.parse import Query
from sparsemm.query.request import DEFAULT_STRATEGY
from sparsemm.query.strategies import ExclusionContext, Hybrid, Strategy, get_strategy, top_rows

# Float32 margin of the certificate, times the query vectors' L2 norms: the index sums at
# most a row's non-zeros (a few hundred) of float32 products w_d x_d, whose absolute sum is
# at most ||w|| for a unit code, so its rounding error stays below ~256 * 6e-8 * ||w||.
_MARGIN = 2e-5
SCAN_ROWS = 65536  # rows per chunk when a query is ranked by scanning the row store
# Rows an index search fetches by default: the largest pool size (the first pool times a
# power of 4) within 1 / FETCH_SHARE of the items and FETCH_MAX. The heap of a larger fetch
# costs every search; a smaller one sends the queries whose pool outgrows it to a second
# search. Measured with served_rank alone on one core (benchmarks/two_stage.py): at 100k
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
    mode: str  # "two-stage" | "scan"
    searches: int = 0  # index searches run (each list is searched again only past `fetch`)


def bounded(strat: Strategy, query: Query) -> bool:
    """True when :func:`served_rank` can certify ``query`` from index candidates."""
    if not isinstance(strat, Hybrid) or strat.p["features"] != "codes" or not query.include:
        return False
    # Query-time detector fits read every reference item; the model's own are linear.
    return strat.model_detectors is not None or strat.ctx.reference is None


def _unit(v: np.ndarray) -> np.ndarray:
    return np.asarray(normalize_rows(np.asarray(v, dtype=np.float32)), dtype=np.float64)


def proxy_vectors(strat: Hybrid, query: Query) -> tuple[np.ndarray, np.ndarray | None, float]:
    """(v_A (d,), v_P (d,) or None, bias of P): the two linear upper bounds of the module
    docstring. v_P is None when no include term has a detector (then s <= A alone)."""
    ctx, p = strat.ctx, strat.p
    alpha, detected = strat.include_alpha(query.include)
    va = alpha * _unit(ctx.term_code(query.include_text))
    if p["gamma"]:
        for b in query.exclude:
            va = va - p["gamma"] * _unit(ctx.term_code(b))
    if not (p["delta"] and detected):
        return va, None, 0.0
    # Only a model's detectors are linear in the code (see :func:`bounded`): a context
    # without them and without a reference set has no detected terms.
    model = strat.model_detectors
    assert model is not None
    vp = va.copy()
    bias = 0.0
    for t in detected:
        w_t, b_t, _ = model.column(t)
        vp = vp + p["delta"] * np.asarray(w_t, dtype=np.float64)
        bias += p["delta"] * b_t
    return va, vp, float(bias)


def _cut(v: np.ndarray, proxy_dims: int) -> tuple[np.ndarray, np.ndarray, float]:
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


class _ProxyList:
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


def _rescore(source: Store, strat: Strategy, query: Query, rows: np.ndarray) -> np.ndarray:
    """(len(rows),) exact scores of ``rows`` (ascending) by the full strategy."""
    sub = strat.over(source.codes(rows))
    return score_query(sub.ctx, query, sub)


def _pool_sizes(total: int, n: int, fetch: int | None, cap: int) -> tuple[int, int]:
    """(fetch, cap) for a first pool of ``n`` of ``total`` items: the rows each index search
    returns (None: a pool size n, 4n, ... within 1 / FETCH_SHARE of the items and FETCH_MAX,
    so a grown pool ends where a fetch does) and the largest pool (``cap`` = max_candidates
    at most), which a list past its fetched rows is searched once more for."""
    if fetch is None:
        fetch = n
        while fetch * 4 <= min(FETCH_MAX, total // FETCH_SHARE):
            fetch *= 4
    return max(fetch, n), max(n, min(cap, total // SCAN_SHARE))


def served_rank(
    source: Store,
    ctx: ExclusionContext,
    query: Query,
    strategy: str = "hybrid",
    k: int = 10,
    offset: int = 0,
    candidates: int = 256,
    max_candidates: int = 65536,
    proxy_dims: int = 256,
    fetch: int | None = None,
    nonnegative: bool | None = None,
    **params: Any,
) -> ServedResult:
    """Top ``k`` items after ``offset`` of ``query``, as ``rank_query`` over every item
    would rank them (see the module docstring). ``ctx`` supplies the encoders, text caches
    and model detectors; its own items are not read. ``candidates``: the first pool per
    list, grown fourfold up to ``max_candidates`` until the result is certified; ``fetch``:
    rows each index search returns, so the pool grows within them before a list is searched
    again, once, for the largest pool (None: the largest pool size within 0.2% of the items and
    :data:`FETCH_MAX`, at least the first pool).
    ``nonnegative``: whether the source's
    codes have no negative value (None: ask the source, ``source.nonnegative``; a source
    that cannot vouch is scanned)."""
    if k < 1 or offset < 0:
        raise SparsemmError("k must be >= 1 and offset >= 0")
    if candidates < 1 or max_candidates < candidates:
        raise SparsemmError("need 1 <= candidates <= max_candidates")
    strat = build_strategy(ctx, strategy, **params)
    want = offset + k
    if nonnegative is None:
        nonnegative = source.nonnegative
    if not (nonnegative and bounded(strat, query)):
        return scan_rank(source, ctx, query, strat, k, offset)
    assert isinstance(strat, Hybrid)
    va, vp, bias = proxy_vectors(strat, query)
    lists = [_ProxyList(*_cut(va, proxy_dims), 0.0)]
    if vp is not None:
        lists.append(_ProxyList(*_cut(vp, proxy_dims), bias))
    norms = float(np.linalg.norm(va)) + (float(np.linalg.norm(vp)) if vp is not None else 0.0)
    margin = _MARGIN * (1.0 + norms)
    n = max(candidates, want)
    fetch, cap = _pool_sizes(len(source), n, fetch, max_candidates)
    rounds = 0
    cand = np.zeros(0, np.int64)  # rows rescored so far (every round's lists), ascending
    scores = np.zeros(0)
    while True:
        rounds += 1
        # The lists are searched one at a time: when the first (A) already certifies the
        # result, the second index search is skipped (on the collages A alone certifies 88
        # of 90 label pairs at 100k items: the detector logits make P's bound loose).
        bound = np.inf
        bound_exact = np.inf  # the same without the quantised searches' err
        grow = min(n * 4, max_candidates)
        last = n >= max_candidates or n >= len(source)  # the pool cannot grow
        for i, plist in enumerate(lists):
            if i and not plist.searches and not last and lists[0].asked >= grow:
                # The first list's pool can still grow within the rows it fetched, which
                # costs rescoring only; this list's first search costs a scan of its
                # posting lists. So the pool grows first (1M COCO label pairs: A at 1,024
                # rows mostly certifies what A at 256 did not).
                break
            rows, list_bound = plist.top(source, n, fetch, cap)
            bound = min(bound, list_bound)
            bound_exact = min(bound_exact, list_bound - plist.used_err)
            cand, scores = _add_rows(source, strat, query, cand, scores, rows)
            top = top_rows(scores, want)  # finite scores only
            kth = float(scores[top[-1]]) if len(top) == want else -np.inf
            certified = bool(bound == -np.inf or kth > bound + margin)
            if certified:
                break
        err_lists = [p for p in lists if p.used_err > 0 and p.quantized]
        if (
            not certified
            and err_lists
            and kth > bound_exact + margin
            and (last or any(grow > p.asked for p in err_lists))
        ):
            # The err alone stood in the way, and a larger pool would need a new search (or
            # there is none): the same pool from exact searches costs less (no larger
            # search, 4x fewer rows to rescore). A quantised n-th score is within err of
            # the exact one, so this is a guess; a result still not certified grows its
            # pool as usual. A larger pool within the rows already fetched is only
            # rescoring, so that one grows.
            for plist in err_lists:
                plist.exact(source)
            rounds -= 1
            continue
        if certified or n >= max_candidates or n >= len(source):
            top = top[offset:]
            searches = sum(p.searches for p in lists)
            return ServedResult(
                cand[top], scores[top], len(cand), certified, rounds, "two-stage", searches
            )
        n = min(n * 4, max_candidates)
        if n * SCAN_SHARE >= len(source):
            # rescoring a quarter of the items costs about what reading them all does, and
            # the scan is exact by construction (no certificate needed)
            return scan_rank(source, ctx, query, strat, k, offset)


def served_match(
    source: Store,
    ctx: ExclusionContext | Strategy,
    query: Query,
    k: int = 10,
    offset: int = 0,
    candidates: int = 256,
    max_candidates: int = 65536,
    proxy_dims: int = 256,
    fetch: int | None = None,
    nonnegative: bool | None = None,
    unit_lists: Any = None,
    **params: Any,
) -> ServedResult:
    """Top ``k`` items after ``offset`` by the match scorer (their rank keys as scores), as
    ranking every item would give them. ``ctx``: the text context, or the match scorer
    already built over it (then without ``params``).

    With ``unit_lists`` (:class:`~sparsemm.query.unit_lists.UnitLists` of the model's
    detectors over this index) an include term read through detectors is bounded by its
    units' lists first, which are exact: see :func:`_served_units`. When those do not
    certify the result, every row is scanned; when the query has no such term, the code
    lists below are used.

    The match probability is at most that of any one include term, and the term scorer
    bounds a term's probability by a non-decreasing function of a few inner products of
    the code with non-negative weights (:class:`~sparsemm.query.scorers.TermBound`: one
    per detector of a concept, or the photo model's class and face units). So the include
    term with the fewest such lists is searched: each list's top ``n`` rows come from the
    index, every row in any list is rescored exactly, and an item in none of them has a
    match probability of at most value(n-th score + residual + err of each list), hence a
    rank key of at most :meth:`~sparsemm.query.strategies.match.Match.key_bound` of it.
    When the k-th rescored key beats that the result is certified; else the pool grows
    fourfold, as for ``hybrid`` (:func:`served_rank`), up to a scan of the row store. A
    result that the largest pool (``max_candidates``) does not prove is ranked by the scan
    too, so a served match is always exact ("A but not B" where nearly every A has B, whose
    top k sit deep below the lists' bounds). Exclusion-only queries, negative codes and
    terms without a bound are scanned.
    """
    from sparsemm.query.strategies.match import Match

    if k < 1 or offset < 0:
        raise SparsemmError("k must be >= 1 and offset >= 0")
    if isinstance(ctx, Strategy) and params:
        raise SparsemmError("pass parameters with a context, not with a built match scorer")
    strat = ctx if isinstance(ctx, Strategy) else build_strategy(ctx, "match", **params)
    assert isinstance(strat, Match)
    units = _listed_units(strat, query) if unit_lists is not None else None
    if units is not None:
        res = _served_units(source, query, strat, units, unit_lists, k, offset, candidates,
                            proxy_dims, fetch, max_candidates)  # fmt: skip
        # the unit lists bound P exactly and the code lists only looser: a pool of these
        # that proves what those did not would be near a scan's cost anyway
        return res if res is not None else scan_rank(source, strat.ctx, query, strat, k, offset)
    if nonnegative is None:
        nonnegative = source.nonnegative
    bound = _match_bound(strat, query) if nonnegative and query.include else None
    if bound is None:
        return scan_rank(source, strat.ctx, query, strat, k, offset)
    return _served_codes(source, strat, query, bound, k, offset, candidates, max_candidates,
                         proxy_dims, fetch)  # fmt: skip


def _served_codes(
    source: Store,
    strat: Any,
    query: Query,
    bound: Any,
    k: int,
    offset: int,
    candidates: int,
    max_candidates: int,
    proxy_dims: int,
    fetch: int | None,
) -> ServedResult:
    """:func:`served_match` from the code lists of one include term's probability ``bound``
    (a :class:`~sparsemm.query.scorers.TermBound`): pools grown fourfold until the k-th
    rescored key beats the key bound of an item outside them, else a scan."""
    want = offset + k
    # the tie-break is at most the include text's code similarity (times prod (1 - P(b))):
    # when that text is the bounded term itself, its lists bound the tie too
    cosine = bound.cosine if len(query.include) == 1 else None

    def key_of(list_bounds: list[float]) -> float:
        s = [max(0.0, b) for b in list_bounds]
        return strat.key_bound(bound.value(s), cosine(s) if cosine is not None else 1.0)

    norm = float(getattr(strat.scorer, "code_norm", 1.0))
    lists = []
    for w in bound.weights:
        dims, vals, residual = _cut(np.asarray(w, dtype=np.float64), proxy_dims)
        lists.append(_ProxyList(dims, vals, residual * norm, 0.0))
    n = max(candidates, want)
    fetch, cap = _pool_sizes(len(source), n, fetch, max_candidates)
    margin = 1e-7
    rounds = 0
    cand = np.zeros(0, np.int64)
    scores = np.zeros(0)
    while True:
        rounds += 1
        per_list = []
        exact_per_list = []
        every = False  # some list returned every item: nothing lies outside
        for plist in lists:
            rows, list_bound = plist.top(source, n, fetch, cap)
            if list_bound == -np.inf:
                every = True
            per_list.append(list_bound)
            exact_per_list.append(list_bound - plist.used_err)
            cand, scores = _add_rows(source, strat, query, cand, scores, rows)
        top = top_rows(scores, want)
        kth = float(scores[top[-1]]) if len(top) == want else -np.inf
        if every:
            key_bound = -np.inf
        else:
            key_bound = key_of(per_list)
        certified = bool(key_bound == -np.inf or kth > key_bound + margin)
        last = n >= max_candidates or n >= len(source)
        if not certified and not every:
            exact_bound = key_of(exact_per_list)
            err_lists = [p for p in lists if p.used_err > 0 and p.quantized]
            grow = min(n * 4, max_candidates)
            if (
                err_lists
                and kth > exact_bound + margin
                and (last or any(grow > p.asked for p in err_lists))
            ):
                for plist in err_lists:  # only the quantised searches' err stood in the way
                    plist.exact(source)
                rounds -= 1
                continue
        if not certified and n >= len(source):
            # every row was asked for and some were not returned (a store leaves out rows
            # with no positive score), yet they may still score: a scan is exact
            return scan_rank(source, strat.ctx, query, strat, k, offset)
        if not certified and last:
            # the largest pool did not prove the top k: the scan is exact (a served match
            # is never returned unproven)
            return scan_rank(source, strat.ctx, query, strat, k, offset)
        if certified:
            top = top[offset:]
            searches = sum(p.searches for p in lists)
            return ServedResult(
                cand[top], scores[top], len(cand), certified, rounds, "two-stage", searches
            )
        n = min(n * 4, max_candidates)
        if n * SCAN_SHARE >= len(source):
            return scan_rank(source, strat.ctx, query, strat, k, offset)


def _listed_units(strat: Any, query: Query) -> list[tuple[int, float]] | None:
    """The (unit, weight) pairs of the include concept read through the fewest detector
    units (P(match) <= P(concept) = max_u weight_u P(u | x)); None when no include term is
    read through an SR model's detectors."""
    from sparsemm.query.scorers import DetectorScorer

    if not isinstance(strat.scorer, DetectorScorer):
        return None
    best: list[tuple[int, float]] | None = None
    for t in query.include:
        reading = strat.reading(t)
        if reading.kind != "concepts":
            continue
        for c in reading.concepts:
            units = [(int(u), float(w)) for u, w in c.units]
            if units and (best is None or len(units) < len(best)):
                best = units
    return best


def _served_units(
    source: Store,
    query: Query,
    strat: Any,
    units: list[tuple[int, float]],
    lists: Any,
    k: int,
    offset: int,
    candidates: int,
    proxy_dims: int = 256,
    fetch: int | None = None,
    max_candidates: int = 65536,
) -> ServedResult | None:
    """The top ``k`` after ``offset`` from the unit lists of one include concept: the first
    ``n`` rows of each unit's list are rescored exactly; an item outside all of them has
    P(match) <= max_u weight_u ub_u(n), so when the k-th rescored key beats that key bound
    the result is exact.

    The rank key is P at 1% plus half a step times the tie-break (the include text's code
    similarity times prod (1 - P(b)), at most that similarity), and the top k of a common
    concept all sit in the top step (P >= 0.99 for thousands of items): no list short enough
    to rescore ends below that step, so the tie is bounded too. Once P's bound alone would
    certify the result with a tie of 0, the index is searched for the include text's code
    (the positive part of the unit query code, cut to ``proxy_dims`` dims as for
    ``hybrid``): an item outside its first ``m`` rows has a code similarity of at most its
    m-th score plus the cut's residual, the quantised search's err and a float32 margin, and
    an item outside both the unit lists and that list has a key of at most key_bound(P
    bound, tie bound). Each pool grows fourfold while it is what stands in the way: the unit
    lists' up to their length, the tie list's within the rows its search fetched, then by
    one larger search. None when neither can prove the top k (the caller scans)."""
    want = offset + k
    n = max(candidates, want)
    m = n  # the tie list's pool
    tie: _ProxyList | None = None
    cand = np.zeros(0, np.int64)
    scores = np.zeros(0)
    rounds = 0
    fetch, cap = _pool_sizes(len(source), n, fetch, max_candidates)
    ctx = strat.ctx
    no_tie = ctx.query_coder is None  # the tie-break is 0 for every item
    while True:
        rounds += 1
        bound = -np.inf
        found = []
        for u, w in units:
            rows, b = lists.top(u, n)
            if b > -np.inf:
                bound = max(bound, w * b)
            found.append(rows)
        # one exact rescore of the round's new rows (a broad concept has tens of units)
        cand, scores = _add_rows(source, strat, query, cand, scores, np.concatenate(found))
        tie_bound = 0.0 if no_tie else 1.0
        if tie is not None:
            rows, tb = tie.top(source, m, fetch, cap)
            cand, scores = _add_rows(source, strat, query, cand, scores, rows)
            tie_bound = -np.inf if tb == -np.inf else min(1.0, max(0.0, tb))
        top = top_rows(scores, want)
        kth = float(scores[top[-1]]) if len(top) == want else -np.inf
        if bound == -np.inf or tie_bound == -np.inf:  # every item was rescored
            certified = True
        else:
            certified = kth > strat.key_bound(bound, tie_bound) + 1e-7
        if certified:
            top = top[offset:]
            searches = tie.searches if tie is not None else 0
            return ServedResult(
                cand[top], scores[top], len(cand), True, rounds, "unit lists", searches
            )
        if len(cand) > cap:
            return None  # rescored past the largest pool and still unproven: the caller scans
        tie_blocks = kth > strat.key_bound(bound, 0.0) + 1e-7  # P's bound would do
        if n < lists.length and not tie_blocks:
            n = min(n * 4, lists.length)
            continue
        if tie is None and not no_tie:
            # the tie is in the way, or the lists ran out in the top step: the tie list
            # bounds the tie-break and brings the items that lead that step
            q = np.asarray(ctx.term_code(strat.tie_text(query.include)), dtype=np.float64)
            nrm = float(np.linalg.norm(q))
            if nrm > 0.0:
                dims, vals, residual = _cut(q / nrm, proxy_dims)
                tie = _ProxyList(dims, vals, residual, _MARGIN)
                continue
        if tie is not None and tie_blocks and m < cap:
            if (
                tie.used_err > 0
                and tie.quantized
                and kth > strat.key_bound(bound, tie_bound - tie.used_err) + 1e-7
            ):
                tie.exact(source)  # only the quantised search's err stood in the way
            else:
                m = min(m * 4, cap)
            continue
        # P's bound stays above the k-th key past the lists (nearly every A has B), or
        # the tie list reached its largest pool
        return None


def _match_bound(strat: Any, query: Query) -> Any:
    """The include term whose probability bound reads the fewest lists (None: none has a
    bound, or nothing is included). A "more like this" picture is bounded by its code
    similarity, linear in unit codes (SR); the photo model's codes are not unit-length."""
    from sparsemm.query.scorers import TermBound, unit_codes_scorer

    ctx, best = strat.ctx, None
    for t in query.include:
        reading = strat.reading(t)
        if reading.kind == "like":
            if not unit_codes_scorer(strat.scorer):
                continue
            q = np.asarray(ctx.term_code(t), dtype=np.float64)
            q = np.maximum(q / max(float(np.linalg.norm(q)), 1e-12), 0.0)
            b = TermBound((q,), lambda s: min(1.0, max(0.0, s[0])))
        else:
            b = strat.scorer.bound(reading, ctx)
        if b is not None and b.weights and (best is None or len(b.weights) < len(best.weights)):
            best = b
    return best


def count_matches(
    source: Store,
    ctx: ExclusionContext,
    query: Query,
    threshold: float,
    candidates: int = 1024,
    proxy_dims: int = 256,
    nonnegative: bool | None = None,
    unit_lists: Any = None,
    **params: Any,
) -> int:
    """How many items have P(match) >= ``threshold``, exactly: an item outside the lists of
    the most selective include term (as :func:`served_match` reads them: unit lists first,
    when given) has at most the bound's probability, so the lists grow until that bound is
    below the threshold and the items in them are counted; queries without such a bound
    (and pools past a quarter of the items) are counted by a scan of the row store."""
    from sparsemm.query.strategies.match import Match

    if not 0.0 < threshold <= 1.0:
        raise SparsemmError(f"the match threshold must be in (0, 1], got {threshold}")
    strat = build_strategy(ctx, "match", **params)
    assert isinstance(strat, Match)
    if nonnegative is None:
        nonnegative = source.nonnegative

    def p_of(rows: np.ndarray) -> np.ndarray:
        sub = strat.over(source.codes(rows))
        assert isinstance(sub, Match)
        return sub.probability(query.include, query.exclude)

    units = _listed_units(strat, query) if unit_lists is not None else None
    if units is not None:
        n = min(candidates, unit_lists.length)
        while True:
            listed: list[np.ndarray] = []
            bound_u = -np.inf
            for u, weight in units:
                unit_rows, b = unit_lists.top(u, n)
                listed.append(unit_rows)
                bound_u = max(bound_u, weight * b) if b > -np.inf else bound_u
            if bound_u < threshold:
                pool = np.unique(np.concatenate(listed))
                return int((p_of(pool) >= threshold).sum()) if len(pool) else 0
            if n >= unit_lists.length:
                break
            n = min(n * 4, unit_lists.length)

    bound = _match_bound(strat, query) if nonnegative and query.include else None
    total = len(source)
    n = min(candidates, total)
    while bound is not None and n * SCAN_SHARE < total:
        norm = float(getattr(strat.scorer, "code_norm", 1.0))
        tops: list[np.ndarray] = []
        bounds: list[float] = []
        for w in bound.weights:
            dims, vals, residual = _cut(np.asarray(w, dtype=np.float64), proxy_dims)
            plist = _ProxyList(dims, vals, residual * norm, 0.0)
            plist.quantized = False
            rows, list_bound = plist.top(source, n, n, n)
            tops.append(rows)
            bounds.append(max(0.0, list_bound))
        if bound.value(bounds) < threshold:
            rows = np.unique(np.concatenate(tops)) if tops else np.zeros(0, np.int64)
            return int((p_of(rows) >= threshold).sum()) if len(rows) else 0
        n *= 4
    count = 0
    for lo in range(0, total, SCAN_ROWS):
        count += int(
            (p_of(np.arange(lo, min(lo + SCAN_ROWS, total), dtype=np.int64)) >= threshold).sum()
        )
    return count


def _add_rows(
    source: Store,
    strat: Strategy,
    query: Query,
    cand: np.ndarray,
    scores: np.ndarray,
    rows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The candidates (ascending rows, exact scores) with those of ``rows`` not among them
    yet rescored exactly and merged in."""
    new = np.setdiff1d(rows, cand)  # sorted, unique
    if not len(new):
        return cand, scores
    # rows ascending, as over every item (ties in top_rows go to the lower row)
    r = np.concatenate([cand, new])
    order = np.argsort(r, kind="stable")
    return r[order], np.concatenate([scores, _rescore(source, strat, query, new)])[order]


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
    n = len(source)
    for lo in range(0, n, chunk):
        rows = np.arange(lo, min(lo + chunk, n), dtype=np.int64)
        s = _rescore(source, strat, query, rows)
        top = top_rows(s, want)
        r = np.concatenate([best_rows, rows[top]])
        v = np.concatenate([best_scores, s[top]])
        # ties go to the lower row: order by (-score, row)
        keep = np.lexsort((r, -v))[:want]
        best_rows, best_scores = r[keep], v[keep]
    sel = np.isfinite(best_scores)
    best_rows, best_scores = best_rows[sel][offset:], best_scores[sel][offset:]
    return ServedResult(best_rows, best_scores, n, True, 0, "scan")
