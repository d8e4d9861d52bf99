"""Top-k search over an index's segments: :class:`SegmentSearch`, the search half of
:class:`~sparsemm.index.inverted.InvertedIndex` (exact, quantized and approximate search, and
warming the in-memory lists they use), driving the numba kernels of
:mod:`sparsemm.index.kernels`.

Scoring (per query): scores live in a small per-thread block accumulator (``BLOCK`` rows).
For each block of rows, the query dims' posting-list cursors advance through the block
(scatter-add ``acc[row] += w_d * x_rd``), the excluded dims' lists mark banned rows, then the
block is scanned into a size-k heap and reset (a vectorised pre-check skips 256-row chunks
with nothing above the current k-th score). A posting list covering at least half of a
segment's rows (a frequent dimension) is added from an in-memory dense value row instead
(built by ``warm()`` or the first search; 4 bytes per row, a contiguous vectorised add, where
postings cost 6 bytes each and a scattered add). Queries with few postings (< rows / 4)
track the touched rows and scan only those once k non-negative hits are held (untouched rows
score 0 and cannot beat them). Cost per query: O(postings of the query and excluded dims) plus
O(rows) for dense queries or O(touched rows) for sparse ones; extra memory O(BLOCK + k),
plus 4 bytes per row for each long list of a segment.
Max-score pruning (exact; on by default for k <= PRUNE_MAX_K, ``index.pruning``): once the
heap is full, a dense block scan skips the query lists of smallest upper bound (weight times
the dim's extreme value in the segment) while their bounds sum to less than the k-th score
(and at most ``PRUNE_SHARE`` of it); the few rows whose partial score could still reach the
heap are rescored exactly from the row store in query order, so results are bit-identical.
``search(..., approx=share)`` is an opt-in approximate mode: candidates from each list's
``share`` of largest |values| (in-memory truncated lists), rescored exactly.
The kernels are numba ``@njit(cache=True, nogil=True)``: searches from several threads run
in parallel, each with its own accumulator.

Ranking rule: every allowed, non-excluded item has a score (items sharing no dimension with
the query score exactly 0); results are the k best by score, ties broken by lower row index.
So zero-score items come back only when fewer than k items score above zero, lowest rows
first, and items with negative scores rank below them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.index.inputs import (
    NO_PLAN,
    Exclusion,
    Plan,
    QueryLike,
    SearchResult,
    as_query,
    check_k,
    plan_exclusion,
)
from sparsemm.index.kernels import (
    QueryArrays,
    SegmentArrays,
    Workspace,
    heap_sort,
    rescore_pool,
    rescore_rows,
    score_blocks,
)
from sparsemm.index.segments import Segment

# Rows per accumulator block: 64k float32 = 256 KiB, stays in a 512 KiB L2 while it is filled
# and scanned. Measured against 32k (one process, queries alternated, one core): 1M items
# 2.31 -> 2.10 ms plain, 2.69 -> 2.37 ms with exclusions; 100k 0.28 -> 0.21 ms; Zipf-skewed
# dims unchanged; 128k no better (docs/results.md, "Tried and lost: speed").
BLOCK = 65536
# ... and only for k <= PRUNE_MAX_K: at k = 1000 the k-th score sits among many rows, the
# candidates to rescore are many and pruning measured 0.5x of the plain scan (1M items).
PRUNE_MAX_K = 10
# Approximate mode rescoring pool: the best max(APPROX_POOL_MIN, APPROX_POOL_FACTOR * k)
# candidates of the truncated lists are rescored exactly.
APPROX_POOL_MIN = 100
APPROX_POOL_FACTOR = 10
# Exact search over v3 segments first rescores a pool of the best max(POOL_MIN, 2k) rows by
# impact score (SegmentSearch._exact_top), for k <= POOL_MAX_K. On the benchmark's uniform
# codes (200 queries, k = 10) a pool of 20 certified every top 10 at 100k and 1M items, and
# scanned faster than one of 32 (a larger heap lets more rows in): 0.119-0.126 against
# 0.127-0.133 ms at 100k, 0.613-0.637 against 0.634-0.645 ms at 1M.
POOL_MIN = 16
POOL_MAX_K = 100


class SegmentSearch:
    """Search over the segments of an index: the attributes below are its state, kept by
    :class:`~sparsemm.index.inverted.InvertedIndex` (``_set_state``)."""

    _segments: list[Segment]  # the committed segments, in row order
    _count: int  # rows over all segments
    _dim: int
    _all_ids: list[str]  # the ids in row order
    _block: int  # rows per accumulator block
    _local: threading.local  # per-thread workspace
    # Max-score pruning in dense block scans (exact; see score_segment). False runs the
    # plain scan: same results, kept for benchmarks and tests that compare the two.
    pruning: bool

    def warm(
        self, approx: float | None = None, quantized: bool = False, pages: bool = True
    ) -> None:
        """Fault every page of the mapped arrays in now (one read per 4 KiB page; not with
        ``pages=False``) and build the in-memory dense rows of the long posting lists (and,
        with ``approx``, the truncated lists of approximate search with that share; with
        ``quantized``, the one-byte impacts of :meth:`search_quantized`).

        Otherwise a fresh process pays page faults on the first queries that touch each
        posting list; a long-running service or a latency benchmark calls this after open.
        """
        quantized = quantized and self.nonnegative
        for s in self._segments:
            if pages:
                for arr in s.stored:
                    if arr.size:
                        step = max(1, 4096 // arr.itemsize)
                        np.add.reduce(arr.reshape(-1)[::step], dtype=np.float64)
            s.dense_lists()
            s.dim_bounds()
            if quantized:
                s.impact_lists()
            a = _check_approx(approx)
            if a is not None:
                s.approx_lists(a)

    @property
    def impact_nbytes(self) -> int:
        """Bytes of memory held by the one-byte impacts of :meth:`search_quantized` and
        their dense rows (0 for segments where they are not built yet; for a v3 segment,
        which maps its impacts from disk, only the dense rows and per-list arrays)."""
        total = 0
        for s in self._segments:
            if s._impacts:
                total += sum(int(a.nbytes) for a in s._impacts[int(s.quantized) :])
        return total

    @property
    def nonnegative(self) -> bool:
        """True when no stored value is negative (each segment's per-dim minimum, computed
        once per segment): what the served path's candidate bounds assume
        (:mod:`sparsemm.query.strategies.ranking`)."""
        return all(bool((s.dim_bounds()[1] >= 0).all()) for s in self._segments)

    def _workspace(self, segs: list[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This thread's accumulator, flags and touched rows, long enough for ``segs`` (the
        snapshot of the segments a search scores: gap-coded posting rows are read a whole
        row block at a time, kernels.block_end)."""
        b = max([self._block] + [s.block_size for s in segs if s.post_rows.itemsize == 1])
        ws = getattr(self._local, "ws", None)
        if ws is None or len(ws[0]) != b:
            ws = (np.zeros(b, np.float32), np.zeros(b, np.uint8), np.zeros(b, np.int64))
            self._local.ws = ws
        return ws

    def _allowed_mask(self, allowed: Any) -> np.ndarray | None:
        if allowed is None:
            return None
        arr = np.asarray(allowed)
        if arr.dtype == np.bool_:
            if arr.shape != (self._count,):
                raise SparsemmError(
                    f"allowed: a boolean mask needs shape ({self._count},), got {arr.shape}"
                )
            return np.ascontiguousarray(arr)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise SparsemmError("allowed: expected a boolean mask or a 1-D array of row indices")
        if arr.size and (arr.min() < 0 or arr.max() >= self._count):
            raise SparsemmError(f"allowed: rows must lie in [0, {self._count})")
        mask = np.zeros(self._count, np.bool_)
        mask[arr.astype(np.int64)] = True
        return mask

    def _search_one(
        self,
        dims: np.ndarray,
        w: np.ndarray,
        k: int,
        plan: Plan,
        mask: np.ndarray | None,
        approx: float | None = None,
        with_ids: bool = True,
    ) -> SearchResult:
        if plan.extra_dims.size:
            dims = np.concatenate([dims, plan.extra_dims])
            w = np.concatenate([w, plan.extra_w])
        if approx is not None:
            return self._search_approx(dims, w, k, plan, mask, approx)
        rows, scores = self._exact_top(dims, w, k, plan, mask)
        all_ids = self._all_ids
        ids = [all_ids[r] for r in rows.tolist()] if with_ids else []
        return SearchResult(rows=rows, ids=ids, scores=scores)

    def _scan(
        self,
        dims: np.ndarray,
        w: np.ndarray,
        k: int,
        plan: Plan,
        mask: np.ndarray | None,
        quantized: bool = False,
        rescore: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """(rows, scores, err): the top k rows by the inner product, best first, through
        every segment's posting lists; with ``quantized``, by the one-byte impacts
        (``Segment.impact_lists``, no pruning, no filter exclusion: the caller checks the
        index holds no negative value), scores within err of the exact ones (else 0).
        Without ``quantized``, a v3 segment's impacts find the candidates and the kernel
        rescores them exactly from the row store (``score_segment``), so the result is
        the exact one either way; with ``rescore=False`` too, its rows are ranked by their
        impact scores (within err) with only the bans the impacts prove applied (the
        first phase of ``_exact_top``)."""
        k = min(k, self._count)
        hs = np.empty(k, np.float32)
        hr = np.empty(k, np.int64)
        size = 0
        err = 0.0
        if k > 0:
            segs = self._segments  # one snapshot: an add() may swap in new segments
            acc, flags, touched = self._workspace(segs)
            work = Workspace(acc=acc, flags=flags, touched=touched, hs=hs, hr=hr)
            use_mask = mask is not None
            m = mask if mask is not None else _NO_MASK
            prune = self.pruning and k <= PRUNE_MAX_K and not quantized and rescore
            for s in segs:
                dmax, dmin = s.dim_bounds()
                seg_err, ethr_e, recheck = 0.0, _NO_ETHR, False
                if quantized or s.quantized:
                    vals, scale, qerr, slot, dense = s.impact_lists()
                    sw = (w * scale[dims]).astype(np.float32)
                    e = impact_err(w, qerr[dims], dmax[dims])
                    if quantized:
                        err = max(err, e)
                    else:
                        ethr_e = impact_thresholds(plan, scale, qerr)
                        if rescore:
                            seg_err, recheck = e, plan.ban_dims.size > 0
                        else:
                            err = max(err, e)
                else:
                    vals, sw = s.post_vals, w
                    slot, dense = s.dense_lists()
                    if plan.ban_dims.size:
                        ethr_e = np.full(plan.ban_dims.size, plan.threshold, np.float64)
                seg = SegmentArrays(
                    rows=s.post_rows,
                    vals=vals,
                    offset=s.start,
                    n_rows=s.count,
                    slot=slot,
                    dense=dense,
                    dmax=dmax,
                    dmin=dmin,
                    fills=s.fills,
                    row_indptr=s.row_indptr,
                    row_dims=s.row_dims,
                    row_vals=s.row_vals,
                )
                q = QueryArrays(
                    qdims=dims,
                    qw=sw,
                    rw=w,
                    err=seg_err,
                    edims=plan.ban_dims,
                    ethr=plan.threshold,
                    ethr_e=ethr_e,
                    recheck=recheck,
                    mask=m,
                    use_mask=use_mask,
                    prune=prune,
                )
                size = score_blocks(s.post_blocks, s.block_size, seg, q, work, size)
        heap_sort(hs, hr, size)
        return hr[:size], hs[:size], err

    def _exact_top(
        self, dims: np.ndarray, w: np.ndarray, k: int, plan: Plan, mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The exact top k (rows, scores). With v3 segments and k <= POOL_MAX_K, first a
        pool of the best max(POOL_MIN, 2k) rows by impact score (a scan without
        rescoring), rescored exactly from the row store and filtered (one segment: best
        first, and only while a row can still enter, ``kernels.rescore_pool``): when the
        k-th exact score beats the impact score + err of every row not rescored, no such
        row can reach it, and that is the answer. Otherwise (or if the pool holds every
        eligible row, it is the answer too) the scan that rescores its candidates as it
        goes."""
        segs = self._segments
        if k <= POOL_MAX_K and any(s.quantized for s in segs):
            kp = min(self._count, max(POOL_MIN, 2 * k))
            pool, approx, err = self._scan(dims, w, kp, plan, mask, rescore=False)
            whole = len(pool) < kp or len(pool) == self._count  # every eligible row
            if len(segs) == 1:  # rescored best first, only while a row can still enter
                s = segs[0]
                top, rows, ok = rescore_pool(
                    s.row_indptr,
                    s.row_dims,
                    s.row_vals,
                    pool,
                    approx,
                    s.start,
                    dims,
                    w,
                    plan.ban_dims,
                    plan.threshold,
                    k,
                    err,
                )
                if ok or whole:
                    return rows, top
                return self._scan(dims, w, k, plan, mask)[:2]
            exact, keep = self._rescore(pool, dims, w, plan, segs)
            rows, scores = pool[keep], exact[keep]
            order = np.lexsort((rows, -scores))[:k]
            if whole or (len(order) == k and float(scores[order[-1]]) > float(approx[-1]) + err):
                return rows[order], scores[order]
        rows, scores, _ = self._scan(dims, w, k, plan, mask)
        return rows, scores

    def _rescore(
        self, rows: np.ndarray, dims: np.ndarray, w: np.ndarray, plan: Plan, segs: list[Segment]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(exact float32 scores, kept by the filter exclusion) of index ``rows``, from the
        row store of their segments (of the snapshot ``segs``)."""
        scores = np.empty(len(rows), np.float32)
        keep = np.ones(len(rows), np.bool_)
        starts = np.array([s.start for s in segs], np.int64)
        which = np.searchsorted(starts, rows, side="right") - 1
        for i, s in enumerate(segs):
            sel = np.flatnonzero(which == i)
            if sel.size:
                scores[sel], keep[sel] = rescore_rows(
                    s.row_indptr,
                    s.row_dims,
                    s.row_vals,
                    rows[sel] - s.start,
                    dims,
                    w,
                    plan.ban_dims,
                    plan.threshold,
                )
        return scores, keep

    def _search_approx(
        self,
        dims: np.ndarray,
        w: np.ndarray,
        k: int,
        plan: Plan,
        mask: np.ndarray | None,
        keep: float,
    ) -> SearchResult:
        """Approximate top-k: candidates from truncated posting lists (each list's ``keep``
        share of largest |values|, in the spirit of Seismic's static pruning), then every
        candidate rescored exactly from the row store and filtered; hits carry exact scores
        and follow the ranking rule among the candidates, but a true hit may be missed.
        The filter-excluded dims' truncated lists already keep their banned rows out of the
        candidates, so a query whose best items are mostly excluded still fills its pool
        with allowed ones. The truncated lists hold exact values (from the row store for a
        v3 segment)."""
        pool = min(self._count, max(APPROX_POOL_MIN, APPROX_POOL_FACTOR * k))
        hs = np.empty(pool, np.float32)
        hr = np.empty(pool, np.int64)
        size = 0
        segs = self._segments  # one snapshot: an add() may swap in new segments
        acc, flags, touched = self._workspace(segs)
        work = Workspace(acc=acc, flags=flags, touched=touched, hs=hs, hr=hr)
        m = mask if mask is not None else _NO_MASK
        no_slot = np.full(self._dim, -1, np.int32)
        ethr_e = np.full(plan.ban_dims.size, plan.threshold, np.float64)
        q = QueryArrays(
            qdims=dims,
            qw=w,
            rw=w,
            err=0.0,
            edims=plan.ban_dims,
            ethr=plan.threshold,
            ethr_e=ethr_e,
            recheck=False,
            mask=m,
            use_mask=mask is not None,
            prune=False,
        )
        for s in segs:
            t_blocks, t_rows, t_vals = s.approx_lists(keep)
            seg = SegmentArrays(
                rows=t_rows,
                vals=t_vals,
                offset=s.start,
                n_rows=s.count,
                slot=no_slot,
                dense=_NO_DENSE,
                dmax=_NO_BOUNDS,
                dmin=_NO_BOUNDS,
                fills=_NO_FILLS,
                row_indptr=s.row_indptr,
                row_dims=s.row_dims,
                row_vals=s.row_vals,
            )
            size = score_blocks(t_blocks, max(s.count, 1), seg, q, work, size)
        cand = hr[:size]
        scores, ok = self._rescore(cand, dims, w, plan, segs)
        cand, scores = cand[ok], scores[ok]
        order = np.lexsort((cand, -scores))[:k]
        rows, top = cand[order], scores[order]
        all_ids = self._all_ids
        return SearchResult(rows=rows, ids=[all_ids[r] for r in rows.tolist()], scores=top)

    def search(
        self,
        query: QueryLike,
        k: int = 10,
        exclude: Exclusion | None = None,
        allowed: np.ndarray | Sequence[int] | None = None,
        approx: float | None = None,
        with_ids: bool = True,
    ) -> SearchResult:
        """Exact top-``k`` items by inner product with ``query`` (ranking rule: module doc).

        ``query``: a (1, dim) sparse row, a dense (dim,) array or a (dims, weights) pair.
        ``exclude``: dims to filter out or penalise. ``allowed``: a (n,) boolean mask or an
        array of rows to restrict the search to (e.g. one split). Returns at most ``k`` hits
        (fewer only when fewer items are allowed and not excluded).
        ``approx`` (opt-in, not exact): a share in (0, 1]; candidates come from each
        posting list's ``approx`` share of largest values and are rescored exactly, so
        scores are exact but a true hit can be missed (recall measured in
        ``benchmarks/index_latency.py --approx``); the first such search builds the
        truncated lists in memory (``warm(approx=...)`` does it ahead).
        ``with_ids=False`` leaves ``ids`` empty (rows and scores only): a caller asking for
        thousands of rows by row number spares building their id list.
        """
        k = check_k(k)
        dims, w = as_query(query, self._dim)
        plan = plan_exclusion(exclude, self._dim)
        mask = self._allowed_mask(allowed)
        a = _check_approx(approx)
        if a is not None:
            return self._search_one(dims, w, k, plan, mask, a)
        return self._search_one(dims, w, k, plan, mask, with_ids=with_ids)

    def search_quantized(self, query: QueryLike, k: int = 10) -> tuple[SearchResult, float]:
        """(hits, err): the top ``k`` rows by an approximation of the inner product with
        ``query`` whose every posting value is read as one byte (``Segment.impact_lists``),
        and a bound ``err`` such that every item's approximate score is within err of its
        exact one. Hits carry approximate scores and no ids; ranking rule as in
        :meth:`search`, on the approximate scores. So an item outside the hits scores
        exactly at most the k-th approximate score + err: what candidate generation under
        a certificate needs (the served path, :mod:`sparsemm.query.strategies.ranking`). A posting
        costs 3 bytes of memory traffic here against 6 in :meth:`search`, which is what a
        search over many long lists waits on. An index holding a negative value is searched
        exactly instead (err 0)."""
        k = check_k(k)
        dims, w = as_query(query, self._dim)
        if not self.nonnegative:
            return self._search_one(dims, w, k, NO_PLAN, None, with_ids=False), 0.0
        rows, scores, err = self._scan(dims, w, k, NO_PLAN, None, quantized=True)
        return SearchResult(rows=rows, ids=[], scores=scores), err

    def search_batch(
        self,
        queries: Any,
        k: int = 10,
        exclude: Exclusion | Sequence[Exclusion | None] | None = None,
        allowed: np.ndarray | Sequence[int] | None = None,
    ) -> list[SearchResult]:
        """``search`` for each row of ``queries`` (nq, dim) sparse or dense.

        ``exclude`` is one Exclusion for all queries or a list with one (or None) per query.
        """
        k = check_k(k)
        if sp.issparse(queries):
            qs = sp.csr_matrix(queries, dtype=np.float32)
        else:
            arr = np.asarray(queries)
            if arr.ndim != 2:
                raise SparsemmError(f"queries: expected a 2-D (nq, {self._dim}) matrix")
            qs = sp.csr_matrix(arr.astype(np.float32))
        if qs.ndim != 2 or qs.shape[1] != self._dim:
            raise SparsemmError(f"queries: expected shape (nq, {self._dim}), got {qs.shape}")
        if not np.isfinite(qs.data).all():
            raise SparsemmError("queries contain NaN or inf; re-encode them")
        qs = qs.copy()
        qs.sum_duplicates()
        qs.eliminate_zeros()
        nq = qs.shape[0]
        if exclude is None or isinstance(exclude, Exclusion):
            plans = [plan_exclusion(exclude, self._dim)] * nq
        else:
            ex_list = list(exclude)
            if len(ex_list) != nq:
                raise SparsemmError(f"exclude: {len(ex_list)} exclusions for {nq} queries")
            plans = [plan_exclusion(e, self._dim) for e in ex_list]
        mask = self._allowed_mask(allowed)
        out = []
        for i in range(nq):
            lo, hi = qs.indptr[i], qs.indptr[i + 1]
            dims = qs.indices[lo:hi].astype(np.int64)
            w = qs.data[lo:hi].astype(np.float32)
            out.append(self._search_one(dims, w, k, plans[i], mask))
        return out


_NO_MASK = np.zeros(1, np.bool_)
_NO_ETHR = np.zeros(0, np.float64)
_NO_FILLS = np.zeros(0, np.bool_)
_NO_DENSE = np.zeros((0, 1), np.float32)
_NO_BOUNDS = np.zeros(0, np.float32)


def _check_approx(approx: Any) -> float | None:
    if approx is None:
        return None
    if isinstance(approx, bool) or not isinstance(approx, (int, float, np.floating)):
        raise SparsemmError(f"approx must be a number in (0, 1] or None, got {approx!r}")
    if not 0.0 < float(approx) <= 1.0:
        raise SparsemmError(f"approx must lie in (0, 1], got {approx!r}")
    return float(approx)


def impact_err(w: np.ndarray, qerr: np.ndarray, dmax: np.ndarray) -> float:
    """The most an item's score from one-byte impacts (``Segment.impact_lists``) can differ
    from its exact inner product, for query weights ``w`` on dims whose impacts are within
    ``qerr`` of their values (measured) and whose largest value is ``dmax``: the sum of
    |w_j| qerr_j, plus the float32 rounding of the scaled weights, the products and a sum
    of len(w) terms (each under 2^-24 relative; 4x margin on len(w) + 2 of them), and their
    absolute error where a scaled weight, product or sum falls below float32's normal range
    (each under 2^-150; a scaled weight's times an impact of up to 255), for the
    approximate score and the exact one alike."""
    aw = np.abs(w.astype(np.float64))
    mag = float(aw @ (dmax.astype(np.float64) + qerr))
    tiny = 600 * 2.0**-149 if mag > 0 else 0.0  # nothing to round without a posting
    return float(aw @ qerr) + (len(w) + 2) * (mag * 2.0**-22 + tiny)


def impact_thresholds(plan: Plan, scale: np.ndarray, qerr: np.ndarray) -> np.ndarray:
    """(ne,) f64: for each filter-excluded dim d, a threshold on its impacts above which a
    value is certainly > plan.threshold (impact * scale[d] - qerr[d] > threshold, rounded
    up); the postings at or below it are left to the exact check of each candidate. A list
    of zero scale gets +inf (nothing decided by impacts)."""
    d = plan.ban_dims
    sc = scale[d].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (plan.threshold + qerr[d]) / sc
    return np.where(sc > 0, t + np.abs(t) * 1e-9 + 1e-300, np.inf)
