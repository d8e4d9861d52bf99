"""The inverted index's numba kernels: a bounded top-k heap, query cleaning, the per-segment
scoring loop (scatter-add over posting lists, dense lists kept in memory, exact max-score
pruning), exact rescoring of rows, and the layout and finiteness checks of segment arrays.

Pure functions over arrays, compiled once and cached on disk (``cache=True``);
:mod:`sparsemm.index.inverted` drives them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit, uint64

# A segment is scored in "touched rows" mode when its postings for the query are fewer than
# count / SPARSE_RATIO; otherwise every row of a block is scanned.
SPARSE_RATIO = 4
# Max-score pruning skips a block's lists of smallest bounds only while their bounds sum to at
# most PRUNE_SHARE of the k-th score: the rows left as candidates (partial score >= k-th score
# minus that sum) are rescored one by one from the row store, so a looser cut costs more
# rescoring than the skipped postings save.
PRUNE_SHARE = 0.1


class SegmentArrays(NamedTuple):
    """One segment's arrays as :func:`score_blocks` reads them (index rows
    [offset, offset + n_rows)); built by :mod:`sparsemm.index.inverted` per scan."""

    rows: np.ndarray  # posting rows (nnz,), local to their row block (maybe gap-coded)
    vals: np.ndarray  # posting values (nnz,): exact, or one-byte impacts
    offset: int  # the segment's first index row
    n_rows: int  # its rows
    slot: np.ndarray  # (dim,) row of a long list in ``dense``, -1: none
    dense: np.ndarray  # (n_long, n_rows) the long lists as dense value rows
    dmax: np.ndarray  # (dim,) largest posting value per dim (max-score bounds)
    dmin: np.ndarray  # (dim,) smallest posting value per dim
    fills: np.ndarray  # (dim,) the list holds filler postings
    row_indptr: np.ndarray  # the row store (CSR by row), for exact rescoring
    row_dims: np.ndarray
    row_vals: np.ndarray


class QueryArrays(NamedTuple):
    """A query as :func:`score_blocks` scores it on one segment (see :func:`score_segment`)."""

    qdims: np.ndarray  # query dims
    qw: np.ndarray  # their weights as the stored values read them
    rw: np.ndarray  # the exact weights (rescoring from the row store)
    err: float  # bound on a row's accumulated score error (0: exact values)
    edims: np.ndarray  # filter-excluded dims
    ethr: float  # filter threshold on exact values
    ethr_e: np.ndarray  # per excluded dim, the stored-value threshold of a certain ban
    recheck: bool  # check candidates against the excluded dims in the row store
    mask: np.ndarray  # (n,) allowed index rows, read when use_mask
    use_mask: bool
    prune: bool  # max-score pruning


class Workspace(NamedTuple):
    """Per-scan scratch arrays and the top-k heap (see :func:`score_segment`)."""

    acc: np.ndarray  # (B,) f32 accumulator, zero on entry and exit
    flags: np.ndarray  # (B,) u8 touched / banned bits, zero on entry and exit
    touched: np.ndarray  # (B,) rows touched in a sparse block
    hs: np.ndarray  # (k,) heap scores
    hr: np.ndarray  # (k,) heap rows


@njit(cache=True, nogil=True)
def better(s1: float, r1: Any, s2: float, r2: Any) -> bool:  # pragma: no cover - numba
    """(s1, r1) ranks before (s2, r2): higher score, then lower row."""
    return s1 > s2 or (s1 == s2 and r1 < r2)


# Posting rows stored as uint8 are gap-coded within each list's row block: row = previous
# row + gap (the first counted from -1), a gap over 255 taking filler postings of gap 255 and
# value 0 (segments.post_gaps_pay). A filler adds w * 0 to a row that is not in the list,
# which leaves its score unchanged, and is never above a filter threshold (>= 0); only a
# list without fillers may be banned wholesale ("every").
NO_ROW: Any = np.uint64(2**64 - 1)  # -1: the first gap counts from it (uint64 wraps)


@njit(inline="always")
def next_row(rows: np.ndarray, p: Any, r: Any, b0: Any) -> Any:  # pragma: no cover - numba
    """Accumulator index of posting p: gap-coded rows (uint8) add to the previous one ``r``
    (NO_ROW before a block's first posting); absolute block-local rows minus ``b0``."""
    if rows.itemsize == 1:
        return r + uint64(rows[p])
    return uint64(np.int64(rows[p]) - b0)


@njit(inline="always")
def block_end(rows: np.ndarray, lo: Any, hi: Any, b1: Any) -> Any:  # pragma: no cover - numba
    """End of the postings in [lo, hi) below row b1: all of them for gap-coded rows (whose
    accumulator block always covers their row block), else a binary search."""
    if rows.itemsize == 1:
        return hi
    return lower_bound(rows, lo, hi, b1)


@njit(cache=True, nogil=True)
def heap_push(
    hs: np.ndarray, hr: np.ndarray, size: int, s: float, r: Any
) -> int:  # pragma: no cover - numba
    """Offer (s, r) to a size-k heap whose root is the worst held hit; return the new size."""
    k = hs.shape[0]
    if size < k:
        i = size
        hs[i] = s
        hr[i] = r
        while i > 0:
            p = (i - 1) >> 1
            if better(hs[p], hr[p], hs[i], hr[i]):
                hs[p], hs[i] = hs[i], hs[p]
                hr[p], hr[i] = hr[i], hr[p]
                i = p
            else:
                break
        return size + 1
    if not better(s, r, hs[0], hr[0]):
        return size
    hs[0] = s
    hr[0] = r
    sift_down(hs, hr, k)
    return size


@njit(cache=True, nogil=True)
def sift_down(hs: np.ndarray, hr: np.ndarray, n: int) -> None:  # pragma: no cover - numba
    """Restore the heap property of hs/hr[:n] after the root was replaced."""
    i = 0
    while True:
        w = i
        left = 2 * i + 1
        right = left + 1
        if left < n and better(hs[w], hr[w], hs[left], hr[left]):
            w = left
        if right < n and better(hs[w], hr[w], hs[right], hr[right]):
            w = right
        if w == i:
            break
        hs[w], hs[i] = hs[i], hs[w]
        hr[w], hr[i] = hr[i], hr[w]
        i = w


@njit(cache=True, nogil=True)
def heap_sort(hs: np.ndarray, hr: np.ndarray, size: int) -> None:  # pragma: no cover - numba
    """Sort a heap of ``size`` hits in place, best first (the worst root goes to the end)."""
    for end in range(size - 1, 0, -1):
        hs[0], hs[end] = hs[end], hs[0]
        hr[0], hr[end] = hr[end], hr[0]
        sift_down(hs, hr, end)


@njit(cache=True, nogil=True)
def clean_query(dims: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Drop zero weights: (dims int64, weights float32, count of non-finite weights)."""
    m = 0
    bad = 0
    for i in range(w.shape[0]):
        x = np.float32(w[i])
        if not np.isfinite(x):
            bad += 1
        elif x != 0:
            m += 1
    od = np.empty(m, np.int64)
    ow = np.empty(m, np.float32)
    j = 0
    for i in range(w.shape[0]):
        x = np.float32(w[i])
        if np.isfinite(x) and x != 0 and j < m:
            od[j] = dims[i]
            ow[j] = x
            j += 1
    return od, ow, bad


@njit(cache=True, nogil=True)
def build_dense(
    blocks: np.ndarray,
    rows: np.ndarray,
    vals: np.ndarray,
    bsize: int,
    count: int,
    min_len: int,
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """slot (dim,) int32 (-1: none) and dense (n_dense, count) of vals' dtype: the posting
    lists of >= min_len postings as dense value rows (0 where a row is absent). ``blocks`` (dim,
    nb + 1): list d's postings of row block b are [blocks[d, b], blocks[d, b + 1]), their
    rows local to that block (row b * bsize + rows[p]; gap-coded if uint8, see
    ``next_row``)."""
    dim = blocks.shape[0]
    nb = blocks.shape[1] - 1
    slot = np.full(dim, -1, np.int32)
    nd = 0
    for d in range(dim):
        if blocks[d, nb] - blocks[d, 0] >= min_len:
            slot[d] = nd
            nd += 1
    dense = np.zeros((nd, count), vals.dtype)
    for d in range(dim):
        sd = slot[d]
        if sd >= 0:
            for b in range(nb):
                base = b * bsize
                r = NO_ROW
                for p in range(blocks[d, b], blocks[d, b + 1]):
                    r = next_row(rows, p, r, 0)
                    if vals[p] != 0:  # a filler is 0 and its row is not in the list
                        dense[sd, base + np.int64(r)] = vals[p]
    return slot, dense


@njit(cache=True, nogil=True)
def quantize_lists(
    indptr: np.ndarray, vals: np.ndarray, scale: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """(impacts (nnz,) uint8, err (dim,) f64) of non-negative posting values: impact =
    round(v / scale[d]) clamped to [0, 255] for the postings [indptr[d], indptr[d + 1]) of
    list d (``scale[d]``: the list's largest value / 255; 0 reads every value as 0), and
    err[d], the largest |v - impact * scale[d]| of the list, measured (about scale[d] / 2;
    more where the float32 scale rounded or underflowed)."""
    dim = indptr.shape[0] - 1
    out = np.empty(vals.shape[0], np.uint8)
    err = np.zeros(dim, np.float64)
    for d in range(dim):
        sd = np.float64(scale[d])
        inv = 1.0 / sd if sd > 0 else 0.0
        e = 0.0
        for p in range(indptr[d], indptr[d + 1]):
            v = np.float64(vals[p])
            q = np.uint8(min(max(v * inv + 0.5, 0.0), 255.0))
            out[p] = q
            e = max(e, abs(v - np.float64(q) * sd))
        err[d] = e
    return out, err


@njit(cache=True, nogil=True)
def block_pointers(
    indptr: np.ndarray, rows: np.ndarray, nb: int, shift: int
) -> np.ndarray:  # pragma: no cover - numba
    """(dim, nb + 1) int64: where each row block (rows >> shift) starts in each posting list
    (``indptr`` (dim + 1,), ``rows`` ascending within each list)."""
    dim = indptr.shape[0] - 1
    out = np.empty((dim, nb + 1), np.int64)
    for d in range(dim):
        p = indptr[d]
        hi = indptr[d + 1]
        for b in range(nb):
            out[d, b] = p
            while p < hi and (np.int64(rows[p]) >> shift) == b:
                p += 1
        out[d, nb] = hi
    return out


@njit(cache=True, nogil=True)
def global_rows(blocks: np.ndarray, rows: np.ndarray, bsize: int) -> np.ndarray:  # pragma: no cover
    """(nnz,) int64: the segment row of every posting (block start + block-local row; for
    gap-coded rows, fillers included)."""
    dim = blocks.shape[0]
    nb = blocks.shape[1] - 1
    out = np.empty(rows.shape[0], np.int64)
    for d in range(dim):
        for b in range(nb):
            base = b * bsize
            r = NO_ROW
            for p in range(blocks[d, b], blocks[d, b + 1]):
                r = next_row(rows, p, r, 0)
                out[p] = base + np.int64(r)
    return out


@njit(cache=True, nogil=True)
def encode_gaps(
    blocks: np.ndarray, rows: np.ndarray, vals: np.ndarray, fillers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """Gap-coded posting lists (blocks, uint8 gaps, vals with 0 for fillers, fillers per
    dim) of block-local ascending ``rows`` (``next_row``); ``fillers``: ``count_gap_fillers``."""
    dim = blocks.shape[0]
    nb = blocks.shape[1] - 1
    out_blocks = np.empty_like(blocks)
    out_rows = np.empty(rows.shape[0] + fillers, np.uint8)
    out_vals = np.zeros(rows.shape[0] + fillers, vals.dtype)
    per_dim = np.zeros(dim, np.int64)
    q = 0
    for d in range(dim):
        for b in range(nb):
            out_blocks[d, b] = q
            prev = np.int64(-1)
            for p in range(blocks[d, b], blocks[d, b + 1]):
                g = np.int64(rows[p]) - prev
                while g > 255:
                    out_rows[q] = 255
                    q += 1
                    g -= 255
                    per_dim[d] += 1
                out_rows[q] = g
                out_vals[q] = vals[p]
                q += 1
                prev = np.int64(rows[p])
        out_blocks[d, nb] = q
    return out_blocks, out_rows, out_vals, per_dim


@njit(cache=True, nogil=True)
def count_gap_fillers(blocks: np.ndarray, rows: np.ndarray) -> int:  # pragma: no cover - numba
    """Filler postings gap-coded lists of these block-local rows need (gaps over 255)."""
    dim = blocks.shape[0]
    nb = blocks.shape[1] - 1
    total = np.int64(0)
    for d in range(dim):
        for b in range(nb):
            prev = np.int64(-1)
            for p in range(blocks[d, b], blocks[d, b + 1]):
                g = np.int64(rows[p]) - prev
                total += (g - 1) // 255
                prev = np.int64(rows[p])
    return int(total)


@njit(cache=True, nogil=True)
def lower_bound(rows: np.ndarray, lo: int, hi: int, x: int) -> int:  # pragma: no cover
    """First p in [lo, hi) with rows[p] >= x (rows ascending on [lo, hi))."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if rows[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


# A row store whose dims are uint8 holds each row's dims as deltas (dims ascending; the first
# counted from -1), delta 0 being a filler entry (value 0.0) that advances the dim by 255:
# 1 byte a dim instead of 2 where a row's dims are close (segments.row_store_encoding).
FILLER_STEP = 255


@njit(inline="always")
def next_dim(row_dims: np.ndarray, p: Any, d: Any) -> tuple[Any, bool]:  # pragma: no cover
    """(dim, holds a value) of delta-coded entry p after dim ``d`` (-1 before a row's first
    entry): a delta of 0 is a filler that advances FILLER_STEP and holds no value."""
    b = np.int64(row_dims[p])
    if b == 0:
        return d + FILLER_STEP, False
    return d + b, True


@njit(cache=True, nogil=True)
def query_order(qdims: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted dims, their query positions, a (nq,) f32 scratch row) for ``row_score`` on a
    delta-coded row store."""
    spos = np.argsort(qdims, kind="mergesort")
    return qdims[spos], spos, np.zeros(qdims.shape[0], np.float32)


@njit(cache=True, nogil=True)
def row_score(
    row_indptr: np.ndarray,
    row_dims: np.ndarray,
    row_vals: np.ndarray,
    r: Any,
    qdims: np.ndarray,
    qw: np.ndarray,
    qo: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> Any:  # pragma: no cover - numba
    """Score of segment row r from the row store: sum of qw[j] * x[r, qdims[j]] in query
    order in float32, the same operations the block accumulator performs (absent dims add
    +-0, which leaves a sum unchanged). ``qo``: ``query_order(qdims)``, used when the row
    store is delta-coded (uint8 dims): the row is decoded once, its values placed by query
    position, then summed in query order."""
    lo0 = row_indptr[r]
    hi0 = row_indptr[r + 1]
    s = np.float32(0.0)
    if row_dims.itemsize == 1:
        sdims, spos, tmp = qo
        nq = sdims.shape[0]
        tmp[:] = 0.0
        i = 0
        d = np.int64(-1)
        for p in range(lo0, hi0):
            d, value = next_dim(row_dims, p, d)
            if not value:
                continue
            while i < nq and sdims[i] < d:
                i += 1
            if i == nq:
                break
            t = i
            while t < nq and sdims[t] == d:
                tmp[spos[t]] = row_vals[p]
                t += 1
        for j in range(nq):
            s += qw[j] * tmp[j]
        return s
    for j in range(qdims.shape[0]):
        d = qdims[j]
        p = lower_bound(row_dims, lo0, hi0, d)
        if p < hi0 and row_dims[p] == d:
            s += qw[j] * row_vals[p]
    return s


@njit(cache=True, nogil=True)
def row_banned(
    row_indptr: np.ndarray,
    row_dims: np.ndarray,
    row_vals: np.ndarray,
    r: Any,
    edims: np.ndarray,
    ethr: float,
) -> bool:  # pragma: no cover - numba
    """Segment row r holds a value > ethr on one of the dims ``edims`` (row store, exact)."""
    lo0 = row_indptr[r]
    hi0 = row_indptr[r + 1]
    if row_dims.itemsize == 1:
        d = np.int64(-1)
        for p in range(lo0, hi0):
            d, value = next_dim(row_dims, p, d)
            if value and row_vals[p] > ethr:
                for j in range(edims.shape[0]):
                    if edims[j] == d:
                        return True
        return False
    for j in range(edims.shape[0]):
        d = edims[j]
        p = lower_bound(row_dims, lo0, hi0, d)
        if p < hi0 and row_dims[p] == d and row_vals[p] > ethr:
            return True
    return False


@njit(cache=True, nogil=True)
def decode_rows(
    row_indptr: np.ndarray, row_dims: np.ndarray, row_vals: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """(indptr, dims int32, vals) of a row store as plain CSR (fillers of a delta-coded one
    dropped, dims absolute)."""
    n = row_indptr.shape[0] - 1
    delta = row_dims.itemsize == 1
    indptr = np.zeros(n + 1, np.int64)
    for r in range(n):
        c = 0
        for p in range(row_indptr[r], row_indptr[r + 1]):
            c += (not delta) or row_dims[p] != 0
        indptr[r + 1] = indptr[r] + c
    dims = np.empty(indptr[n], np.int32)
    vals = np.empty(indptr[n], np.float32)
    for r in range(n):
        q = indptr[r]
        d = np.int64(-1)
        for p in range(row_indptr[r], row_indptr[r + 1]):
            if delta:
                d, value = next_dim(row_dims, p, d)
                if not value:
                    continue
            else:
                d = np.int64(row_dims[p])
            dims[q] = d
            vals[q] = row_vals[p]
            q += 1
    return indptr, dims, vals


@njit(cache=True, nogil=True)
def encode_deltas(
    indptr: np.ndarray, dims: np.ndarray, vals: np.ndarray, fillers: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """The delta-coded row store (indptr, uint8 dims, vals) of CSR rows (dims ascending in
    each row) that need ``fillers`` filler entries in all (``count_fillers``)."""
    n = indptr.shape[0] - 1
    out_ptr = np.zeros(n + 1, np.int64)
    out_dims = np.empty(dims.shape[0] + fillers, np.uint8)
    out_vals = np.zeros(dims.shape[0] + fillers, np.float32)
    q = 0
    for r in range(n):
        prev = np.int64(-1)
        for p in range(indptr[r], indptr[r + 1]):
            g = np.int64(dims[p]) - prev
            while g > FILLER_STEP:
                out_dims[q] = 0
                q += 1
                g -= FILLER_STEP
            out_dims[q] = g
            out_vals[q] = vals[p]
            q += 1
            prev = np.int64(dims[p])
        out_ptr[r + 1] = q
    return out_ptr, out_dims, out_vals


@njit(cache=True, nogil=True)
def count_fillers(indptr: np.ndarray, dims: np.ndarray) -> int:  # pragma: no cover - numba
    """Filler entries a delta-coded row store of these CSR rows needs (gaps over 255)."""
    n = indptr.shape[0] - 1
    total = np.int64(0)
    for r in range(n):
        prev = np.int64(-1)
        for p in range(indptr[r], indptr[r + 1]):
            g = np.int64(dims[p]) - prev
            total += (g - 1) // FILLER_STEP
            prev = np.int64(dims[p])
    return int(total)


@njit(cache=True, nogil=True)
def truncate_lists(
    blocks: np.ndarray, rows: np.ndarray, vals: np.ndarray, bsize: int, keep: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """Approximate-mode posting lists: of each list, the ceil(keep * len) postings of largest
    |value| (ties at the cut all kept), as (indptr (dim + 1,), segment rows int32 ascending,
    vals) (``blocks``/``bsize`` as in ``build_dense``)."""
    dim = blocks.shape[0]
    nb = blocks.shape[1] - 1
    cut = np.zeros(dim, np.float32)
    out_ptr = np.zeros(dim + 1, np.int64)
    for d in range(dim):
        lo, hi = blocks[d, 0], blocks[d, nb]
        n = hi - lo
        if n == 0:
            out_ptr[d + 1] = out_ptr[d]
            continue
        m = min(n, max(1, int(np.ceil(keep * n))))
        a = np.sort(np.abs(vals[lo:hi]))
        cut[d] = a[n - m]
        c = 0
        for p in range(lo, hi):
            c += abs(vals[p]) >= cut[d]
        out_ptr[d + 1] = out_ptr[d] + c
    out_rows = np.empty(out_ptr[dim], np.int32)
    out_vals = np.empty(out_ptr[dim], np.float32)
    for d in range(dim):
        q = out_ptr[d]
        for b in range(nb):
            base = b * bsize
            for p in range(blocks[d, b], blocks[d, b + 1]):
                if abs(vals[p]) >= cut[d]:
                    out_rows[q] = base + np.int64(rows[p])
                    out_vals[q] = vals[p]
                    q += 1
    return out_ptr, out_rows, out_vals


@njit(cache=True, nogil=True)
def rescore_rows(
    row_indptr: np.ndarray,
    row_dims: np.ndarray,
    row_vals: np.ndarray,
    local: np.ndarray,
    qdims: np.ndarray,
    qw: np.ndarray,
    edims: np.ndarray,
    ethr: float,
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """Exact scores (f32, as the exact search computes them) of segment rows ``local`` and
    whether each survives the filter-excluded dims (value > ethr on any drops it)."""
    n = local.shape[0]
    scores = np.empty(n, np.float32)
    keep = np.ones(n, np.bool_)
    qo = query_order(qdims)
    for i in range(n):
        r = local[i]
        scores[i] = row_score(row_indptr, row_dims, row_vals, r, qdims, qw, qo)
        keep[i] = not row_banned(row_indptr, row_dims, row_vals, r, edims, ethr)
    return scores, keep


@njit(cache=True, nogil=True)
def rescore_pool(
    row_indptr: np.ndarray,
    row_dims: np.ndarray,
    row_vals: np.ndarray,
    rows: np.ndarray,
    approx: np.ndarray,
    offset: int,
    qdims: np.ndarray,
    qw: np.ndarray,
    edims: np.ndarray,
    ethr: float,
    k: int,
    err: float,
) -> tuple[np.ndarray, np.ndarray, bool]:  # pragma: no cover - numba
    """The exact top k (scores, rows, best first) of a pool of one segment's rows (index
    rows ``rows``, segment rows ``rows - offset``) ranked by approximate scores ``approx``
    (best first, each within err of its exact score), rescored from the row store in that
    order and filtered by the excluded dims, and whether every row the pool left out
    provably ranks below them: rescoring stops at the first row whose approximate score
    + err is below the k-th exact score (so are all after it); when it reaches the end,
    the pool's last approximate score + err must be below that score too."""
    hs = np.empty(k, np.float32)
    hr = np.empty(k, np.int64)
    size = 0
    qo = query_order(qdims)
    n = rows.shape[0]
    stopped = False
    for i in range(n):
        # (a k-th score of +inf: an overflowing row may still tie it with a lower row)
        if size == k and np.float64(approx[i]) + err < np.float64(hs[0]) < np.inf:
            stopped = True
            break
        r = rows[i] - offset
        if row_banned(row_indptr, row_dims, row_vals, r, edims, ethr):
            continue
        s = row_score(row_indptr, row_dims, row_vals, r, qdims, qw, qo)
        if size < k or better(s, rows[i], hs[0], hr[0]):
            size = heap_push(hs, hr, size, s, rows[i])
    ok = size == k and (
        stopped or (n > 0 and np.float64(approx[n - 1]) + err < np.float64(hs[0]) < np.inf)
    )
    heap_sort(hs, hr, size)
    return hs[:size], hr[:size], bool(ok)


@njit(cache=True, nogil=True)
def copy_runs(
    src_dims: np.ndarray,
    src_vals: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    dst: np.ndarray,
    out_dims: np.ndarray,
    out_vals: np.ndarray,
) -> None:  # pragma: no cover - numba
    """Copy run i (``lens[i]`` entries of src_* from ``starts[i]``) to out_* at ``dst[i]``:
    the row store's codes of selected rows gathered into one CSR matrix (a delta-coded run
    decoded, its fillers dropped: see ``run_nnz``)."""
    delta = src_dims.itemsize == 1
    for i in range(starts.shape[0]):
        a = starts[i]
        b = dst[i]
        if delta:
            d = np.int64(-1)
            for t in range(lens[i]):
                d, value = next_dim(src_dims, a + t, d)
                if not value:
                    continue
                out_dims[b] = d
                out_vals[b] = src_vals[a + t]
                b += 1
        else:
            for t in range(lens[i]):
                out_dims[b + t] = src_dims[a + t]
                out_vals[b + t] = src_vals[a + t]


@njit(cache=True, nogil=True)
def run_nnz(
    src_dims: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> np.ndarray:  # pragma: no cover - numba
    """(len(starts),) int64: the values in each run of the row store (its entries, less the
    fillers of a delta-coded one)."""
    out = lens.copy()
    if src_dims.itemsize == 1:
        for i in range(starts.shape[0]):
            c = 0
            for t in range(lens[i]):
                c += src_dims[starts[i] + t] != 0
            out[i] = c
    return out


@njit(cache=True, nogil=True)
def dim_bounds(
    indptr: np.ndarray, vals: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - numba
    """(dmax, dmin) (dim,) f32: largest and smallest posting value of each dim (0 if empty)."""
    dim = indptr.shape[0] - 1
    dmax = np.zeros(dim, np.float32)
    dmin = np.zeros(dim, np.float32)
    for d in range(dim):
        lo, hi = indptr[d], indptr[d + 1]
        if hi > lo:
            a = vals[lo]
            b = vals[lo]
            for p in range(lo + 1, hi):
                v = vals[p]
                a = max(a, v)
                b = min(b, v)
            dmax[d] = a
            dmin[d] = b
    return dmax, dmin


@njit(cache=True, nogil=True)
def cut_below(c64: float) -> Any:  # pragma: no cover - numba
    """A float32 a little below the float64 ``c64`` (candidate cuts err on the low side)."""
    return np.nextafter(np.float32(c64 - abs(c64) * 1e-6), np.float32(-np.inf))


@njit(cache=True, nogil=True)
def score_segment(
    lo_ptr: np.ndarray,
    hi_ptr: np.ndarray,
    start: int,
    count: int,
    seg: SegmentArrays,
    q: QueryArrays,
    work: Workspace,
    size: int,
) -> int:  # pragma: no cover - numba
    """Score rows [start, start + count) of segment ``seg`` into the running top-k heap
    (work.hs, work.hr, size); return size.

    Those are rows [offset, offset + count) of the index, offset = seg.offset + start:
    posting list d is [lo_ptr[d], hi_ptr[d]) of rows/vals (nnz,), rows counted from
    ``offset`` (``score_blocks`` passes one row block of a segment at a time); slot (dim,) /
    dense (:, count): the long lists as dense value rows (``build_dense``), added in place
    of their postings (a row absent from the list adds w * 0 = 0, so scores are the same).
    qdims/qw: query dims and weights (penalty terms folded in as negative weights). edims:
    filter-excluded dims.
    acc (B,) f32 and flags (B,) u8 (bit 1 touched, bit 2 banned) are zero on entry and exit.
    In a dense block scan with a full heap, a banned row gets acc = -inf instead of a ban
    bit, and a query list whose dim is also filter-excluded ("sports but not basketball"
    shares dims between the two) is walked once, banning and adding.
    Rows are visited in ascending order block by block, so in a dense block scan a row can
    only enter a full heap with a strictly higher score than the root (ties keep lower rows).
    Unsigned loop/index variables spare numba's negative-index wraparound checks.

    ``prune`` (max-score pruning, exact): dmax/dmin (dim,) are the segment's largest and
    smallest posting value per dim, so list j adds at most ub_j = max(0, w_j * dmax or
    w_j * dmin) to any row. Before a dense block scan with a full heap (root score t), the
    lists with the smallest bounds whose bounds sum (plus a rounding slack) stays below t
    are skipped: a row can then only beat the root if its score from the other lists is
    >= t - that sum - slack, and each such candidate is rescored exactly from the row store
    (row_*), adding w_j * x_rj in query order as the accumulator would, so scores and
    ranking are bit-identical to the plain scan.

    Stored values read approximately (one-byte impacts of a v3 segment, ``qw`` then being
    the weights times each list's scale): ``err`` > 0 bounds how far any row's accumulated
    score can be from its exact one, so a row is a candidate when its accumulated score is
    within err (plus any pruned bounds and slack) of the root, and every candidate is
    rescored exactly from the row store with the exact weights ``rw`` (for exact values
    ``rw`` is ``qw`` and err 0). ``ethr_e`` (ne,): the stored-value threshold above which a
    posting of excluded list i is certainly banned (``ethr`` for exact values); with
    ``recheck`` a candidate is also checked exactly against the excluded dims in the row
    store, for the postings that threshold could not decide.
    """
    rows, vals, offset = seg.rows, seg.vals, seg.offset + start
    slot, dense = seg.slot, seg.dense[:, start : start + count]
    dmax, dmin, fills = seg.dmax, seg.dmin, seg.fills
    row_indptr, row_dims, row_vals = seg.row_indptr[start:], seg.row_dims, seg.row_vals
    qdims, qw, rw, err = q.qdims, q.qw, q.rw, q.err
    edims, ethr, ethr_e, recheck = q.edims, q.ethr, q.ethr_e, q.recheck
    mask, use_mask, prune = q.mask, q.use_mask, q.prune
    acc, flags, touched, hs, hr = work.acc, work.flags, work.touched, work.hs, work.hr
    blk = acc.shape[0]
    k = hs.shape[0]
    nq = qdims.shape[0]
    ne = edims.shape[0]
    cur_q = np.empty(nq, np.int64)
    end_q = np.empty(nq, np.int64)
    postings = 0
    for j in range(nq):
        cur_q[j] = lo_ptr[qdims[j]]
        end_q[j] = hi_ptr[qdims[j]]
        postings += end_q[j] - cur_q[j]
    cur_e = np.empty(ne, np.int64)
    end_e = np.empty(ne, np.int64)
    blk_e = np.empty(ne, np.int64)
    for j in range(ne):
        cur_e[j] = lo_ptr[edims[j]]
        end_e[j] = hi_ptr[edims[j]]
    sparse = postings * SPARSE_RATIO < count
    neg_inf = np.float32(-np.inf)
    chunk = uint64(256)
    # approximate stored values: candidates are rescored (and rechecked) from the row store
    approx = err > 0.0 or recheck
    qo = query_order(qdims)
    # max-score bounds: lists sorted by bound ascending, prefix sums of the bounds (float64)
    order = np.arange(nq)
    prefix = np.zeros(nq + 1, np.float64)
    slack = 0.0
    if prune:
        ub = np.empty(nq, np.float64)
        mag = 0.0
        for j in range(nq):
            d = qdims[j]
            w = np.float64(rw[j])
            hi = w * np.float64(dmax[d]) if w > 0 else w * np.float64(dmin[d])
            ub[j] = max(hi, 0.0)
            mag += abs(w) * max(abs(np.float64(dmax[d])), abs(np.float64(dmin[d])))
        order = np.argsort(ub)
        for i in range(nq):
            prefix[i + 1] = prefix[i] + ub[order[i]]
        # float32 sums of <= nq products err by < (nq + 1) * 2^-24 * mag each (the partial
        # sum in the accumulator and the exact score): 8x margin over both.
        slack = (nq + 2) * mag * 2.0**-21 + 1e-30
    skip = np.zeros(nq, np.bool_)
    # an excluded dim whose every posting is banned (segment minimum > ethr), and for each
    # query list the excluded dim it shares (-1: none): such a list is walked once, setting
    # rows banned instead of adding to them (see ban_acc)
    every = np.zeros(ne, np.bool_)
    for i in range(ne):
        d = edims[i]
        every[i] = dmin.shape[0] > 0 and np.float64(dmin[d]) > ethr and not fills[d]
    q_ex = np.full(nq, -1, np.int64)
    for j in range(nq):
        for i in range(ne):
            if qdims[j] == edims[i]:
                q_ex[j] = i
                break
    e_done = np.zeros(ne, np.bool_)
    for b0 in range(0, count, blk):
        b1 = min(b0 + blk, count)
        nb = uint64(b1 - b0)
        base = offset + b0
        # Once k hits >= 0 are held, untouched rows (score 0, higher row) cannot enter.
        track = sparse and size == k and hs[0] >= 0
        # lists skipped in this block (max-score): their bounds sum to bound_ne < root - slack
        n_ne = 0
        bound_ne = 0.0
        if prune and not track and size == k:
            tcut = np.float64(hs[0]) - slack
            cap = PRUNE_SHARE * np.float64(hs[0])
            while n_ne < nq and prefix[n_ne + 1] < tcut and prefix[n_ne + 1] <= cap:
                n_ne += 1
            bound_ne = prefix[n_ne]
        for i in range(nq):
            skip[order[i]] = i < n_ne
        # With a full heap in a dense scan, a banned row's accumulator is set to -inf, which
        # no addition lifts and no check admits (a row enters only with acc > the root's
        # score): no ban bits to set, read or clear. Otherwise ban bits in flags.
        ban_acc = ne > 0 and not track and size == k
        e_done[:] = False
        nt = 0
        for j in range(nq):
            w = qw[j]
            p0 = cur_q[j]
            if skip[j]:
                cur_q[j] = block_end(rows, p0, end_q[j], b1)
                continue
            sd = slot[qdims[j]]
            if sd >= 0 and not track:
                # a long list: add its dense value row (contiguous, vectorised)
                dv = dense[sd]
                for r in range(nb):
                    acc[r] += w * dv[uint64(b0) + r]
                cur_q[j] = block_end(rows, p0, end_q[j], b1)
                continue
            p1 = block_end(rows, p0, end_q[j], b1)
            cur_q[j] = p1
            r = NO_ROW
            if track:
                for p in range(uint64(p0), uint64(p1)):
                    r = next_row(rows, p, r, b0)
                    if flags[r] == 0:
                        flags[r] = 1
                        touched[nt] = r
                        nt += 1
                    acc[r] += w * vals[p]
            elif ban_acc and q_ex[j] >= 0:
                # this list's dim is also excluded: ban and add in one walk
                e_done[q_ex[j]] = True
                if every[q_ex[j]]:
                    for p in range(uint64(p0), uint64(p1)):
                        r = next_row(rows, p, r, b0)
                        acc[r] = neg_inf
                else:
                    te = ethr_e[q_ex[j]]
                    for p in range(uint64(p0), uint64(p1)):
                        r = next_row(rows, p, r, b0)
                        v = vals[p]
                        if v > te:
                            acc[r] = neg_inf
                        else:
                            acc[r] += w * v
            else:
                for p in range(uint64(p0), uint64(p1)):
                    r = next_row(rows, p, r, b0)
                    acc[r] += w * vals[p]
        for j in range(ne):
            p0 = cur_e[j]
            p1 = block_end(rows, p0, end_e[j], b1)
            blk_e[j] = p1
            if e_done[j]:
                continue
            te = ethr_e[j]
            r = NO_ROW
            if ban_acc and every[j]:
                for p in range(uint64(p0), uint64(p1)):
                    r = next_row(rows, p, r, b0)
                    acc[r] = neg_inf
            elif ban_acc:
                for p in range(uint64(p0), uint64(p1)):
                    r = next_row(rows, p, r, b0)
                    if vals[p] > te:
                        acc[r] = neg_inf
            elif every[j]:
                for p in range(uint64(p0), uint64(p1)):
                    r = next_row(rows, p, r, b0)
                    flags[r] |= 2
            else:
                for p in range(uint64(p0), uint64(p1)):
                    r = next_row(rows, p, r, b0)
                    if vals[p] > te:
                        flags[r] |= 2
        if track:
            for t in range(nt):
                r = uint64(touched[t])
                s = acc[r]
                acc[r] = 0.0
                f = flags[r]
                flags[r] = f & 2
                g = base + np.int64(r)
                if approx:
                    # (a root of +inf: a row's exact score may overflow to +inf too and
                    # win the tie by its lower row, so it is rescored)
                    h0 = np.float64(hs[0])
                    if size == k and h0 < np.inf and np.float64(s) + err < h0:
                        continue
                elif size == k and not better(s, g, hs[0], hr[0]):
                    continue
                if (f & 2) != 0 or (use_mask and not mask[g]):
                    continue
                if approx:
                    lr = b0 + np.int64(r)
                    if recheck and row_banned(row_indptr, row_dims, row_vals, lr, edims, ethr):
                        continue
                    s = row_score(row_indptr, row_dims, row_vals, lr, qdims, rw, qo)
                    if size == k and not better(s, g, hs[0], hr[0]):
                        continue
                size = heap_push(hs, hr, size, s, g)
            for j in range(ne):
                r = NO_ROW
                for p in range(uint64(cur_e[j]), uint64(blk_e[j])):
                    r = next_row(rows, p, r, b0)
                    flags[r] = 0
        else:
            thr = hs[0] if size == k else neg_inf
            # rows enter the per-row check when acc > pre: the root's score, or with skipped
            # lists (n_ne > 0) or approximate values (err > 0) the candidate cut root -
            # bound_ne - err - slack (kept a little low in f32), candidates then being
            # rescored exactly from the row store
            rescore = approx or n_ne > 0
            pre = thr
            if rescore and size == k:
                pre = cut_below(np.float64(thr) - slack - bound_ne - err)
            # One pass over the block: each 256-row chunk is checked and then reset while it
            # is still in L1 (a separate memset pass would stream the block through L2 again).
            for c0 in range(uint64(0), nb, chunk):
                c1 = min(c0 + chunk, nb)
                if size == k:
                    # vectorised pre-check: most chunks hold nothing above the k-th score
                    above = 0
                    for r in range(c0, c1):
                        above += acc[r] > pre
                    if above == 0:
                        for r in range(c0, c1):
                            acc[r] = 0.0
                        continue
                for r in range(c0, c1):
                    s = acc[r]
                    acc[r] = 0.0
                    if s > pre or size < k:
                        g = base + np.int64(r)
                        if (flags[r] & 2) != 0 or (use_mask and not mask[g]):
                            continue
                        if rescore:
                            lr = b0 + np.int64(r)
                            if recheck and row_banned(
                                row_indptr, row_dims, row_vals, lr, edims, ethr
                            ):
                                continue
                            s = row_score(row_indptr, row_dims, row_vals, lr, qdims, rw, qo)
                            if not s > thr:
                                continue
                        size = heap_push(hs, hr, size, s, g)
                        if size == k:
                            thr = hs[0]
                            pre = thr
                            if rescore:
                                pre = cut_below(np.float64(thr) - slack - bound_ne - err)
            if ne > 0 and not ban_acc:
                for r in range(nb):  # only ban bits are set here; a memset beats re-walking
                    flags[r] = 0
        for j in range(ne):
            cur_e[j] = blk_e[j]
    return size


def score_blocks(
    blocks: np.ndarray,
    bsize: int,
    seg: SegmentArrays,
    q: QueryArrays,
    work: Workspace,
    size: int,
) -> int:
    """Score segment ``seg`` (``seg.n_rows`` rows at ``seg.offset``) into the heap, one row
    block at a time (``blocks`` (dim, nb + 1), rows local to blocks of ``bsize``; see
    ``build_dense``): ``score_segment`` on each block's slices, in row order, so results are
    those of one scan; returns the heap's new size.

    The three groups enter numba as plain tuples and are named again inside: numba's
    dispatcher types a plain tuple as fast as separate arguments, a named one several
    microseconds slower per call (a search over 100k items takes a few hundred).
    """
    return score_blocks_tuples(blocks, bsize, tuple(seg), tuple(q), tuple(work), size)


@njit(cache=True, nogil=True)
def score_blocks_tuples(
    blocks: np.ndarray,
    bsize: int,
    seg_t: tuple[Any, ...],
    q_t: tuple[Any, ...],
    work_t: tuple[Any, ...],
    size: int,
) -> int:  # pragma: no cover - numba
    """:func:`score_blocks` on the groups' plain tuples."""
    seg, q, work = SegmentArrays(*seg_t), QueryArrays(*q_t), Workspace(*work_t)
    nb = blocks.shape[1] - 1
    for b in range(nb):
        b0 = b * bsize
        n = min(bsize, seg.n_rows - b0)
        if n <= 0:
            break
        size = score_segment(blocks[:, b], blocks[:, b + 1], b0, n, seg, q, work, size)
    return size


@njit(cache=True, nogil=True)
def valid_layout(
    blocks: np.ndarray,
    post_rows: np.ndarray,
    bsize: int,
    row_indptr: np.ndarray,
    row_dims: np.ndarray,
    count: int,
    dim: int,
    nnz: int,
) -> bool:  # pragma: no cover - numba
    """Check what the unchecked kernels rely on: posting lists tiling their arrays in dim then
    block order (``blocks`` (dim, nb + 1), nb = ceil(count / bsize)), rows of each block's
    list strictly ascending and inside that block, a monotone row indptr ending at the row
    store's length, dims in [0, dim), and (a delta-coded row store) nnz values in it."""
    entries = post_rows.shape[0]  # nnz, plus the fillers of gap-coded rows
    nb = blocks.shape[1] - 1
    if blocks.shape[0] != dim or nb < 1 or bsize < 1 or (nb - 1) * bsize >= max(count, 1):
        return False
    if nb * bsize < count or blocks[0, 0] != 0 or blocks[dim - 1, nb] != entries:
        return False
    for d in range(dim):
        if d > 0 and blocks[d, 0] != blocks[d - 1, nb]:
            return False
        for b in range(nb):
            if blocks[d, b + 1] < blocks[d, b]:
                return False
    bad = False
    # branch-free accumulations so LLVM vectorises the O(nnz) passes
    for d in range(dim):
        for b in range(nb):
            lo, hi = blocks[d, b], blocks[d, b + 1]
            if hi > lo and post_rows.itemsize == 1:  # gaps >= 1 ascend; the last row fits
                n = min(bsize, count - b * bsize)
                last = np.int64(-1)
                for p in range(lo, hi):
                    g = np.int64(post_rows[p])
                    bad |= g == 0
                    last += g
                bad |= bool(last >= n)
            elif hi > lo:
                n = min(bsize, count - b * bsize)
                bad |= (post_rows[lo] < 0) | (post_rows[hi - 1] >= n)
                for p in range(lo + 1, hi):
                    bad |= post_rows[p] <= post_rows[p - 1]
    if row_indptr[0] != 0 or row_indptr[count] != row_dims.shape[0]:
        return False
    for i in range(count):
        bad |= row_indptr[i + 1] < row_indptr[i]
    if bad:  # the row pointers index the row store below only once they are known good
        return False
    if row_dims.itemsize == 1:
        values = np.int64(0)
        for i in range(count):
            at = np.int64(-1)
            for p in range(row_indptr[i], row_indptr[i + 1]):
                at, value = next_dim(row_dims, p, at)
                values += value
            bad |= bool(at >= dim)
        return not bad and values == nnz
    if row_dims.shape[0] != nnz:
        return False
    for p in range(row_dims.shape[0]):
        bad |= (row_dims[p] < 0) | (row_dims[p] >= dim)
    return not bad


@njit(cache=True, nogil=True)
def all_finite(vals: np.ndarray) -> bool:  # pragma: no cover - numba
    """True when no value is NaN or +-inf (v - v is 0 exactly for finite v); branch-free."""
    bad = False
    for p in range(vals.shape[0]):
        bad |= (vals[p] - vals[p]) != 0.0
    return not bad
