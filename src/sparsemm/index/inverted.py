"""Embedded inverted index over sparse codes: the project's default store.

:class:`InvertedIndex` implements the store interface (:class:`~sparsemm.index.store.Store`,
backend ``local``) that the served path reads; it is built and appended to with its own
``build``/``add`` below.

Items are sparse codes ``(n, dim)`` float32 (any sign) with a parallel list of string ids.
Search is exact top-k by inner product, computed over the query's dimensions only, with
optional exclusion of dimensions (hard filter or score penalty) and an optional row subset.

On disk (format ``sparsemm.index``, version 3) an index is a folder::

    manifest.json          format, version, dim, count, nnz, meta, next_segment,
                           segments: [{"name", "count", "nnz", "sha256"}, ...] in row
                           order; "sha256" maps each file of the segment to its SHA-256
    .lock                  writer lock file (fcntl.flock, exclusive, non-blocking)
    seg-000001-<hex>/      one immutable segment holding rows [start, start + count)
        post_blocks.npy    (dim, B + 1) int64  B = ceil(count / 65536) row blocks: the
                           postings of dim d in block b are [blocks[d, b], blocks[d, b+1])
        post_rows.npy      (entries,) uint8  gap from the previous row of the list in its
                           block (the first from -1); a gap over 255 takes filler
                           postings of gap 255 and impact 0 (kernels.next_row). Or, when
                           that takes more bytes, (nnz,) uint16 rows within the block
        post_imps.npy      (entries,) uint8  one-byte impact: value ~ impact * max_d / 255
        list_stats.npy     (4, dim) float64  per list: largest value max_d, smallest value,
                           the largest |value - impact * max_d / 255| (measured), fillers
        row_indptr.npy     (count + 1,) int64  row-major store of the exact values (rescoring,
                           explanations, merges)
        row_dims.npy       uint8 deltas from the row's previous dim (the first from -1; 0 is
                           a filler entry of value 0 advancing 255). Or, when that takes
                           more bytes, (nnz,) uint16 dims (int32 if dim > 65536)
        row_vals.npy       float32, parallel to row_dims
        ids.json           list of ``count`` ids

7 bytes per non-zero (2 per posting, 5 per row-store entry) plus fillers, which close dims
and frequent lists do not need. A search reads the impacts to find candidates, bounds each
item's error, and rescores the candidates exactly from the row store, so results are those
of float32 posting values. Segments holding a negative value
are written in the v2 layout instead (``post_vals.npy`` (nnz,) float32 in place of the
impacts and stats: 12 bytes per non-zero); v2 and v1 segments (post_indptr (dim + 1,),
int32 rows and dims: 16 bytes) are still read and searched, and merges rewrite them (as v3
when no value is negative).

Write protocol: ``add`` takes the writer lock, writes a brand-new segment folder (every file
written to a temp name, fsynced, renamed), then swaps ``manifest.json`` atomically. The
manifest is the commit point: a crash before it leaves the previous manifest, which only
names complete segments, so the old index opens unchanged; unreferenced segment folders are
removed by the next writer. After the commit, while the segment before the newest one is no
larger than the newest, the two are merged into one new segment (same commit protocol), so
segment sizes grow geometrically: at most ~log2(n / batch) segments and each item rewritten
O(log n) times. ``compact()`` merges everything into one segment. Rows are numbered in
insertion order and never change (there are no deletes). ``build(..., overwrite=True)``
replaces an index the same way: under the lock it writes the new segment beside the old
ones, commits one manifest naming only it, then deletes the old segments, so the old index
stays readable in full until the commit and a crash before it leaves it unchanged.

Readers memory-map the arrays (``np.load(mmap_mode="r", allow_pickle=False)``) and check
their layout and the finiteness of their values once (O(nnz)), so a damaged file raises
SparsemmError instead of reaching the unchecked kernels; ``warm()`` faults all pages in.
Each segment file's SHA-256 (written with the segment) is verified the first time this
process opens that file (remembered by path, inode, size and mtime: segments are immutable,
so a reload or a second open does not hash again), so a changed value - a finite one too -
is refused by name. Segments written before the checksums open with a warning (layout and
finiteness checked only); ``sparsemm index`` rebuilds them. An opened index is a snapshot;
``reload()`` picks up later commits (the writing object is updated in place). Old segment
files deleted by a merge stay readable through existing maps (POSIX); a reader that finds a
segment file gone while opening re-reads the manifest and retries.

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

import contextlib
import hashlib
import json
import logging
import re
import secrets
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.index.kernels import (
    QueryArrays,
    SegmentArrays,
    Workspace,
    clean_query,
    copy_runs,
    heap_sort,
    rescore_pool,
    rescore_rows,
    run_nnz,
    score_blocks,
)
from sparsemm.index.segments import (
    LOCK_FILE,
    MANIFEST,
    Segment,
    load_segment,
    merge_segments,
    write_segment,
    writer_lock,
)
from sparsemm.index.store import Store
from sparsemm.io import (
    fsync_dir,
    json_sha256,
    read_json,
    write_json,
)

logger = logging.getLogger(__name__)

FORMAT = "sparsemm.index"
VERSION = 3  # 3: one-byte impacts in the posting lists (segments.ARRAYS_V3); 2: block-local
# uint16 posting rows (segments.ARRAYS_V2); both, and 1, are read
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
_MAX_ROWS = 2**31 - 1  # rows are stored as int32
# Exact search over v3 segments first rescores a pool of the best max(POOL_MIN, 2k) rows by
# impact score (InvertedIndex._exact_top), for k <= POOL_MAX_K. On the benchmark's uniform
# codes (200 queries, k = 10) a pool of 20 certified every top 10 at 100k and 1M items, and
# scanned faster than one of 32 (a larger heap lets more rows in): 0.119-0.126 against
# 0.127-0.133 ms at 100k, 0.613-0.637 against 0.634-0.645 ms at 1M.
POOL_MIN = 16
POOL_MAX_K = 100
_SEG_RE = re.compile(r"^seg-\d{6}-[0-9a-f]+$")

QueryLike = Any  # 1-row sparse matrix | dense (dim,) array | (dims, weights) pair


# --------------------------------------------------------------------------------------------
# Public value types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Exclusion:
    """Dimensions to leave out of a search.

    ``mode="filter"``: drop every item whose value on any of ``dims`` is > ``threshold``
    (``weights`` are ignored; ``threshold`` must be >= 0 because items absent from a dim
    have value 0 there). ``mode="penalty"``: subtract ``penalty * sum_j w_j * x_ij`` over
    ``dims`` from each item's score (``weights`` default to 1).
    """

    dims: Sequence[int] | np.ndarray
    weights: Sequence[float] | np.ndarray | None = None
    threshold: float = 0.0
    mode: Literal["filter", "penalty"] = "filter"
    penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("filter", "penalty"):
            raise SparsemmError(f"exclusion mode must be 'filter' or 'penalty', got {self.mode!r}")
        if not np.isfinite(self.threshold) or self.threshold < 0:
            raise SparsemmError(
                f"exclusion threshold must be a finite number >= 0, got {self.threshold}"
            )
        if not np.isfinite(self.penalty):
            raise SparsemmError(f"exclusion penalty must be finite, got {self.penalty}")


@dataclass
class SearchResult:
    """Top-k hits, best first: ``rows`` (k,) int64, ``ids`` k strings, ``scores`` (k,) f32."""

    rows: np.ndarray
    ids: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def check_codes(codes: Any, dim: int) -> sp.csr_matrix:
    """Validate and canonicalise a (n, dim) code matrix into a fresh float32 CSR copy."""
    if sp.issparse(codes):
        if codes.ndim != 2:
            raise SparsemmError(f"codes: expected a 2-D (n, {dim}) matrix, got {codes.shape}")
        csr = sp.csr_matrix(codes, dtype=np.float32, copy=True)
    else:
        arr = np.asarray(codes)
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
            raise SparsemmError(
                f"codes: expected a 2-D numeric (n, {dim}) matrix, got shape {arr.shape} "
                f"dtype {arr.dtype}"
            )
        csr = sp.csr_matrix(arr.astype(np.float32))
    if csr.shape[1] != dim:
        raise SparsemmError(f"codes: the index has dimension {dim}, got {csr.shape[1]}")
    if not np.isfinite(csr.data).all():
        bad_rows = np.unique(
            np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))[~np.isfinite(csr.data)]
        )
        raise SparsemmError(
            f"codes: {len(bad_rows)} row(s) contain NaN or inf (first: row {bad_rows[0]}); "
            "re-encode those items"
        )
    csr.sum_duplicates()
    csr.eliminate_zeros()
    csr.sort_indices()
    return csr


def check_items(codes: Any, ids: Sequence[str], dim: int) -> tuple[sp.csr_matrix, list[str]]:
    """Validate items to add: (canonical float32 CSR (n, dim), n unique non-empty ids)."""
    if isinstance(ids, str):
        raise SparsemmError("ids must be a list of strings, not one string")
    csr = check_codes(codes, dim)
    id_list = [str(i) for i in ids]
    if len(id_list) != csr.shape[0]:
        raise SparsemmError(f"{csr.shape[0]} codes for {len(id_list)} ids; they must match")
    if any(not i for i in id_list):
        raise SparsemmError("every item needs a non-empty id")
    if len(set(id_list)) != len(id_list):
        seen: set[str] = set()
        for i in id_list:
            if i in seen:
                raise SparsemmError(f"duplicate id {i!r} in the items to add; ids must be unique")
            seen.add(i)
    return csr, id_list


def _check_dims(dims: Any, dim: int, what: str, unique: bool = False) -> np.ndarray:
    """Validate a 1-D list of dimensions in [0, dim) -> int64 array (sorted unique if asked)."""
    arr = np.asarray(dims)
    if arr.size == 0:
        return _EMPTY_I64
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise SparsemmError(f"{what}: expected a 1-D list of integer dimensions, got {arr!r}")
    if unique:
        arr = np.unique(arr)
        lo, hi = arr[0], arr[-1]
    else:
        lo, hi = arr.min(), arr.max()
    if lo < 0 or hi >= dim:
        raise SparsemmError(f"{what}: dimensions must lie in [0, {dim}), got {lo}..{hi}")
    return arr.astype(np.int64, copy=False)


def _check_weights(weights: Any, n: int, what: str) -> np.ndarray:
    arr = np.asarray(weights, dtype=np.float64)
    if arr.shape != (n,):
        raise SparsemmError(f"{what}: expected {n} weights, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise SparsemmError(f"{what}: weights contain NaN or inf")
    return arr


def as_query(query: QueryLike, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalise a query to (dims (m,) int64 ascending unique, weights (m,) float32)."""
    if sp.issparse(query):
        if query.shape != (1, dim):
            raise SparsemmError(f"query: expected a (1, {dim}) sparse row, got {query.shape}")
        q = query if query.format == "csr" else sp.csr_matrix(query)
        if not q.has_canonical_format:
            q = q.copy()
            q.sum_duplicates()
        dims, w = q.indices, q.data
    elif isinstance(query, tuple) and len(query) == 2:
        dims = _check_dims(query[0], dim, "query")
        w = np.asarray(query[1])
        if w.shape != dims.shape or not np.issubdtype(w.dtype, np.number):
            raise SparsemmError(
                f"query: {len(dims)} dims need {len(dims)} numeric weights, got {w.shape}"
            )
        if len(dims) > 1 and not (np.diff(dims) > 0).all():
            uniq, inv = np.unique(dims, return_inverse=True)
            w = np.bincount(inv, weights=w.astype(np.float64), minlength=len(uniq))
            dims = uniq
    else:
        arr = np.asarray(query)
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.shape != (dim,) or not np.issubdtype(arr.dtype, np.number):
            raise SparsemmError(
                f"query: expected a (1, {dim}) sparse row, a ({dim},) array or a "
                f"(dims, weights) pair, got {type(query).__name__} of shape {arr.shape}"
            )
        dims = np.flatnonzero(arr)
        w = arr[dims]
    if np.iscomplexobj(w):
        raise SparsemmError("query: weights must be real numbers")
    out_dims, out_w, bad = clean_query(dims, w)
    if bad:
        raise SparsemmError("query: weights contain NaN or inf; re-encode the query")
    return out_dims, out_w


_EMPTY_I64 = np.zeros(0, np.int64)
_EMPTY_F32 = np.zeros(0, np.float32)


class Plan(NamedTuple):
    """Resolved exclusion for the kernel: extra (dims, weights) and filtered dims."""

    extra_dims: np.ndarray = _EMPTY_I64
    extra_w: np.ndarray = _EMPTY_F32
    ban_dims: np.ndarray = _EMPTY_I64
    threshold: float = 0.0


_NO_PLAN = Plan()


def plan_exclusion(exclude: Exclusion | None, dim: int) -> Plan:
    if exclude is None:
        return _NO_PLAN
    if not isinstance(exclude, Exclusion):
        raise SparsemmError(f"exclude must be an Exclusion, got {type(exclude).__name__}")
    if exclude.mode == "filter":
        dims = _check_dims(exclude.dims, dim, "exclusion", unique=True)
        return Plan(ban_dims=dims, threshold=float(exclude.threshold))
    dims = _check_dims(exclude.dims, dim, "exclusion")
    w = (
        np.ones(len(dims))
        if exclude.weights is None
        else _check_weights(exclude.weights, len(dims), "exclusion")
    )
    # penalty * sum_j w_j x_ij is a scatter-add with negative weights
    return Plan(extra_dims=dims, extra_w=(-float(exclude.penalty) * w).astype(np.float32))


# --------------------------------------------------------------------------------------------
# The index
# --------------------------------------------------------------------------------------------


class InvertedIndex(Store):
    """An on-disk inverted index of sparse codes (see the module docstring for the format).

    Use ``InvertedIndex.create(path, dim)`` or ``InvertedIndex.build(path, codes, ids)`` to
    make one and ``InvertedIndex.open(path)`` to read one. As a
    :class:`~sparsemm.index.store.Store` it needs no closing (its maps go with the object).
    """

    backend: ClassVar[str] = "local"

    def __init__(
        self,
        root: Path,
        manifest: dict[str, Any],
        segments: list[Segment],
        block_rows: int = BLOCK,
    ) -> None:
        if not isinstance(block_rows, int) or block_rows < 1:
            raise SparsemmError(f"block_rows must be a positive integer, got {block_rows!r}")
        self._root = root
        self._block = block_rows
        # Max-score pruning in dense block scans (exact; see score_segment). False runs the
        # plain scan: same results, kept for benchmarks and tests that compare the two.
        self.pruning = True
        self._local = threading.local()
        self._in_memory = False
        self._set_state(manifest, segments)

    # ----- construction ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | Path,
        dim: int,
        overwrite: bool = False,
        meta: dict[str, Any] | None = None,
    ) -> InvertedIndex:
        """Create an empty index folder for ``dim``-dimensional codes and open it.

        ``meta`` (JSON-able, e.g. the model that produced the codes) is kept in the manifest.
        An existing index is replaced only with ``overwrite=True``.
        """
        return cls._write_new(Path(path), dim, overwrite, meta, None)

    @classmethod
    def build(
        cls,
        path: str | Path,
        codes: Any,
        ids: Sequence[str],
        dim: int | None = None,
        overwrite: bool = False,
        meta: dict[str, Any] | None = None,
    ) -> InvertedIndex:
        """Create an index from ``codes`` (n, dim) and ``ids`` in one go (one segment).

        With ``overwrite=True`` an existing index is replaced atomically: it stays readable
        in full until one manifest swap commits the new index (see the module docstring).
        """
        if dim is None:
            shape = getattr(codes, "shape", None)
            if shape is None or len(shape) != 2:
                raise SparsemmError("codes: expected a 2-D (n, dim) matrix")
            dim = int(shape[1])
        _check_dim(dim)
        csr, id_list = check_items(codes, ids, dim)  # before touching the folder
        return cls._write_new(Path(path), dim, overwrite, meta, (csr, id_list))

    @classmethod
    def _write_new(
        cls,
        root: Path,
        dim: int,
        overwrite: bool,
        meta: dict[str, Any] | None,
        items: tuple[sp.csr_matrix, list[str]] | None,
    ) -> InvertedIndex:
        """Commit a new index at ``root`` holding ``items`` (checked) or nothing.

        Under the writer lock: write the segment, swap in one manifest naming only it (the
        commit point), then delete every other segment. A crash before the commit leaves the
        previous index (or, in a fresh folder, no manifest and leftovers the next call
        clears); a crash after it leaves orphaned segments the next writer sweeps.
        """
        _check_dim(dim)
        try:
            json.dumps(meta or {})
        except (TypeError, ValueError) as exc:
            raise SparsemmError(f"index meta must be JSON-serialisable ({exc})") from exc
        if items is not None and len(items[1]) > _MAX_ROWS:
            raise SparsemmError(f"an index holds at most {_MAX_ROWS} items")
        if root.exists() and not root.is_dir():
            raise SparsemmError(f"{root} exists and is not a folder; choose another index path")
        if not (root / MANIFEST).is_file():
            if root.is_dir() and not _only_leftovers(root):
                raise SparsemmError(
                    f"{root} exists and is not an empty folder; choose another index path"
                )
            root.mkdir(parents=True, exist_ok=True)
        else:
            _check_replaceable(root, overwrite)
        with writer_lock(root):
            seq = 1
            if (root / MANIFEST).is_file():  # again under the lock: another writer may race
                seq = _check_replaceable(root, overwrite)
            manifest: dict[str, Any] = {
                "format": FORMAT,
                "version": VERSION,
                "dim": int(dim),
                "count": 0,
                "nnz": 0,
                "meta": dict(meta or {}),
                "next_segment": seq,
                "segments": [],
            }
            if items is not None and items[1]:
                csr, id_list = items
                name = f"seg-{seq:06d}-{secrets.token_hex(4)}"
                digests = write_segment(
                    root / name, int(dim), csr.indptr, csr.indices, csr.data, id_list
                )
                seg = {"name": name, "count": len(id_list), "nnz": int(csr.nnz), "sha256": digests}
                manifest.update(
                    count=seg["count"], nnz=seg["nnz"], next_segment=seq + 1, segments=[seg]
                )
            manifest["meta_sha256"] = meta_digest(manifest["meta"])
            write_json(root / MANIFEST, manifest)
            fsync_dir(root)
            _remove_unreferenced(root, {str(s["name"]) for s in manifest["segments"]})
            segments = [load_segment(root, m, 0, int(dim)) for m in manifest["segments"]]
        logger.info("created index %s (dim %d, %d items)", root, dim, manifest["count"])
        return cls(root, manifest, segments)

    @classmethod
    def open(
        cls, path: str | Path, *, block_rows: int = BLOCK, in_memory: bool = False
    ) -> InvertedIndex:
        """Open an index folder; arrays are memory-mapped read-only, or with ``in_memory``
        read into memory (a long-running server: a segment file cut short in place by
        another process then cannot end it with SIGBUS; see :meth:`check_files`).

        ``block_rows``: rows per scoring block (a tuning knob; results do not depend on it).
        """
        root = Path(path)
        manifest, segments = _read_index(root, in_memory=in_memory)
        index = cls(root, manifest, segments, block_rows=block_rows)
        index._in_memory = in_memory
        return index

    @property
    def in_memory(self) -> bool:
        """Segments are read into memory (:meth:`open`'s ``in_memory``), not mapped."""
        return self._in_memory

    def hold_in_memory(self) -> None:
        """Read the segments of the version this index shows into memory (instead of
        mapping them) from now on; reloads and commits read them so too. Derived lists
        (dense rows, impacts) are built again on first use."""
        if self._in_memory:
            return
        loaded, start = [], 0
        for meta in self._manifest["segments"]:
            try:
                seg = load_segment(self._root, meta, start, self._dim, in_memory=True)
            except FileNotFoundError as exc:
                raise SparsemmError(
                    f"index {self._root} changed while being read into memory ({exc}); "
                    "open it again"
                ) from exc
            loaded.append(seg)
            start += seg.count
        self._in_memory = True
        self._set_state(self._manifest, loaded)

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

    def check_files(self) -> None:
        """SparsemmError when a segment file changed on disk since it was read: cut short
        in place while mapped (reading it would end the process with a bus error), or
        rewritten with content that no longer matches its checksum (same size, other
        values: what a fresh process refuses). A server calls this before each search (a
        few stat calls; a file whose stat changed is hashed again, once per version)."""
        for seg in self._segments:
            changed = seg.changed_files()
            if changed:
                path, how = changed[0]
                raise SparsemmError(
                    f"index {self._root}: {Path(path).parent.name}/{Path(path).name} {how}; "
                    "rebuild the index with `sparsemm index`"
                )

    def reload(self) -> None:
        """Re-read the folder to see commits made by other writers since opening."""
        manifest, segments = _read_index(self._root, in_memory=self._in_memory)
        self._set_state(manifest, segments)

    def _set_state(self, manifest: dict[str, Any], segments: list[Segment]) -> None:
        self._manifest = manifest
        self._dim = int(manifest["dim"])
        self._segments = segments
        self._count = sum(s.count for s in segments)
        self._all_ids: list[str] = [i for s in segments for i in s.ids]
        self._ids_view: tuple[str, ...] | None = None
        self._id_to_row: dict[str, int] | None = None
        self._starts = np.asarray([s.start for s in segments], np.int64)

    # ----- properties -----------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._root

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self._manifest.get("meta", {}))

    @property
    def digest(self) -> str:
        """16 hex digits of the SHA-256 of the committed segment list (names, counts,
        checksums): changes with every commit that changes the items."""
        segments = json.dumps(self._manifest.get("segments", []), sort_keys=True).encode()
        return hashlib.sha256(segments).hexdigest()[:16]

    @property
    def nnz(self) -> int:
        return sum(s.nnz for s in self._segments)

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    @property
    def nbytes(self) -> int:
        """Bytes of the array files (posting lists + row-major copy), ids excluded."""
        return sum(s.nbytes for s in self._segments)

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
        (:mod:`sparsemm.query.two_stage`)."""
        return all(bool((s.dim_bounds()[1] >= 0).all()) for s in self._segments)

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return (
            f"InvertedIndex({str(self._root)!r}, dim={self._dim}, count={self._count}, "
            f"segments={len(self._segments)})"
        )

    @property
    def ids(self) -> tuple[str, ...]:
        """All item ids in row order."""
        if self._ids_view is None:
            self._ids_view = tuple(self._all_ids)
        return self._ids_view

    def row_of(self, ids: str | Sequence[str]) -> np.ndarray:
        """Rows (m,) int64 of the given ids; unknown ids raise SparsemmError."""
        if self._id_to_row is None:
            self._id_to_row = {i: r for r, i in enumerate(self._all_ids)}
        single = isinstance(ids, str)
        wanted = [ids] if isinstance(ids, str) else list(ids)
        missing = [i for i in wanted if i not in self._id_to_row]
        if missing:
            raise SparsemmError(
                f"{len(missing)} id(s) not in index {self._root} (first: {missing[0]!r})"
            )
        rows = np.asarray([self._id_to_row[i] for i in wanted], np.int64)
        return rows[:1] if single else rows

    def codes(self, rows: int | Sequence[int] | np.ndarray) -> sp.csr_matrix:
        """Stored codes of ``rows`` as a (len(rows), dim) float32 CSR matrix (each row's dims
        ascending, as the row store keeps them)."""
        r = np.atleast_1d(np.asarray(rows))
        if r.size and (not np.issubdtype(r.dtype, np.integer) or r.ndim != 1):
            raise SparsemmError(f"rows must be integers, got {r.dtype}")
        r = r.astype(np.int64)
        if r.size and (r.min() < 0 or r.max() >= self._count):
            raise SparsemmError(f"rows must lie in [0, {self._count}), got {r.min()}..{r.max()}")
        seg_of = np.searchsorted(self._starts, r, side="right") - 1
        starts = np.zeros(len(r), np.int64)  # where each row's run begins in its segment
        lens = np.zeros(len(r), np.int64)  # its entries in the row store
        nnz = np.zeros(len(r), np.int64)  # its values (a delta-coded run has fillers too)
        for si in np.unique(seg_of):
            s = self._segments[si]
            sel = seg_of == si
            local = r[sel] - s.start
            starts[sel] = s.row_indptr[local]
            lens[sel] = s.row_indptr[local + 1] - starts[sel]
            nnz[sel] = run_nnz(s.row_dims, starts[sel], lens[sel])
        indptr = np.zeros(len(r) + 1, np.int64)
        np.cumsum(nnz, out=indptr[1:])
        dims = np.empty(int(indptr[-1]), np.int32)
        vals = np.empty(int(indptr[-1]), np.float32)
        for si in np.unique(seg_of):
            s = self._segments[si]
            sel = np.flatnonzero(seg_of == si)
            copy_runs(s.row_dims, s.row_vals, starts[sel], lens[sel], indptr[sel], dims, vals)
        return sp.csr_matrix((vals, dims, indptr), shape=(len(r), self._dim))

    # ----- writing --------------------------------------------------------------------------

    def add(self, codes: Any, ids: Sequence[str]) -> None:
        """Append items: ``codes`` (n, dim) sparse or dense, ``ids`` n new unique strings.

        Raises SparsemmError on a wrong dimension, NaN/inf values, duplicate or empty ids,
        or when another writer holds the lock. Atomic: on any failure the committed index is
        unchanged.
        """
        csr, id_list = check_items(codes, ids, self._dim)
        self._add_checked(csr, id_list)

    def _add_checked(self, csr: sp.csr_matrix, id_list: list[str]) -> None:
        if not id_list:
            return
        with writer_lock(self._root):
            on_disk = read_json(self._root / MANIFEST)
            if on_disk != self._manifest:  # another writer committed since we loaded
                self.reload()
                if csr.shape[1] != self._dim:  # the index was rebuilt with another dim
                    raise SparsemmError(
                        f"codes: the index has dimension {self._dim}, got {csr.shape[1]}"
                    )
            if self._count + len(id_list) > _MAX_ROWS:
                raise SparsemmError(f"an index holds at most {_MAX_ROWS} items")
            if self._id_to_row is None:
                self._id_to_row = {i: r for r, i in enumerate(self._all_ids)}
            clash = next((i for i in id_list if i in self._id_to_row), None)
            if clash is not None:
                raise SparsemmError(f"id {clash!r} is already in index {self._root}")
            name = self._new_segment_name()
            digests = write_segment(
                self._root / name, self._dim, csr.indptr, csr.indices, csr.data, id_list
            )
            meta = {"name": name, "count": len(id_list), "nnz": int(csr.nnz), "sha256": digests}
            self._commit([*self._manifest["segments"], meta])
            logger.info("index %s: added %d items (segment %s)", self._root, len(id_list), name)
            try:
                while len(self._segments) >= 2 and (
                    self._segments[-2].count <= self._segments[-1].count
                ):
                    self._merge_tail(2)
            except Exception as exc:  # the add is committed; an unmerged index is still valid
                logger.warning("index %s: segment merge failed (%s); continuing", self._root, exc)
            _remove_unreferenced(self._root, {s.name for s in self._segments})

    def compact(self) -> None:
        """Merge all segments into one (faster search after many small adds)."""
        with writer_lock(self._root):
            on_disk = read_json(self._root / MANIFEST)
            if on_disk != self._manifest:
                self.reload()
            if len(self._segments) > 1:
                self._merge_tail(len(self._segments))
            _remove_unreferenced(self._root, {s.name for s in self._segments})

    def _new_segment_name(self) -> str:
        seq = int(self._manifest.get("next_segment", 1))
        return f"seg-{seq:06d}-{secrets.token_hex(4)}"

    def _merge_tail(self, m: int) -> None:
        """Merge the last ``m`` segments into one new segment and commit it."""
        segs = self._segments[-m:]
        (row_indptr, row_dims, row_vals), post = merge_segments(segs, self._dim)
        ids = [i for s in segs for i in s.ids]
        name = self._new_segment_name()
        digests = write_segment(
            self._root / name, self._dim, row_indptr, row_dims, row_vals, ids, post=post
        )
        meta = {"name": name, "count": len(ids), "nnz": int(row_indptr[-1]), "sha256": digests}
        self._commit([*self._manifest["segments"][:-m], meta])
        logger.info("index %s: merged %d segments into %s", self._root, m, name)

    def _commit(self, segments: list[dict[str, Any]]) -> None:
        """Swap in a manifest naming ``segments`` (the commit point), then load it."""
        manifest = dict(self._manifest)
        manifest["version"] = VERSION  # new segments are written in this version's layout
        manifest["segments"] = segments
        manifest["count"] = sum(int(s["count"]) for s in segments)
        manifest["nnz"] = sum(int(s["nnz"]) for s in segments)
        manifest["next_segment"] = int(self._manifest.get("next_segment", 1)) + 1
        manifest["meta_sha256"] = meta_digest(manifest.get("meta", {}))
        write_json(self._root / MANIFEST, manifest)
        fsync_dir(self._root)
        # Reuse the maps of unchanged segments; map the new one.
        kept = {s.name: s for s in self._segments}
        loaded, start = [], 0
        for meta in segments:
            seg = kept.get(meta["name"]) or load_segment(
                self._root, meta, start, self._dim, self._in_memory
            )
            loaded.append(seg)
            start += seg.count
        self._set_state(manifest, loaded)

    # ----- search ---------------------------------------------------------------------------

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
                dmax=_EMPTY_F32,
                dmin=_EMPTY_F32,
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
        a certificate needs (the served path, :mod:`sparsemm.query.two_stage`). A posting
        costs 3 bytes of memory traffic here against 6 in :meth:`search`, which is what a
        search over many long lists waits on. An index holding a negative value is searched
        exactly instead (err 0)."""
        k = check_k(k)
        dims, w = as_query(query, self._dim)
        if not self.nonnegative:
            return self._search_one(dims, w, k, _NO_PLAN, None, with_ids=False), 0.0
        rows, scores, err = self._scan(dims, w, k, _NO_PLAN, None, quantized=True)
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


def check_k(k: Any) -> int:
    if type(k) is int and k >= 1:
        return k
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise SparsemmError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _read_index(
    root: Path, attempts: int = 5, in_memory: bool = False
) -> tuple[dict[str, Any], list[Segment]]:
    """Read manifest + segments; retry if a concurrent merge removed a segment meanwhile."""
    if not (root / MANIFEST).is_file():
        raise SparsemmError(
            f"{root} is not a sparsemm index (no {MANIFEST}); build one with `sparsemm index`"
        )
    last_missing: Path | None = None
    for _ in range(attempts):
        manifest = read_json(root / MANIFEST)
        _check_manifest(root, manifest)
        try:
            segments, start = [], 0
            for meta in manifest["segments"]:
                seg = load_segment(root, meta, start, int(manifest["dim"]), in_memory)
                segments.append(seg)
                start += seg.count
        except FileNotFoundError as exc:
            missing = exc.filename or (exc.args[0] if exc.args else None)
            last_missing = Path(str(missing)) if missing is not None else None
            if read_json(root / MANIFEST) != manifest:
                continue  # a writer committed meanwhile: read the new manifest
            break
        if start != int(manifest["count"]):
            raise SparsemmError(f"index {root}: segment counts disagree with the manifest")
        return manifest, segments
    raise SparsemmError(f"index {root} is incomplete: {last_missing} is missing; rebuild the index")


def _check_manifest(root: Path, manifest: Any) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SparsemmError(f"{root}/{MANIFEST} is not a {FORMAT} manifest")
    version, dim = manifest.get("version"), manifest.get("dim")
    if isinstance(version, bool) or not isinstance(version, int):
        raise SparsemmError(
            f"{root}/{MANIFEST} has no valid format version ({version!r}); rebuild the index"
        )
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise SparsemmError(f"{root}/{MANIFEST} has no valid dim ({dim!r}); rebuild the index")
    if version > VERSION:
        raise SparsemmError(
            f"{root} was written by a newer sparsemm (index format v{manifest.get('version')}, "
            f"this one reads v{VERSION}); upgrade sparsemm"
        )
    if not isinstance(manifest.get("segments"), list) or int(manifest.get("dim", 0)) < 1:
        raise SparsemmError(f"{root}/{MANIFEST} is malformed; rebuild the index")
    count = manifest.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise SparsemmError(
            f"{root}/{MANIFEST} has no valid item count ({str(count)[:40]}); rebuild the index"
        )
    for seg in manifest["segments"]:
        counts = [seg.get(k) for k in ("count", "nnz")] if isinstance(seg, dict) else [None]
        if (
            not isinstance(seg, dict)
            or not isinstance(seg.get("name"), str)
            or not seg["name"]
            or "/" in seg["name"]
            or seg["name"] in (".", "..")
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts)
        ):
            raise SparsemmError(
                f"{root}/{MANIFEST} lists a malformed segment ({str(seg)[:80]}); rebuild the index"
            )
    meta = manifest.get("meta", {})
    if not isinstance(meta, dict):
        raise SparsemmError(f"{root}/{MANIFEST}: 'meta' is not an object; rebuild the index")
    recorded = manifest.get("meta_sha256")
    if recorded is None:
        if meta:
            logger.warning(
                "index %s records no checksum of its metadata (written by an older sparsemm): "
                "the model, top_k and labels it names are not verified; `sparsemm index` "
                "writes it again",
                root,
            )
    elif recorded != meta_digest(meta):
        raise SparsemmError(
            f"{root}/{MANIFEST}: its metadata (model, top_k, labels) does not match its "
            "checksum (edited or damaged); rebuild the index with `sparsemm index`"
        )


def meta_digest(meta: Any) -> str:
    """SHA-256 of an index's metadata in a canonical JSON form (the manifest records it)."""
    return json_sha256(meta)


def _check_dim(dim: Any) -> None:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise SparsemmError(f"index dimension must be a positive integer, got {dim!r}")


def _check_replaceable(root: Path, overwrite: bool) -> int:
    """Check that the index at ``root`` may be replaced; return its next segment number."""
    if not overwrite:
        raise SparsemmError(
            f"an index already exists at {root}; open it, or pass overwrite=True "
            "(--overwrite) to replace it"
        )
    old = read_json(root / MANIFEST)
    if not isinstance(old, dict) or old.get("format") != FORMAT:
        raise SparsemmError(f"{root} holds something other than an index; not replacing it")
    seq = old.get("next_segment", 1)
    return seq if type(seq) is int and seq >= 1 else 1


def _is_leftover(p: Path) -> bool:
    """The lock file, a segment folder or a manifest temp file: what an index writer makes."""
    if p.name == LOCK_FILE:
        return p.is_file()
    if _SEG_RE.match(p.name):
        return p.is_dir()
    return p.is_file() and p.name.startswith(f".{MANIFEST}.") and p.name.endswith(".tmp")


def _only_leftovers(root: Path) -> bool:
    """True if ``root`` holds nothing but what a build interrupted before its commit left."""
    return all(_is_leftover(p) for p in root.iterdir())


def _remove_unreferenced(root: Path, keep: set[str]) -> None:
    """Delete segment folders and temp files no manifest names (left by crashes/merges)."""
    for p in root.iterdir():
        if p.is_dir() and _SEG_RE.match(p.name) and p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_file() and p.name.startswith(f".{MANIFEST}.") and p.name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                p.unlink()
