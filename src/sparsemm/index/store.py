"""Sparse-code stores behind one interface: the embedded inverted index and Qdrant.

A *store* holds items in insertion order (row ``r`` = the r-th item added, never renumbered)
with per item a string id, the sparse concept code ``(dim,)`` and optionally a dense
embedding ``(dense_dim,)``. It answers three kinds of top-k query, all exact:

* ``search``: inner product with a sparse query code, optionally with an
  :class:`~sparsemm.index.Exclusion` (hard ``filter`` on the item's value on some dims, or a
  score ``penalty``);
* ``search_dense``: inner product with a dense query vector (``filter`` exclusion allowed);
* ``search_hybrid``: reciprocal rank fusion (Cormack et al., SIGIR 2009) of the sparse and
  the dense top-``candidates`` lists, score = sum_l weight_l / (rrf_k + rank_l), rank from 1.

Result rule shared by every backend, so the same data gives the same results everywhere:
sparse and hybrid searches return only items whose sparse score is > 0 (an item sharing no
concept with the query is not a match); dense searches rank every item. Ties are broken by
the lower row. Scores are computed with one fixed float32 arithmetic (the inverted index's
kernel for sparse codes, :func:`dense_scores` for dense vectors); a backend that scores
differently (Qdrant) fetches every candidate within its provable rounding error of the k-th
score and rescores those exactly, so results are identical, scores to the last bit.

Backends: :class:`LocalStore` (this module; the default) wraps an
:class:`~sparsemm.index.InvertedIndex` folder plus an optional ``dense-<token>/`` subfolder;
:class:`sparsemm.index.qdrant.QdrantStore` talks to a Qdrant server or cluster through
``qdrant-client`` (extra ``qdrant``). :func:`sparsemm.index.backends.open_store` picks one
by name; the exact scoring both share is in :mod:`sparsemm.index.scoring`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.index.inverted import (
    MANIFEST,
    Exclusion,
    InvertedIndex,
    QueryLike,
    SearchResult,
    check_codes,
    check_k,
)
from sparsemm.index.scoring import (
    check_dense,
    check_dense_query,
    dense_plan,
    dense_scores,
    ranked,
)
from sparsemm.io import (
    check_digests,
    check_finite,
    fsync_dir,
    load_npy,
    read_json,
    record_digests,
    save_npy,
    write_json,
)

logger = logging.getLogger(__name__)

DEFAULT_RRF_K = 60  # Cormack et al. (2009)
DENSE_DIR = "dense"  # dense vectors live in <index>/dense-<token>/
DENSE_FORMAT = "sparsemm.dense"


def fuse_rrf(
    lists: Sequence[SearchResult],
    k: int,
    rrf_k: int = DEFAULT_RRF_K,
    weights: Sequence[float] | None = None,
) -> SearchResult:
    """Reciprocal rank fusion: score(i) = sum_l weight_l / (rrf_k + rank_l(i)), rank from 1
    (Cormack, Clarke & Buettcher, SIGIR 2009). Top ``k`` by fused score, ties by lower row."""
    if weights is None:
        weights = [1.0] * len(lists)
    if len(weights) != len(lists):
        raise SparsemmError(f"fusion: {len(weights)} weights for {len(lists)} result lists")
    score: dict[int, float] = {}
    ident: dict[int, str] = {}
    for res, wl in zip(lists, weights, strict=True):
        for rank, (r, i) in enumerate(zip(res.rows.tolist(), res.ids, strict=True), start=1):
            score[r] = score.get(r, 0.0) + float(wl) / (rrf_k + rank)
            ident[r] = i
    order = sorted(score, key=lambda r: (-score[r], r))[:k]
    return SearchResult(
        rows=np.asarray(order, np.int64),
        ids=[ident[r] for r in order],
        scores=np.asarray([score[r] for r in order], np.float32),
    )


def _positive(res: SearchResult) -> SearchResult:
    keep = res.scores > 0
    if keep.all():
        return res
    return SearchResult(
        rows=res.rows[keep],
        ids=[i for i, g in zip(res.ids, keep, strict=True) if g],
        scores=res.scores[keep],
    )


# --------------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------------


class Store(ABC):
    """Items (id, sparse code, optional dense vector) with exact top-k search (module doc)."""

    backend: ClassVar[str]

    @property
    @abstractmethod
    def dim(self) -> int:
        """Dimensions of the sparse codes."""

    @property
    @abstractmethod
    def dense_dim(self) -> int | None:
        """Dimensions of the dense vectors, or None when the store holds none."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def add(
        self,
        codes: Any,
        ids: Sequence[str],
        dense: Any = None,
        *,
        batch_size: int = 1024,
        progress: bool = False,
    ) -> None:
        """Append items: ``codes`` (n, dim), ``ids`` n new unique strings, ``dense`` (n, D)
        (required exactly when the store holds dense vectors)."""

    @abstractmethod
    def _same_prefix(self, codes: sp.csr_matrix, ids: list[str], dense: np.ndarray | None) -> bool:
        """Whether the store's first len(self) items are these (resume check)."""

    @abstractmethod
    def codes(self, rows: Sequence[int] | np.ndarray) -> sp.csr_matrix:
        """Stored sparse codes of ``rows`` as a (len(rows), dim) float32 CSR matrix with
        sorted indices (the forward index the served path rescores from)."""

    @abstractmethod
    def search(
        self, query: QueryLike, k: int = 10, exclude: Exclusion | None = None
    ) -> SearchResult:
        """Exact top-k items with sparse score > 0 (ties: lower row)."""

    @abstractmethod
    def search_dense(
        self, vector: Any, k: int = 10, exclude: Exclusion | None = None
    ) -> SearchResult:
        """Exact top-k items by dense inner product (``filter`` exclusions only)."""

    def upload(
        self,
        codes: Any,
        ids: Sequence[str],
        dense: Any = None,
        *,
        batch_size: int = 1024,
        progress: bool = False,
    ) -> int:
        """Bulk-load items; resumable. Returns the number of items added now.

        If the store already holds m items they must be the first m given (an interrupted
        upload of the same data): only the rest is added. Other data raises SparsemmError.
        """
        csr = check_codes(codes, self.dim)
        id_list = [str(i) for i in ids]
        n, m = len(id_list), len(self)
        if csr.shape[0] != n:
            raise SparsemmError(f"{csr.shape[0]} codes for {n} ids; they must match")
        arr = None if dense is None else check_dense(dense, n, self.dense_dim)
        if m > n or (
            m and not self._same_prefix(csr[:m], id_list[:m], None if arr is None else arr[:m])
        ):
            raise SparsemmError(
                f"the store already holds {m} items that are not the first {m} of these; "
                "upload into a new store (or recreate it) instead of resuming"
            )
        if m == n:
            logger.info("store holds all %d items already; nothing to upload", n)
            return 0
        if m:
            logger.info("resuming upload at item %d of %d", m, n)
        self.add(
            csr[m:],
            id_list[m:],
            None if arr is None else arr[m:],
            batch_size=batch_size,
            progress=progress,
        )
        return n - m

    def search_hybrid(
        self,
        query: QueryLike,
        vector: Any,
        k: int = 10,
        exclude: Exclusion | None = None,
        *,
        candidates: int | None = None,
        rrf_k: int = DEFAULT_RRF_K,
        weights: Sequence[float] = (1.0, 1.0),
    ) -> SearchResult:
        """RRF of the sparse and dense top-``candidates`` lists (default max(100, 4k)).

        ``exclude`` applies to both lists (a penalty only to the sparse one). Only items in
        the sparse list (sparse score > 0) are returned, then ranked by fused score.
        """
        k = check_k(k)
        cand = max(100, 4 * k) if candidates is None else check_k(candidates)
        sparse_res = self.search(query, cand, exclude)
        dense_ex = exclude if exclude is None or exclude.mode == "filter" else None
        dense_res = self.search_dense(vector, cand, dense_ex)
        fused = fuse_rrf(
            [sparse_res, dense_res], len(sparse_res.ids) + len(dense_res.ids), rrf_k, weights
        )
        in_sparse = set(sparse_res.rows.tolist())
        keep = [j for j, r in enumerate(fused.rows.tolist()) if r in in_sparse][:k]
        return SearchResult(
            rows=fused.rows[keep], ids=[fused.ids[j] for j in keep], scores=fused.scores[keep]
        )

    def search_batch(
        self,
        queries: Any,
        k: int = 10,
        exclude: Exclusion | Sequence[Exclusion | None] | None = None,
    ) -> list[SearchResult]:
        """``search`` for each row of ``queries`` (nq, dim) sparse or dense."""
        qs = sp.csr_matrix(queries, dtype=np.float32)
        nq = qs.shape[0]
        if exclude is None or isinstance(exclude, Exclusion):
            ex: list[Exclusion | None] = [exclude] * nq
        else:
            ex = list(exclude)
            if len(ex) != nq:
                raise SparsemmError(f"exclude: {len(ex)} exclusions for {nq} queries")
        return [self.search(qs[i], k, ex[i]) for i in range(nq)]

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for local stores
        """Release connections / maps (the store is unusable afterwards)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Local backend
# --------------------------------------------------------------------------------------------


class _DenseStore:
    """Dense vectors beside an inverted index: ``<index>/dense-<token>/`` (chunk .npy files,
    JSON manifest; the index's meta names the folder, which ties it to one index build).
    Chunks are committed *before* the sparse rows they belong to, so a crash leaves at most
    an orphan tail chunk (start >= the index's count), ignored on open and replaced later."""

    def __init__(self, root: Path, manifest: dict[str, Any], count: int) -> None:
        self.root = root
        self.manifest = manifest
        self.dim = int(manifest["dim"])
        chunks, mats, at = [], [], 0
        for c in manifest["chunks"]:
            if int(c["start"]) != at or at + int(c["count"]) > count:
                break
            remedy = "rebuild the index with `sparsemm index`"
            # chunks written before checksums carry none: shapes and values checked only
            digest = {str(c["name"]): c["sha256"]} if "sha256" in c else None
            check_digests(root, digest, [str(c["name"])], remedy)
            mat = load_npy(root / str(c["name"]), mmap=True)
            if mat.shape != (int(c["count"]), self.dim) or mat.dtype != np.float32:
                raise SparsemmError(f"{root}: dense chunk {c['name']} is corrupt; rebuild")
            check_finite(mat, root / str(c["name"]), remedy)
            chunks.append(c)
            mats.append(np.asarray(mat))
            at += int(c["count"])
        if at != count:
            raise SparsemmError(
                f"{root}: dense vectors cover {at} of {count} items (interrupted write); "
                "rebuild the store"
            )
        self.chunks = chunks
        self.mats = mats

    @staticmethod
    def write_new(root: Path, dim: int, token: str, dense: np.ndarray | None) -> None:
        """A new dense folder, holding ``dense`` as rows [0, n) if given."""
        root.mkdir(parents=True, exist_ok=True)
        manifest = {"format": DENSE_FORMAT, "version": 1, "dim": dim, "token": token, "chunks": []}
        write_json(root / "manifest.json", manifest)
        fsync_dir(root)
        if dense is not None and len(dense):
            _DenseStore(root, manifest, 0).append(0, dense)

    def append(self, start: int, mat: np.ndarray) -> None:
        name = f"chunk-{start:010d}-{secrets.token_hex(4)}.npy"
        if not np.isfinite(mat).all():
            raise SparsemmError("refusing to store NaN or inf dense vectors")
        save_npy(self.root / name, mat)
        digest = record_digests(self.root, [name])[name]
        kept = [c for c in self.manifest["chunks"] if int(c["start"]) < start]
        chunk = {"name": name, "start": start, "count": len(mat), "sha256": digest}
        manifest = dict(self.manifest, chunks=[*kept, chunk])
        write_json(self.root / "manifest.json", manifest)
        fsync_dir(self.root)
        self.manifest = manifest
        names = {str(c["name"]) for c in manifest["chunks"]}
        for p in self.root.glob("chunk-*.npy"):
            if p.name not in names:
                with contextlib.suppress(OSError):
                    p.unlink()

    def scores(self, q: np.ndarray) -> np.ndarray:
        return (
            np.concatenate([dense_scores(m, q) for m in self.mats])
            if self.mats
            else np.zeros(0, np.float32)
        )

    def rows(self, rows: np.ndarray) -> np.ndarray:
        starts = np.asarray([int(c["start"]) for c in self.chunks], np.int64)
        out = np.empty((len(rows), self.dim), np.float32)
        which = np.searchsorted(starts, rows, side="right") - 1
        for i, (r, c) in enumerate(zip(rows.tolist(), which.tolist(), strict=True)):
            out[i] = self.mats[c][r - starts[c]]
        return out


class LocalStore(Store):
    """The embedded backend: an :class:`InvertedIndex` folder (format unchanged) and, with
    dense vectors, a ``dense-<token>/`` subfolder. Filter exclusions work at any threshold."""

    backend: ClassVar[str] = "local"

    def __init__(self, index: InvertedIndex) -> None:
        self.index = index
        self._dense: _DenseStore | None = None
        self._load_dense()

    # ----- construction ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | Path,
        dim: int,
        dense_dim: int | None = None,
        overwrite: bool = False,
        meta: dict[str, Any] | None = None,
    ) -> LocalStore:
        """An empty store for ``dim``-d codes (and ``dense_dim``-d vectors if given)."""
        return cls._new(Path(path), dim, None, [], None, dense_dim, overwrite, meta)

    @classmethod
    def build(
        cls,
        path: str | Path,
        codes: Any,
        ids: Sequence[str],
        dense: Any = None,
        overwrite: bool = False,
        meta: dict[str, Any] | None = None,
    ) -> LocalStore:
        """A store holding ``codes`` (n, dim), ``ids`` and optional ``dense`` (n, D)."""
        shape = getattr(codes, "shape", None)
        if shape is None or len(shape) != 2:
            raise SparsemmError("codes: expected a 2-D (n, dim) matrix")
        arr = None if dense is None else check_dense(dense, int(shape[0]), None)
        return cls._new(
            Path(path),
            int(shape[1]),
            codes,
            list(ids),
            arr,
            None if arr is None else arr.shape[1],
            overwrite,
            meta,
        )

    @classmethod
    def _new(
        cls,
        root: Path,
        dim: int,
        codes: Any,
        ids: list[str],
        dense: np.ndarray | None,
        dense_dim: int | None,
        overwrite: bool,
        meta: dict[str, Any] | None,
    ) -> LocalStore:
        """Without dense vectors this is InvertedIndex.create/build. With them, the dense
        folder ``dense-<token>/`` is written first and the index commit that names the token
        makes it live, so replacing a store keeps the old one readable until that commit."""
        if dense_dim is None:
            if codes is None:
                index = InvertedIndex.create(root, dim, overwrite=overwrite, meta=meta)
            else:
                index = InvertedIndex.build(
                    root, codes, ids, dim=dim, overwrite=overwrite, meta=meta
                )
            _remove_dense_dirs(root, keep="")
            return cls(index)
        if isinstance(dense_dim, bool) or not isinstance(dense_dim, int) or dense_dim < 1:
            raise SparsemmError(f"dense_dim must be a positive integer, got {dense_dim!r}")
        token = secrets.token_hex(8)
        full = dict(meta or {})
        full["store"] = {"dense_dim": int(dense_dim), "dense_dir": f"{DENSE_DIR}-{token}"}
        droot = root / full["store"]["dense_dir"]
        if not (root / MANIFEST).is_file():  # a fresh folder: nothing to keep readable
            index = InvertedIndex.create(root, dim, meta=full)
            _DenseStore.write_new(droot, int(dense_dim), token, dense)
            if codes is not None:
                index.add(codes, ids)
        else:
            if not overwrite:
                raise SparsemmError(
                    f"a store already exists at {root}; open it, or pass overwrite=True "
                    "(--overwrite) to replace it"
                )
            _DenseStore.write_new(droot, int(dense_dim), token, dense)
            if codes is None:
                index = InvertedIndex.create(root, dim, overwrite=True, meta=full)
            else:
                index = InvertedIndex.build(root, codes, ids, dim=dim, overwrite=True, meta=full)
        _remove_dense_dirs(root, keep=droot.name)
        return cls(index)

    @classmethod
    def open(cls, path: str | Path) -> LocalStore:
        """Open a store (any inverted-index folder is one, without dense vectors)."""
        return cls(InvertedIndex.open(path))

    def _load_dense(self) -> None:
        info = self.index.meta.get("store") or {}
        self._dense = None
        if not info.get("dense_dim"):
            return
        name = str(info.get("dense_dir", ""))
        droot = self.index.path / name
        if not name.startswith(f"{DENSE_DIR}-") or not (droot / "manifest.json").is_file():
            raise SparsemmError(f"{droot} is missing; rebuild the store")
        manifest = read_json(droot / "manifest.json")
        if manifest.get("format") != DENSE_FORMAT or f"{DENSE_DIR}-{manifest.get('token')}" != name:
            raise SparsemmError(f"{droot} belongs to another build of this index; rebuild it")
        self._dense = _DenseStore(droot, manifest, len(self.index))

    def reload(self) -> None:
        """Pick up commits made by other writers."""
        self.index.reload()
        self._load_dense()

    # ----- properties -----------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self.index.dim

    @property
    def dense_dim(self) -> int | None:
        return None if self._dense is None else self._dense.dim

    @property
    def ids(self) -> tuple[str, ...]:
        return self.index.ids

    def __len__(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        """Bytes of the index arrays and dense vectors (ids excluded)."""
        dense = 0 if self._dense is None else sum(m.nbytes for m in self._dense.mats)
        return self.index.nbytes + dense

    def __repr__(self) -> str:
        return (
            f"LocalStore({str(self.index.path)!r}, count={len(self)}, dense_dim={self.dense_dim})"
        )

    # ----- writing --------------------------------------------------------------------------

    def add(
        self,
        codes: Any,
        ids: Sequence[str],
        dense: Any = None,
        *,
        batch_size: int = 1024,
        progress: bool = False,
    ) -> None:
        """Append items in one commit (``batch_size``/``progress`` are for remote backends)."""
        n = int(getattr(codes, "shape", (len(ids),))[0])
        if self._dense is None:
            if dense is not None:
                raise SparsemmError("this store holds no dense vectors; create it with dense_dim")
            self.index.add(codes, ids)
            return
        if dense is None:
            raise SparsemmError("this store holds dense vectors: pass dense=(n, d) embeddings")
        arr = check_dense(dense, n, self._dense.dim)
        start = len(self.index)
        self.index.reload()
        if len(self.index) != start:
            self._load_dense()
            start = len(self.index)
        assert self._dense is not None
        self._dense.append(start, arr)  # orphan until the index commits the rows
        self.index.add(codes, ids)
        self._load_dense()

    def _same_prefix(self, codes: sp.csr_matrix, ids: list[str], dense: np.ndarray | None) -> bool:
        m = len(ids)
        if list(self.index.ids[:m]) != ids:
            return False
        stored = self.index.codes(np.arange(m))
        if (stored != codes).nnz:
            return False
        if dense is not None and self._dense is not None:
            return bool(np.array_equal(self._dense.rows(np.arange(m)), dense))
        return True

    # ----- search ---------------------------------------------------------------------------

    def codes(self, rows: Sequence[int] | np.ndarray) -> sp.csr_matrix:
        out = self.index.codes(np.asarray(rows, dtype=np.int64))
        out.sort_indices()
        return out

    def search(
        self, query: QueryLike, k: int = 10, exclude: Exclusion | None = None
    ) -> SearchResult:
        return _positive(self.index.search(query, k, exclude))

    def search_dense(
        self, vector: Any, k: int = 10, exclude: Exclusion | None = None
    ) -> SearchResult:
        k = check_k(k)
        q = check_dense_query(vector, self.dense_dim)
        plan = dense_plan(exclude, self.dim)
        assert self._dense is not None
        scores = self._dense.scores(q)
        rows = np.arange(len(scores), dtype=np.int64)
        if plan.ban_dims.size:
            banned = self.index._rows_above(plan.ban_dims, plan.threshold)
            rows, scores = rows[~banned], scores[~banned]
        return ranked(rows, scores, k, self.index.ids)


# --------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------


def _remove_dense_dirs(root: Path, keep: str) -> None:
    """Delete dense folders of earlier builds (the committed index names only ``keep``)."""
    import shutil

    for p in root.glob(f"{DENSE_DIR}-*"):
        if p.is_dir() and p.name != keep:
            shutil.rmtree(p, ignore_errors=True)
