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

Search (the scoring kernels' driver, pruning, the approximate mode and the ranking rule) is
:mod:`sparsemm.index.search`; the manifest's checks and the folder's housekeeping are
:mod:`sparsemm.index.manifest`; the value types and input checks :mod:`sparsemm.index.inputs`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.index.inputs import check_items
from sparsemm.index.kernels import copy_runs, run_nnz
from sparsemm.index.manifest import (
    FORMAT,
    VERSION,
    check_dim,
    check_replaceable,
    meta_digest,
    only_leftovers,
    read_index,
    remove_unreferenced,
)
from sparsemm.index.search import BLOCK, SegmentSearch
from sparsemm.index.segments import (
    MANIFEST,
    Segment,
    load_segment,
    merge_segments,
    write_segment,
    writer_lock,
)
from sparsemm.index.store import Store
from sparsemm.io import fsync_dir, read_json, write_json

logger = logging.getLogger(__name__)

_MAX_ROWS = 2**31 - 1  # rows are stored as int32


class InvertedIndex(SegmentSearch, Store):
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
        self.pruning = True  # max-score pruning on (SegmentSearch.pruning)
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
        check_dim(dim)
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
        check_dim(dim)
        try:
            json.dumps(meta or {})
        except (TypeError, ValueError) as exc:
            raise SparsemmError(f"index meta must be JSON-serialisable ({exc})") from exc
        if items is not None and len(items[1]) > _MAX_ROWS:
            raise SparsemmError(f"an index holds at most {_MAX_ROWS} items")
        if root.exists() and not root.is_dir():
            raise SparsemmError(f"{root} exists and is not a folder; choose another index path")
        if not (root / MANIFEST).is_file():
            if root.is_dir() and not only_leftovers(root):
                raise SparsemmError(
                    f"{root} exists and is not an empty folder; choose another index path"
                )
            root.mkdir(parents=True, exist_ok=True)
        else:
            check_replaceable(root, overwrite)
        with writer_lock(root):
            seq = 1
            if (root / MANIFEST).is_file():  # again under the lock: another writer may race
                seq = check_replaceable(root, overwrite)
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
            remove_unreferenced(root, {str(s["name"]) for s in manifest["segments"]})
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
        manifest, segments = read_index(root, in_memory=in_memory)
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
        manifest, segments = read_index(self._root, in_memory=self._in_memory)
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
            remove_unreferenced(self._root, {s.name for s in self._segments})

    def compact(self) -> None:
        """Merge all segments into one (faster search after many small adds)."""
        with writer_lock(self._root):
            on_disk = read_json(self._root / MANIFEST)
            if on_disk != self._manifest:
                self.reload()
            if len(self._segments) > 1:
                self._merge_tail(len(self._segments))
            remove_unreferenced(self._root, {s.name for s in self._segments})

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
