"""The Qdrant backend: the store interface (:class:`~sparsemm.index.store.Store`) on a Qdrant
server or cluster, plus the resumable upload that fills a collection.

Needs ``qdrant-client`` (``pip install 'sparsemm[qdrant]'``). How the store maps onto Qdrant:

* one Qdrant collection per store; point id = the item's row (0, 1, ... in insertion order);
* one named vector per point: the sparse concept code (``code``, a Qdrant sparse vector, dot
  product);
* payload: ``id`` (the item's string id, keyword-indexed) and, for every configured filter
  threshold t, ``active_gt_<t>``: the dims on which the item's value is > t (integer list,
  lookup-indexed);
* a filter :class:`~sparsemm.index.Exclusion` (drop items whose value on any of dims D is
  > t) is ``must_not: [{key: active_gt_<t>, match: {any: D}}]``; it is exact for the
  thresholds the collection was created with and refused for others (the local index takes
  any threshold). A penalty exclusion is score-based: its dims enter the query vector with
  weight -penalty * w_j;
* collection metadata ``sparsemm``: format, dims, vector name, thresholds, the number of
  committed items ``count`` and the largest item norm (for the rescoring bound below).

Exactness: Qdrant sums scores in its own order and precision, so near-ties may round
differently from the local index. A search therefore fetches every candidate whose Qdrant
score is within a provable bound of the k-th (``QueryTerms.error_bound``: the float32
rounding of an m-term dot product, bounded with the query's weights and the largest stored
item norm), rescores those exactly with the local kernel's arithmetic, and breaks ties by
row: results with a score > 0 equal the inverted index's bit for bit. The fetch doubles its
limit until the bound shows nothing unfetched can enter (usually one request of k + 1
points).

Bulk upload (``upload``/``add``, this backend only) goes in batches of ``batch_size``
points (``wait=True``), each followed by a metadata update of ``count``; an interrupted
upload resumes from ``count`` (upserts are idempotent: re-sent rows overwrite themselves).
Points past ``count`` (sent but not yet recorded) are ignored by searches. One writer at a
time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.index.inputs import (
    Exclusion,
    QueryLike,
    SearchResult,
    check_codes,
    check_items,
    check_k,
)
from sparsemm.index.scoring import (
    Plan,
    iter_batches,
    ranked,
    sparse_query_terms,
    sparse_rescore,
)
from sparsemm.index.store import Store

logger = logging.getLogger(__name__)

META_KEY = "sparsemm"
FORMAT = "sparsemm.qdrant"
VERSION = 1
ID_FIELD = "id"


def _qdrant() -> Any:
    """The qdrant_client package, or a SparsemmError naming the extra to install."""
    try:
        import qdrant_client
    except ImportError as exc:  # pragma: no cover - the extra is installed in development
        raise SparsemmError(
            "the Qdrant backend needs qdrant-client: pip install 'sparsemm[qdrant]'"
        ) from exc
    return qdrant_client


def connect(
    url: str | None = None,
    *,
    api_key: str | None = None,
    timeout: int | None = None,
    prefer_grpc: bool = False,
) -> Any:
    """A ``QdrantClient`` for a server/cluster ``url`` (``http://host:6333``), or
    ``":memory:"`` for qdrant-client's in-process local mode (tests; nothing persisted).

    qdrant-client's on-disk local mode is not offered: it stores points with pickle.
    """
    qc = _qdrant()
    if url is None or not str(url).strip():
        raise SparsemmError("the qdrant backend needs --url (e.g. http://localhost:6333)")
    url = str(url).strip()
    if url == ":memory:":
        return qc.QdrantClient(location=":memory:")
    if "://" not in url:
        raise SparsemmError(
            f"--url {url!r} is not a URL; give the server address, e.g. http://localhost:6333"
        )
    # The client connects lazily: ask the server once now, so an address with no server
    # behind it is one clear error here instead of an HTTP traceback from the first request.
    # (The client's own version check runs in a thread and only warns; done here instead.)
    client = qc.QdrantClient(
        url=url,
        api_key=api_key,
        timeout=timeout,
        prefer_grpc=prefer_grpc,
        check_compatibility=False,
    )
    try:
        client.get_collections()
    except Exception as exc:  # connection refused, DNS, TLS, auth, timeouts: all one way
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise SparsemmError(
            f"cannot reach a Qdrant server at {url} ({reason}); start it or check --url "
            "(and --api-key)"
        ) from exc
    _warn_if_incompatible(client, url)
    return client


def _warn_if_incompatible(client: Any, url: str) -> None:
    """Log a warning when the server's major version differs from qdrant-client's, or the
    minor versions differ by more than one (qdrant-client's own compatibility rule)."""
    try:
        from importlib.metadata import version

        mine = [int(x) for x in version("qdrant-client").split(".")[:2]]
        theirs = [int(x) for x in str(client.info().version).split(".")[:2]]
    except Exception:  # an old server without /info, an odd version string: not worth failing
        return
    if mine[0] != theirs[0] or abs(mine[1] - theirs[1]) > 1:
        logger.warning(
            "the Qdrant server at %s runs version %d.%d, qdrant-client is %d.%d; they may "
            "not work together (major versions should match, minor ones differ by <= 1)",
            url,
            *theirs,
            *mine,
        )


@dataclass(frozen=True)
class QdrantConfig:
    """How a store's Qdrant collection is laid out (kept in the collection's metadata)."""

    sparse_name: str = "code"  # named sparse vector holding the concept code
    thresholds: tuple[float, ...] = (0.0,)  # filter thresholds served by active-dim payloads
    shard_number: int | None = None  # shards across the cluster's nodes (None: server default)
    replication_factor: int | None = None  # copies of each shard (None: server default, 1)
    write_consistency_factor: int | None = None  # replicas that must ack a write
    on_disk: bool = False  # sparse index and payload memory-mapped, not in RAM

    def __post_init__(self) -> None:
        ts = tuple(float(t) for t in self.thresholds)
        if not ts or any(not math.isfinite(t) or t < 0 for t in ts):
            raise SparsemmError(f"filter thresholds must be finite and >= 0, got {ts}")
        object.__setattr__(self, "thresholds", tuple(sorted(set(ts))))


def active_field(threshold: float) -> str:
    """Payload key of the dims whose value is > ``threshold`` (``active_gt_0p1`` for 0.1)."""
    return "active_gt_" + repr(float(threshold)).replace(".", "p").replace("-", "m")


def active_lists(csr: sp.csr_matrix, threshold: float) -> list[list[int]]:
    """Per row of ``csr``, its dims with value > ``threshold``, compared in float64 exactly as
    the inverted index's filter does (a float32 comparison would differ at t = 0.1)."""
    keep = csr.data.astype(np.float64) > float(threshold)
    row_of = np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))
    counts = np.bincount(row_of[keep], minlength=csr.shape[0])
    bounds = np.concatenate([[0], np.cumsum(counts)])
    dims = csr.indices[keep].tolist()
    return [dims[bounds[i] : bounds[i + 1]] for i in range(csr.shape[0])]


class QdrantStore(Store):
    """A store in one Qdrant collection (see the module docstring for the mapping)."""

    backend: ClassVar[str] = "qdrant"

    def __init__(self, client: Any, name: str, meta: dict[str, Any]) -> None:
        self.client = client
        self.name = name
        self._set_meta(meta)

    # ----- construction ---------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        client: Any,
        name: str,
        dim: int,
        config: QdrantConfig | None = None,
        overwrite: bool = False,
    ) -> QdrantStore:
        """Create collection ``name`` for ``dim``-d codes."""
        models = _qdrant().models
        cfg = config or QdrantConfig()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise SparsemmError(f"dim must be a positive integer, got {dim!r}")
        if client.collection_exists(name):
            if not overwrite:
                raise SparsemmError(
                    f"Qdrant collection {name!r} already exists; resume into it, or recreate "
                    "it (overwrite=True / --overwrite)"
                )
            client.delete_collection(name)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "dim": int(dim),
            "config": {**asdict(cfg), "thresholds": list(cfg.thresholds)},
            "count": 0,
            "max_norm": 0.0,
        }
        client.create_collection(
            name,
            vectors_config={},
            sparse_vectors_config={
                cfg.sparse_name: models.SparseVectorParams(
                    index=models.SparseIndexParams(on_disk=cfg.on_disk)
                )
            },
            shard_number=cfg.shard_number,
            replication_factor=cfg.replication_factor,
            write_consistency_factor=cfg.write_consistency_factor,
            on_disk_payload=cfg.on_disk,
            metadata={META_KEY: meta},
        )
        client.create_payload_index(name, ID_FIELD, models.PayloadSchemaType.KEYWORD)
        for t in cfg.thresholds:
            client.create_payload_index(
                name,
                active_field(t),
                models.IntegerIndexParams(
                    type=models.IntegerIndexType.INTEGER, lookup=True, range=False
                ),
            )
        logger.info("created Qdrant collection %s (dim %d)", name, dim)
        return cls(client, name, meta)

    @classmethod
    def open(cls, client: Any, name: str) -> QdrantStore:
        """Open a collection made by :meth:`create`."""
        return cls(client, name, cls._read_meta(client, name))

    @staticmethod
    def _read_meta(client: Any, name: str) -> dict[str, Any]:
        if not client.collection_exists(name):
            raise SparsemmError(
                f"Qdrant has no collection {name!r}; create it with `sparsemm index ... "
                "--backend qdrant`"
            )
        info = client.get_collection(name)
        meta = (getattr(info.config, "metadata", None) or {}).get(META_KEY)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SparsemmError(f"Qdrant collection {name!r} was not made by sparsemm")
        if int(meta.get("version", 0)) > VERSION:
            raise SparsemmError(f"collection {name!r} was written by a newer sparsemm; upgrade")
        return meta

    def _set_meta(self, meta: dict[str, Any]) -> None:
        self._meta = meta
        # collections of earlier versions also name a dense vector (no longer read): dropped
        known = set(QdrantConfig.__dataclass_fields__)
        cfg = {key: v for key, v in meta["config"].items() if key in known}
        cfg["thresholds"] = tuple(cfg["thresholds"])
        self.config = QdrantConfig(**cfg)
        self._count = int(meta["count"])

    def reload(self) -> None:
        """Re-read the collection's metadata (items committed by another writer)."""
        self._set_meta(self._read_meta(self.client, self.name))

    def close(self) -> None:
        self.client.close()

    # ----- properties -----------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return int(self._meta["dim"])

    @property
    def nonnegative(self) -> bool:
        """False: the collection does not record its smallest value, so it cannot vouch
        (a :class:`~sparsemm.query.searcher.Searcher` takes the answer from the collection's
        own index, which holds the same codes)."""
        return False

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"QdrantStore({self.name!r}, count={self._count})"

    # ----- writing --------------------------------------------------------------------------

    def _points(self, start: int, csr: sp.csr_matrix, ids: list[str]) -> list[Any]:
        models = _qdrant().models
        cfg = self.config
        actives = {active_field(t): active_lists(csr, t) for t in cfg.thresholds}
        points = []
        for i, item_id in enumerate(ids):
            lo, hi = csr.indptr[i], csr.indptr[i + 1]
            vec: dict[str, Any] = {
                cfg.sparse_name: models.SparseVector(
                    indices=csr.indices[lo:hi].tolist(), values=csr.data[lo:hi].tolist()
                )
            }
            payload: dict[str, Any] = {ID_FIELD: item_id}
            for key, lists in actives.items():
                payload[key] = lists[i]
            points.append(models.PointStruct(id=start + i, vector=vec, payload=payload))
        return points

    def upload(
        self, codes: Any, ids: Sequence[str], *, batch_size: int = 1024, progress: bool = False
    ) -> int:
        """Bulk-load items; resumable. Returns the number of items added now.

        If the collection already holds m items they must be the first m given (an
        interrupted upload of the same data): only the rest is added. Other data raises
        SparsemmError.
        """
        csr = check_codes(codes, self.dim)
        id_list = [str(i) for i in ids]
        n, m = len(id_list), len(self)
        if csr.shape[0] != n:
            raise SparsemmError(f"{csr.shape[0]} codes for {n} ids; they must match")
        if m > n or (m and not self._same_prefix(csr[:m], id_list[:m])):
            raise SparsemmError(
                f"the store already holds {m} items that are not the first {m} of these; "
                "upload into a new store (or recreate it) instead of resuming"
            )
        if m == n:
            logger.info("store holds all %d items already; nothing to upload", n)
            return 0
        if m:
            logger.info("resuming upload at item %d of %d", m, n)
        self.add(csr[m:], id_list[m:], batch_size=batch_size, progress=progress)
        return n - m

    def add(
        self, codes: Any, ids: Sequence[str], *, batch_size: int = 1024, progress: bool = False
    ) -> None:
        """Append items in batches of ``batch_size`` (each committed: see the module doc)."""
        from tqdm.auto import tqdm

        models = _qdrant().models
        csr, id_list = check_items(codes, ids, self.dim)
        n = len(id_list)
        self.reload()
        bar = tqdm(total=n, disable=not progress, unit="item", desc=f"qdrant {self.name}")
        try:
            for lo, hi in iter_batches(n, batch_size):
                batch_ids = id_list[lo:hi]
                same_ids = models.Filter(
                    must=[models.FieldCondition(key=ID_FIELD, match=models.MatchAny(any=batch_ids))]
                )
                clash = self.client.count(self.name, count_filter=same_ids, exact=True).count
                if clash:  # only points of committed rows count: orphans are re-sent below
                    hits, _ = self.client.scroll(
                        self.name,
                        scroll_filter=same_ids,
                        limit=len(batch_ids),
                        with_payload=[ID_FIELD],
                    )
                    taken = [h for h in hits if int(h.id) < self._count]
                    if taken:
                        raise SparsemmError(
                            f"id {taken[0].payload[ID_FIELD]!r} is already in Qdrant "
                            f"collection {self.name!r}"
                        )
                sub = csr[lo:hi]
                self.client.upsert(self.name, self._points(self._count, sub, batch_ids), wait=True)
                norms = np.sqrt(np.asarray(sub.multiply(sub).sum(axis=1), np.float64)).ravel()
                meta = dict(self._meta)
                meta["count"] = self._count + (hi - lo)
                meta["max_norm"] = max(float(meta["max_norm"]), float(norms.max(initial=0.0)))
                self.client.update_collection(self.name, metadata={META_KEY: meta})
                self._set_meta(meta)
                bar.update(hi - lo)
        finally:
            bar.close()
        logger.info("Qdrant collection %s: %d items (+%d)", self.name, self._count, n)

    def _same_prefix(self, codes: sp.csr_matrix, ids: list[str]) -> bool:
        """Whether the collection's first len(ids) items are these: spot-checks 64 rows
        spread over the prefix (first and last included)."""
        m = len(ids)
        rows = np.unique(np.linspace(0, m - 1, num=min(m, 64)).round().astype(np.int64))
        cfg = self.config
        got = self.client.retrieve(
            self.name, ids=rows.tolist(), with_payload=[ID_FIELD], with_vectors=True
        )
        by_row = {int(p.id): p for p in got}
        for r in rows.tolist():
            p = by_row.get(r)
            if p is None or p.payload.get(ID_FIELD) != ids[r]:
                return False
            lo, hi = codes.indptr[r], codes.indptr[r + 1]
            sv = (p.vector or {}).get(cfg.sparse_name)
            idx = [] if sv is None else list(sv.indices)
            val = [] if sv is None else list(sv.values)
            if idx != codes.indices[lo:hi].tolist() or not np.array_equal(
                np.asarray(val, np.float32), codes.data[lo:hi]
            ):
                return False
        return True

    # ----- search ---------------------------------------------------------------------------

    def codes(self, rows: Sequence[int] | np.ndarray) -> sp.csr_matrix:
        r = np.asarray(rows, dtype=np.int64).ravel()
        if r.size and (r.min() < 0 or r.max() >= self._count):
            raise SparsemmError(f"rows must lie in [0, {self._count}), got {r.min()}..{r.max()}")
        name = self.config.sparse_name
        got = self.client.retrieve(self.name, ids=np.unique(r).tolist(), with_vectors=[name])
        by_row = {int(p.id): (p.vector or {}).get(name) for p in got}
        indptr = np.zeros(len(r) + 1, np.int64)
        idx_parts, val_parts = [], []
        for i, row in enumerate(r.tolist()):
            if row not in by_row:
                raise SparsemmError(
                    f"Qdrant collection {self.name} has no point {row}; re-run `sparsemm index "
                    "... --backend qdrant`"
                )
            sv = by_row[row]
            idx = np.asarray([] if sv is None else sv.indices, np.int32)
            val = np.asarray([] if sv is None else sv.values, np.float32)
            idx_parts.append(idx)
            val_parts.append(val)
            indptr[i + 1] = indptr[i] + len(idx)
        idx = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int32)
        vals = np.concatenate(val_parts) if val_parts else np.zeros(0, np.float32)
        out = sp.csr_matrix((vals, idx, indptr), shape=(len(r), self.dim))
        out.sort_indices()
        return out

    def _filter(self, plan: Plan) -> Any:
        if not plan.ban_dims.size:
            return None
        models = _qdrant().models
        t = float(plan.threshold)
        if t not in self.config.thresholds:
            raise SparsemmError(
                f"Qdrant collection {self.name!r} serves filter exclusions at thresholds "
                f"{list(self.config.thresholds)}, not {t}; recreate it with this threshold "
                "(--filter-threshold) or use the local backend"
            )
        return models.Filter(
            must_not=[
                models.FieldCondition(
                    key=active_field(t), match=models.MatchAny(any=plan.ban_dims.tolist())
                )
            ]
        )

    def _collect(self, fetch: Callable[[int], list[Any]], k: int, delta: float) -> list[Any]:
        """Points that may be in the exact top k with a score > 0 (module doc): fetch k + 1,
        doubling the limit while an unfetched point could still be within ``2 delta`` of the
        k-th score."""
        limit = k + 1
        while True:
            pts = fetch(limit)
            valid = [p for p in pts if int(p.id) < self._count]
            if len(pts) < limit:
                return valid  # everything matching was fetched
            last = float(pts[-1].score)
            if last + delta <= 0:
                return valid  # whatever is left scores <= 0 exactly
            if len(valid) >= k and last < float(valid[k - 1].score) - 2 * delta:
                return valid
            limit *= 2

    def _exact_top(
        self,
        query: Any,
        using: str,
        flt: Any,
        k: int,
        delta: float,
        rescore: Callable[[list[Any]], np.ndarray],
    ) -> SearchResult:
        """Exact top k of ``query`` against the named vector ``using``, scores > 0 only: the
        candidates of :meth:`_collect`, rescored by ``rescore(points)`` (n,) f32, ties by
        row."""

        def fetch(limit: int) -> list[Any]:
            return list(
                self.client.query_points(
                    self.name,
                    query=query,
                    using=using,
                    query_filter=flt,
                    limit=limit,
                    with_payload=[ID_FIELD],
                    with_vectors=[using],
                ).points
            )

        pts = self._collect(fetch, k, delta)
        scores = rescore(pts)
        rows = np.asarray([int(p.id) for p in pts], np.int64)
        keep = scores > 0
        rows, scores = rows[keep], scores[keep]
        return ranked(rows, scores, k, {int(p.id): str(p.payload[ID_FIELD]) for p in pts})

    def search(
        self,
        query: QueryLike,
        k: int = 10,
        exclude: Exclusion | None = None,
        *,
        with_ids: bool = True,
    ) -> SearchResult:
        """Exact top ``k`` with score > 0 (:meth:`Store.search`; the ids come with the
        points, so ``with_ids`` changes nothing)."""
        models = _qdrant().models
        k = check_k(k)
        terms = sparse_query_terms(query, exclude, self.dim)
        flt = self._filter(terms.plan)
        if terms.dims.size == 0 or self._count == 0:  # nothing can score > 0
            return SearchResult(np.zeros(0, np.int64), [], np.zeros(0, np.float32))
        qdims, qvals = terms.merged()
        name = self.config.sparse_name

        def rescore(pts: list[Any]) -> np.ndarray:
            indptr = np.zeros(len(pts) + 1, np.int64)
            idx_parts, val_parts = [], []
            for i, p in enumerate(pts):
                sv = p.vector[name]
                idx_parts.append(np.asarray(sv.indices, np.int64))
                val_parts.append(np.asarray(sv.values, np.float32))
                indptr[i + 1] = indptr[i] + len(sv.indices)
            idx = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64)
            vals = np.concatenate(val_parts) if val_parts else np.zeros(0, np.float32)
            return sparse_rescore(terms.terms_dims, terms.terms_w, indptr, idx, vals)

        vector = models.SparseVector(indices=qdims, values=qvals)
        delta = terms.error_bound(float(self._meta["max_norm"]))
        return self._exact_top(vector, name, flt, k, delta, rescore)
