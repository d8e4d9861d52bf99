"""The inverted index's segments on disk: each an immutable folder of ``.npy`` arrays (posting
lists by dimension, and the row store by item) plus ``ids.json``, written atomically, read
memory-mapped, checked against their SHA-256 and layout once per file version, and merged;
and the writer lock of an index folder. :class:`~sparsemm.index.inverted.InvertedIndex`
commits them through its manifest.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.index.kernels import (
    all_finite,
    block_pointers,
    build_dense,
    count_fillers,
    count_gap_fillers,
    decode_rows,
    dim_bounds,
    encode_deltas,
    encode_gaps,
    global_rows,
    quantize_lists,
    truncate_lists,
    valid_layout,
)
from sparsemm.io import (
    VERIFIED,
    VERIFIED_LOCK,
    file_key,
    fsync_dir,
    load_npy,
    read_json,
    save_npy,
    sha256_file,
    write_json,
)

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"  # the index's commit record (sparsemm.index.inverted)

LOCK_FILE = ".lock"
# Segment layouts. v2 (written since index format 2) keeps each posting list's rows local to
# row blocks of BLOCK_SHIFT bits as uint16, with the start of every block in every list in
# post_blocks (dim, blocks + 1) int64, and the row store's dims as uint16 when dim <= 65536:
# 12 bytes per non-zero instead of 16. v1 (int32 rows and dims, post_indptr) is still read;
# in memory it is one row block covering the segment.
# v3 (written since index format 3 for segments without negative values) stores each posting
# value as a one-byte impact (post_imps, value ~ impact * list max / 255) instead of float32,
# with each list's largest and smallest value, its measured quantisation error and its
# filler postings in list_stats (4, dim) float64; the exact float32 values live once, in the
# row store, and a search rescores its candidates from there. Where it takes fewer bytes,
# posting rows are one-byte gaps (post_gaps_pay) and row-store dims one-byte deltas
# (delta_pays): 7 bytes per non-zero instead of 12.
BLOCK_SHIFT = 16
ROW_BLOCK = 1 << BLOCK_SHIFT
ARRAYS_V1 = ("post_indptr", "post_rows", "post_vals", "row_indptr", "row_dims", "row_vals")
ARRAYS_V2 = ("post_blocks", "post_rows", "post_vals", "row_indptr", "row_dims", "row_vals")
ARRAYS_V3 = (
    "post_blocks",
    "post_rows",
    "post_imps",
    "list_stats",
    "row_indptr",
    "row_dims",
    "row_vals",
)
ARRAYS = {1: ARRAYS_V1, 2: ARRAYS_V2, 3: ARRAYS_V3}

# A posting list holding at least 1 / DENSE_RATIO of a segment's rows is also kept in memory
# as a dense value row (4 bytes per row, 0 where absent), built on first search: scoring it is
# then a contiguous, vectorised add that streams 4 bytes per row instead of 6 per posting (row
# + value) through a scattered add. It pays off for the long lists of frequent dimensions
# (VDR-like vocabularies), where the scan is bound by memory bandwidth.
DENSE_RATIO = 2
# The same for the one-byte impacts of quantised search (Segment.impact_lists): a dense row
# of impacts streams 1 byte per row against 3 per posting, so lists of at least a quarter of
# the rows go dense. Measured on 1M resampled COCO codes (128 nnz/item, 30 label-pair
# queries of ~120 dims, k = 1,024, one core): ratio 2 / 4 / 8 gave 17.5 / 12.9 / 13.6 ms
# p50 with 151 / 369 / 465 MB of impacts and dense rows in memory (exact search: 24.1 ms).
IMPACT_DENSE_RATIO = 4


SEG_FILES = {v: (*(f"{a}.npy" for a in arrays), "ids.json") for v, arrays in ARRAYS.items()}
_WARNED_UNCHECKED: set[str] = set()


def segment_layout(folder: Path, digests: Any) -> int:
    """The layout (1, 2 or 3) of a segment: from the files its checksums name, else (a
    segment from before the checksums) from the files in its folder."""
    if isinstance(digests, dict):
        names = set(digests)
    else:
        names = {f for f in ("post_imps.npy", "post_blocks.npy") if (folder / f).exists()}
    return 3 if "post_imps.npy" in names else 2 if "post_blocks.npy" in names else 1


def verify_segment_files(root: Path, folder: Path, digests: Any) -> None:
    """Check each segment file against its SHA-256 in the manifest (once per file version
    per process); warn (once) when the segment predates the checksums."""
    if digests is None:
        if str(folder) not in _WARNED_UNCHECKED:
            _WARNED_UNCHECKED.add(str(folder))
            logger.warning(
                "index %s: segment %s has no checksums (written by an older sparsemm); only "
                "its layout and values are checked. Rebuild it with `sparsemm index` to "
                "add them",
                root,
                folder.name,
            )
        return
    files = SEG_FILES[segment_layout(folder, digests)]
    if not isinstance(digests, dict) or set(digests) != set(files):
        raise SparsemmError(
            f"index {root}: the manifest's checksums of segment {folder.name} are malformed; "
            "rebuild the index with `sparsemm index`"
        )
    todo: list[tuple[str, tuple[str, int, int, int, str]]] = []
    for fname in files:
        want = str(digests[fname])
        key = read_segment_file(folder / fname, functools.partial(file_key, digest=want))
        with VERIFIED_LOCK:
            if key not in VERIFIED:
                todo.append((fname, key))
    if not todo:
        return
    # hashlib releases the GIL: the files of a large segment are hashed in parallel
    with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
        got = list(pool.map(lambda t: read_segment_file(folder / t[0], sha256_file), todo))
    for (fname, _key), digest in zip(todo, got, strict=True):
        if digest != digests[fname]:
            raise SparsemmError(
                f"index {root}: {folder.name}/{fname} does not match its checksum in "
                f"{MANIFEST} (damaged or modified); rebuild the index with `sparsemm index`"
            )
    with VERIFIED_LOCK:
        VERIFIED.update(key for _, key in todo)


@dataclass
class Segment:
    """One loaded segment: read-only (memory-mapped) arrays, rows [start, start + count).

    Posting list d of row block b (rows [b * block_size, (b + 1) * block_size) of the
    segment) is post_rows/post_vals[post_blocks[d, b] : post_blocks[d, b + 1]], its rows
    local to the block; the whole list is [post_indptr[d], post_indptr[d + 1]). A v1 segment
    is one block (block_size covers it, post_blocks derived from its post_indptr); a v2
    segment stores post_blocks and derives post_indptr. ``post_vals`` holds the float32
    values (v1, v2) or, in a v3 segment, the one-byte impacts (file post_imps.npy), read
    with ``list_stats`` (see ``impact_lists``); the row store always holds exact values.
    """

    name: str
    start: int
    count: int
    nnz: int
    layout: int
    block_size: int
    post_indptr: np.ndarray
    post_blocks: np.ndarray
    post_rows: np.ndarray
    post_vals: np.ndarray
    row_indptr: np.ndarray
    row_dims: np.ndarray
    row_vals: np.ndarray
    ids: list[str]
    list_stats: np.ndarray | None = None
    # (file, inode, size, mtime_ns, SHA-256 or None) of each file as it was read: a file
    # cut short in place (cp or rsync --inplace over a live index) would end a read of its
    # mapped pages with SIGBUS, and one overwritten with other values of the same size
    # would be served as it is; ``check_files`` compares before each served request
    files: tuple[tuple[str, int, int, int, str | None], ...] = ()
    in_memory: bool = False  # arrays read into memory (no map a truncation can break)
    _dense: tuple[np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _bounds: tuple[np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _approx: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _impacts: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def stored(self) -> tuple[np.ndarray, ...]:
        """The arrays of the segment's files (the memory maps)."""
        names = ("post_vals" if a == "post_imps" else a for a in ARRAYS[self.layout])
        return tuple(getattr(self, a) for a in names)

    @property
    def quantized(self) -> bool:
        """Posting values are stored as one-byte impacts (v3); exact values in the row store."""
        return self.layout == 3

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.stored)

    @functools.cached_property
    def fills(self) -> np.ndarray:
        """(dim,) bool: the lists holding filler postings (gap-coded rows, ``next_row``);
        derived once, read by every search."""
        if self.list_stats is None:
            return np.zeros(len(self.post_indptr) - 1, np.bool_)
        return self.list_stats[3] > 0

    def changed_files(self) -> list[tuple[str, str]]:
        """(file, how) for the files that changed on disk since they were read and no longer
        hold what was read: gone, cut short or grown (a mapped read of it could end the
        process with SIGBUS), or rewritten with content that does not match the file's
        checksum. A file whose inode, size or mtime changed is hashed again (once per new
        version per process); one that still matches its checksum (touched, or restored
        byte for byte) is accepted. Without a checksum, any change counts."""
        out = []
        files = list(self.files)
        for i, (path, ino, size, mtime, digest) in enumerate(files):
            try:
                st = os.stat(path)
            except OSError:
                out.append((path, "is gone"))
                continue
            if (st.st_ino, st.st_size, st.st_mtime_ns) == (ino, size, mtime):
                continue
            if st.st_size != size:  # no checksum to match: say what a user can check
                out.append((path, "changed size on disk while open (overwritten in place?)"))
                continue
            key = (path, st.st_ino, st.st_size, st.st_mtime_ns, str(digest))
            with VERIFIED_LOCK:
                known = key in VERIFIED
            try:
                same = digest is not None and (known or sha256_file(path) == digest)
            except (OSError, SparsemmError):
                same = False
            if not same:
                how = "changed on disk while open" + (
                    f" and no longer matches its checksum in {MANIFEST}"
                    if digest is not None
                    else ""
                )
                out.append((path, how + " (overwritten in place?)"))
                continue
            with VERIFIED_LOCK:
                VERIFIED.add(key)
            files[i] = (path, st.st_ino, st.st_size, st.st_mtime_ns, digest)
        self.files = tuple(files)
        return out

    def dense_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """(slot (dim,) int32, dense (n_long, count) f32) of the long posting lists, built
        on first use (DENSE_RATIO); for a v3 segment, those of its impacts (uint8)."""
        if self.quantized:
            return self.impact_lists()[3:]
        if self._dense is None:
            min_len = max(1, -(-self.count // DENSE_RATIO))
            self._dense = build_dense(
                self.post_blocks,
                self.post_rows,
                self.post_vals,
                self.block_size,
                self.count,
                min_len,
            )
        return self._dense

    def dim_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(dmax, dmin) (dim,) f32: each dim's largest / smallest posting value (max-score
        pruning bounds), computed on first use (O(nnz), 8 bytes per dim in memory)."""
        if self._bounds is None:
            if self.list_stats is not None:
                self._bounds = (
                    self.list_stats[0].astype(np.float32),
                    self.list_stats[1].astype(np.float32),
                )
            else:
                self._bounds = dim_bounds(self.post_indptr, self.post_vals)
        return self._bounds

    def impact_lists(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(impacts (nnz,) uint8, scale (dim,) f32, err (dim,) f64, slot (dim,) int32, dense
        (n_long, count) uint8): the posting values quantised to one byte each
        (``quantize_lists``: value ~ impact * scale[d], within err[d], measured) and the
        long lists' dense rows of impacts, for searches that bound scores rather than
        compute them (``InvertedIndex.search_quantized``). Built on first use, held in
        memory (1 byte per posting, 1 byte per row per list of at least
        1 / IMPACT_DENSE_RATIO of the rows); only for a segment without negative values. A
        v3 segment stores the impacts (its ``post_vals``) and their errors; only the dense
        rows are built."""
        if self._impacts is None:
            scale = impact_scale(self.dim_bounds()[0])
            if self.list_stats is not None:
                imp, err = self.post_vals, self.list_stats[2]
            else:
                imp, err = quantize_lists(self.post_indptr, self.post_vals, scale)
            min_len = max(1, -(-self.count // IMPACT_DENSE_RATIO))
            slot, dense = build_dense(
                self.post_blocks, self.post_rows, imp, self.block_size, self.count, min_len
            )
            self._impacts = (imp, scale, err, slot, dense)
        return self._impacts

    def approx_lists(self, keep: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Truncated posting lists for approximate search (``truncate_lists``), built on
        first use and held in memory (8 bytes per kept posting)."""
        got = self._approx.get(keep)
        if got is None:
            if self.quantized:  # the exact values as one-block lists, from the row store
                ptr, rows, vals = posting_lists(
                    *decode_rows(self.row_indptr, self.row_dims, self.row_vals),
                    len(self.post_indptr) - 1,
                )
                ptr, rows, t_vals = truncate_lists(
                    one_block(ptr.astype(np.int64)), rows, vals, max(self.count, 1), keep
                )
            else:
                ptr, rows, t_vals = truncate_lists(
                    self.post_blocks, self.post_rows, self.post_vals, self.block_size, keep
                )
            got = (one_block(ptr), rows, t_vals)
            self._approx[keep] = got
        return got


def impact_scale(dmax: np.ndarray) -> np.ndarray:
    """(dim,) f32: each list's impact step, its largest value / 255 (0 for an empty list: it
    adds nothing, and no error, to any score)."""
    return (np.asarray(dmax, np.float32) / np.float32(255.0)).astype(np.float32)


def one_block(indptr: np.ndarray) -> np.ndarray:
    """(dim, 2) block pointers of posting lists that are one block: [indptr[d], indptr[d+1])."""
    return np.ascontiguousarray(np.stack([indptr[:-1], indptr[1:]], axis=1))


def write_segment(
    folder: Path,
    dim: int,
    row_indptr: np.ndarray,
    row_dims: np.ndarray,
    row_vals: np.ndarray,
    ids: list[str],
    post: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> dict[str, str]:
    """Write a segment folder from its row-major arrays (posting lists, as (indptr, segment
    rows, vals), built if not given): v3 (one-byte impacts in the posting lists) when no
    value is negative, else v2. Return the SHA-256 of each file (the manifest's ``sha256``
    entry of the segment)."""
    count = len(row_indptr) - 1
    row_vals = np.asarray(row_vals).astype(np.float32, copy=False)
    if post is None:
        post = posting_lists(row_indptr, row_dims, row_vals, dim)
    nb = max(1, -(-count // ROW_BLOCK))
    indptr = post[0].astype(np.int64, copy=False)
    rows = np.asarray(post[1])
    vals = np.asarray(post[2]).astype(np.float32, copy=False)
    folder.mkdir(parents=True)
    arrays: dict[str, np.ndarray] = {
        "post_blocks": block_pointers(indptr, rows, nb, BLOCK_SHIFT),
        "post_rows": (rows & (ROW_BLOCK - 1)).astype(np.uint16),
    }
    layout = 3 if not (row_vals < 0).any() else 2
    if layout == 3:
        dmax, dmin = dim_bounds(indptr, vals)
        imp, err = quantize_lists(indptr, vals, impact_scale(dmax))
        fills = np.zeros(dim, np.int64)
        blocks, local = arrays["post_blocks"], arrays["post_rows"]
        gap_fillers = count_gap_fillers(blocks, local)
        if post_gaps_pay(len(local), gap_fillers):
            blocks, local, imp, fills = encode_gaps(blocks, local, imp, gap_fillers)
            arrays["post_blocks"], arrays["post_rows"] = blocks, local
        arrays["post_imps"] = imp
        arrays["list_stats"] = np.stack([dmax, dmin, err, fills]).astype(np.float64)
    else:
        arrays["post_vals"] = vals
    row_indptr = row_indptr.astype(np.int64, copy=False)
    dim_fillers = count_fillers(row_indptr, row_dims) if layout == 3 else 0
    if layout == 3 and delta_pays(len(row_dims), dim_fillers, dim):
        row_indptr, row_dims, row_vals = encode_deltas(row_indptr, row_dims, row_vals, dim_fillers)
    else:
        row_dims = row_dims.astype(dims_dtype(dim), copy=False)
    arrays["row_indptr"] = row_indptr
    arrays["row_dims"] = row_dims
    arrays["row_vals"] = row_vals
    for name, arr in arrays.items():
        save_npy(folder / f"{name}.npy", arr)
    write_json(folder / "ids.json", ids)
    fsync_dir(folder)
    digests = {fname: sha256_file(folder / fname) for fname in SEG_FILES[layout]}
    with VERIFIED_LOCK:  # just written and hashed: opening it need not hash again
        VERIFIED.update(file_key(folder / f, d) for f, d in digests.items())
    return digests


def post_gaps_pay(nnz: int, fillers: int) -> bool:
    """v3 posting rows are gap-coded (uint8, ``kernels.next_row``) when that takes fewer bytes
    than block-local uint16 rows: 2 bytes a posting with its impact, fillers included,
    against 3. Lists holding more than 1 in 255 of the rows have no fillers at all."""
    return 2 * (nnz + fillers) < 3 * nnz


def delta_pays(nnz: int, fillers: int, dim: int) -> bool:
    """A v3 row store is delta-coded (uint8 dims, ``kernels.FILLER_STEP``) when that takes
    fewer bytes than absolute dims: 5 bytes an entry, fillers included, against 6 (uint16
    dims) or 8 (int32). Close dims (a few hundred dims, or dense rows) make it pay; a wide
    vocabulary with sparse rows (30,522 dims, 100 values a row) does not."""
    return 5 * (nnz + fillers) < (2 + np.dtype(dims_dtype(dim)).itemsize + 2) * nnz


def posting_lists(
    row_indptr: np.ndarray, row_dims: np.ndarray, row_vals: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr (dim + 1,), segment rows, vals): the posting lists of CSR rows (plain dims),
    each list ascending by row."""
    count = len(row_indptr) - 1
    csc = sp.csr_matrix((row_vals, row_dims, row_indptr), shape=(count, dim)).tocsc()
    csc.sort_indices()
    return csc.indptr, csc.indices, csc.data


def dims_dtype(dim: int) -> type[np.integer[Any]]:
    """The row store's dim type in a v2 or v3 segment: uint16 when every dim fits, else int32."""
    return np.uint16 if dim <= 1 << 16 else np.int32


def read_segment_file(path: Path, read: Callable[[Path], Any]) -> Any:
    """``read(path)``; raise FileNotFoundError if the file is (or went) missing.

    A concurrent merge or rebuild may delete a segment between a reader's manifest read and
    its file reads; the readers in ``sparsemm.io`` report that as SparsemmError, but
    ``manifest.read_index`` retries only on FileNotFoundError.
    """
    try:
        return read(path)
    except FileNotFoundError:
        raise
    except (SparsemmError, OSError) as exc:
        if not path.is_file():
            raise FileNotFoundError(path) from exc
        raise


def load_segment(
    root: Path, meta: dict[str, Any], start: int, dim: int, in_memory: bool = False
) -> Segment:
    """Map one segment (``in_memory``: read it into memory) and check its layout;
    FileNotFoundError if any of its files is gone."""
    folder = root / str(meta["name"])
    if not folder.is_dir():
        raise FileNotFoundError(folder)
    digests = meta.get("sha256")
    layout = segment_layout(folder, digests)
    versions = _file_versions(folder, layout)
    verify_segment_files(root, folder, digests)
    arrs = _read_arrays(folder, layout, in_memory)
    ids = read_segment_file(folder / "ids.json", read_json)
    count, nnz = int(meta["count"]), int(meta["nnz"])
    ok, bsize, stats = _check_arrays(arrs, ids, layout, count, nnz, dim)
    if not ok:
        raise SparsemmError(
            f"index {root}: segment {folder.name} does not match the manifest (corrupt or "
            "modified); rebuild the index"
        )
    if layout >= 2:
        blocks = arrs["post_blocks"]
        arrs["post_indptr"] = np.append(blocks[:, 0], blocks[-1, -1])
    for name in ("post_vals", "row_vals") if layout < 3 else ("row_vals",):
        if not all_finite(arrs[name]):
            raise SparsemmError(
                f"index {root}: {folder.name}/{name}.npy holds NaN or inf values (damaged or "
                "modified); rebuild the index with `sparsemm index`"
            )
    return Segment(
        name=folder.name,
        start=start,
        count=count,
        nnz=nnz,
        layout=layout,
        block_size=bsize,
        ids=ids,
        list_stats=stats,
        files=tuple(
            (
                str(folder / fname),
                *versions[fname],
                str(digests[fname]) if isinstance(digests, dict) else None,
            )
            for fname in SEG_FILES[layout]
        ),
        in_memory=in_memory,
        **arrs,
    )


def _file_versions(folder: Path, layout: int) -> dict[str, tuple[int, int, int]]:
    """(inode, size, mtime) of each file of a segment, taken before it is verified and read:
    a change after this is seen by Segment.changed_files (and the new content hashed)."""
    versions = {}
    for fname in SEG_FILES[layout]:
        st = read_segment_file(folder / fname, os.stat)
        versions[fname] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return versions


def _read_arrays(folder: Path, layout: int, in_memory: bool) -> dict[str, np.ndarray]:
    """The arrays of a segment by name: plain read-only ndarray views of the memory maps,
    or (``in_memory``) read-only arrays read into memory."""
    arrs = {}
    for name in ARRAYS[layout]:
        arrs[name] = np.asarray(
            read_segment_file(folder / f"{name}.npy", lambda p: load_npy(p, mmap=not in_memory))
        )
        if in_memory:
            arrs[name].flags.writeable = False
    return arrs


def _check_arrays(
    arrs: dict[str, np.ndarray], ids: Any, layout: int, count: int, nnz: int, dim: int
) -> tuple[bool, int, np.ndarray | None]:
    """(ok, rows per block, list stats): whether a segment's arrays and ids hold the shapes,
    types and layout its ``layout``, manifest counts and ``dim`` call for. Renames them to
    the Segment's fields on the way: a v3 segment's impacts become ``post_vals`` and its
    ``list_stats`` are taken out; a valid v1 segment gets its one row block."""
    rows_t: Any
    dims_t: Any
    if layout >= 2:
        nb = max(1, -(-count // ROW_BLOCK))
        bsize = ROW_BLOCK
        rows_t, dims_t = np.uint16, dims_dtype(dim)
        ok = arrs["post_blocks"].shape == (dim, nb + 1) and arrs["post_blocks"].dtype == np.int64
    else:
        bsize = max(count, 1)
        rows_t, dims_t = np.int32, np.int32
        ok = arrs["post_indptr"].shape == (dim + 1,) and arrs["post_indptr"].dtype == np.int64
    if layout == 3:
        stats = arrs.pop("list_stats")
        arrs["post_vals"] = arrs.pop("post_imps")
        ok = ok and valid_stats(stats, dim) and arrs["post_vals"].dtype == np.uint8
        gaps = arrs["post_rows"].dtype == np.uint8
        fillers = int(stats[3].sum()) if ok else -1
        ok = ok and (gaps or fillers == 0)
        rows_t = np.uint8 if gaps else rows_t
        entries = nnz + fillers
    else:
        stats = None
        entries = nnz
        ok = ok and arrs["post_vals"].dtype == np.float32
    ok = (
        ok
        and arrs["row_indptr"].shape == (count + 1,)
        and all(arrs[a].shape == (entries,) for a in ("post_rows", "post_vals"))
        and arrs["row_dims"].ndim == 1
        and arrs["row_vals"].shape == arrs["row_dims"].shape
        and arrs["row_indptr"].dtype == np.int64
        and arrs["post_rows"].dtype == rows_t
        and (
            arrs["row_dims"].dtype == dims_t or (layout == 3 and arrs["row_dims"].dtype == np.uint8)
        )
        and arrs["row_vals"].dtype == np.float32
        and isinstance(ids, list)
        and len(ids) == count
        and all(type(i) is str for i in ids)
    )
    if ok and layout == 1:
        arrs["post_blocks"] = one_block(arrs["post_indptr"])
    ok = ok and valid_layout(
        arrs["post_blocks"],
        arrs["post_rows"],
        bsize,
        arrs["row_indptr"],
        arrs["row_dims"],
        count,
        dim,
        nnz,
    )
    return ok, bsize, stats


def valid_stats(stats: np.ndarray, dim: int) -> bool:
    """A v3 segment's list_stats: (4, dim) float64 of finite (max, min, err, fillers), 0 <=
    min <= max (or both 0: an empty list), err >= 0, fillers a count."""
    if stats.shape != (4, dim) or stats.dtype != np.float64 or not np.isfinite(stats).all():
        return False
    dmax, dmin, err, fills = stats
    return bool(
        (dmin >= 0).all()
        and (dmax >= dmin).all()
        and (dmax <= np.finfo(np.float32).max).all()
        and (err >= 0).all()
        and (fills >= 0).all()
        and (fills == np.round(fills)).all()
    )


def merge_segments(
    segs: Sequence[Segment], dim: int
) -> tuple[
    tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray] | None
]:
    """Concatenate adjacent segments: ((row_indptr, row_dims, row_vals), (post_indptr,
    post_rows, post_vals) or None when some segment stores impacts, not values: the writer
    then builds the posting lists from the row store)."""
    rows = _merge_rows(segs)
    if any(s.quantized for s in segs):
        return rows, None
    post_indptr = np.zeros(dim + 1, np.int64)
    for s in segs:
        post_indptr += s.post_indptr
    nnz = int(post_indptr[-1])
    post_rows = np.empty(nnz, np.int32)
    post_vals = np.empty(nnz, np.float32)
    placed = np.zeros(dim, np.int64)  # postings already written per dim
    row_off = 0
    for s in segs:
        lens = np.diff(s.post_indptr)
        # destination of posting p of dim d: merged start of d + placed[d] + (p - start_d)
        dest = np.repeat(post_indptr[:-1] + placed - s.post_indptr[:-1], lens)
        dest += np.arange(s.nnz, dtype=np.int64)
        post_rows[dest] = global_rows(s.post_blocks, s.post_rows, s.block_size) + row_off
        post_vals[dest] = s.post_vals
        placed += lens
        row_off += s.count
    return rows, (post_indptr, post_rows, post_vals)


def _merge_rows(segs: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = [decode_rows(s.row_indptr, s.row_dims, s.row_vals) for s in segs]
    row_indptr = np.zeros(sum(s.count for s in segs) + 1, np.int64)
    pos, at = 0, 0
    for s, (indptr, _, _) in zip(segs, rows, strict=True):
        row_indptr[pos + 1 : pos + s.count + 1] = indptr[1:] + at
        pos += s.count
        at += s.nnz
    row_dims = np.concatenate([r[1] for r in rows])
    row_vals = np.concatenate([r[2] for r in rows]).astype(np.float32, copy=False)
    return row_indptr, row_dims, row_vals


@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """Hold the exclusive writer lock of ``root`` or raise SparsemmError at once."""
    fh = open(root / LOCK_FILE, "a+")
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise SparsemmError(
                    f"index {root} is being written by another process (lock {LOCK_FILE} is "
                    "held); wait for it to finish, then retry"
                ) from exc
            raise
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    finally:
        fh.close()
