"""The search service behind the API: query building, lanes of concurrent searches with a
bounded queue, re-index pick-up, explanations and the bound on per-query cache memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import re
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import scipy.sparse as sp

from sparsemm import __version__
from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import json_sha256, read_json
from sparsemm.query.handle import INDEX_DIR
from sparsemm.query.hits import ExcludedCheck, Hit, MatchedConcept, TermEvidence
from sparsemm.query.parse import MAX_QUERY_CHARS, Query
from sparsemm.query.request import MATCH_THRESHOLD, QueryRequest, build_request
from sparsemm.query.searcher import Searcher
from sparsemm.query.strategies import HardFilter
from sparsemm.text import singular
from sparsemm.web.images import ImageStore, ThumbCache
from sparsemm.web.lanes import FairSemaphore
from sparsemm.web.schemas import (
    MAX_K,
    MAX_OFFSET,
    ConceptOut,
    DimItemOut,
    DimOut,
    EvidenceOut,
    ExcludedOut,
    ExplainOut,
    HealthOut,
    HitOut,
    ItemDetailOut,
    QueryOut,
    SearchOut,
    SearchRequest,
)

log = logging.getLogger(__name__)

EXPLAIN_DIMS = 5  # matched concepts listed per hit
ITEM_CONCEPTS = 8  # an item's own strongest concepts in an explanation
# Per-query caches of the strategy context (embeddings, codes, score arrays) are dropped
# when they pass this size; measured every CACHE_CHECK_EVERY requests (summing is O(entries)).
MAX_CACHE_BYTES = 256 * 2**20
CACHE_CHECK_EVERY = 32
# Searches in progress at once (threads: the index kernels and torch release the GIL), the
# share of them a costly query may hold, how many may wait for a lane and for how long.
DEFAULT_WORKERS = 4
HEAVY_TERMS = 8  # a query with more include + exclude terms than this is costly
MAX_WAITING = 256
QUEUE_TIMEOUT = 10.0
RELOAD_CHECK_SECONDS = 1.0  # how often a request stats the manifests for a re-index
# After a reload, a settled server re-settles its heap once the replaced version's last
# requests are done (they finish within QUEUE_TIMEOUT plus a search); checked this often.
RESETTLE_SECONDS = 15.0
MAX_DIM_ITEMS = 100
# The photo concept model's codes are class probabilities: below this one a class is a
# guess, not something a reader should see named on a photo ("wig", "bassoon" at 2-4%).
CONCEPT_FLOOR = 0.1


# ------------------------------------------------------------------------------- queries


def _query_out(q: Query) -> QueryOut:
    return QueryOut(include=list(q.include), exclude=list(q.exclude), text=q.text)


def violations(
    labels: Sequence[str], exclude: Sequence[str], evidence: Sequence[TermEvidence] = ()
) -> list[str]:
    """The excluded terms the item most likely shows: one of ``labels`` names it (case and a
    plural 's' ignored; 'person' matches the label 'person', 'dogs' the label 'dog'), or the
    served scorer gives it a probability of at least :data:`MATCH_THRESHOLD` (a photo
    folder has no labels: "more like" a cat picture "but not cat" still lists the cats
    when nothing else looks like it, at a low match, and says they show one)."""
    have = {_label_key(str(lab)) for lab in labels}
    likely = {
        e.term
        for e in evidence
        if e.side == "exclude" and e.kind != "code similarity" and e.value >= MATCH_THRESHOLD
    }
    return [t for t in exclude if _label_key(t) in have or t in likely]


def _label_key(text: str) -> str:
    """A label or term compared without case and number: its words, each in singular
    (:func:`sparsemm.text.singular`, the form the detectors and captions use)."""
    return " ".join(singular(w) for w in re.findall(r"[\w-]+", text.lower()))


# ------------------------------------------------------------------------------- service


def index_version(collection_root: Path) -> tuple[int, str]:
    """(generation, digest) of the committed index in a collection folder: the manifest's
    ``next_segment`` counter and the first 16 hex digits of the SHA-256 of the whole
    manifest (segments, their checksums and the metadata), which changes with every commit."""
    manifest = read_json(collection_root / INDEX_DIR / "manifest.json")
    if not isinstance(manifest, dict):
        raise SparsemmError(f"{collection_root}/{INDEX_DIR}/manifest.json is not an index manifest")
    return int(manifest.get("next_segment", 0)), json_sha256(manifest)[:16]


def _stamp(collection_root: Path) -> tuple[tuple[int, int, int], ...]:
    """What changes when the collection or its index is rewritten: (inode, size, mtime) of
    both manifests (every writer swaps them atomically, so a new commit is a new file)."""
    out = []
    for path in (collection_root / "manifest.json", collection_root / INDEX_DIR / "manifest.json"):
        try:
            st = path.stat()
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((0, 0, 0))
    return tuple(out)


def _code_values(codes: sp.csr_matrix, i: int) -> dict[int, float]:
    """Row ``i`` of a CSR matrix as {dim: value}, from its arrays (row slicing a scipy
    matrix costs ~0.1 ms of object overhead, a tenth of a search)."""
    lo, hi = int(codes.indptr[i]), int(codes.indptr[i + 1])
    return dict(zip(codes.indices[lo:hi].tolist(), codes.data[lo:hi].tolist(), strict=True))


class ServerBusy(SparsemmError):
    """The server has more searches in progress or waiting than it accepts (HTTP 503)."""


class IndexUnavailable(SparsemmError):
    """The index changed on disk and could not be reopened (HTTP 503)."""


class NotFound(SparsemmError):
    """No such item or dimension (HTTP 404)."""


@dataclass(frozen=True)
class _Served:
    """One opened version of the collection: everything a request reads, swapped as a whole."""

    searcher: Searcher
    images: ImageStore
    row_of: dict[str, int]
    generation: int
    digest: str
    stamp: tuple[tuple[int, int, int], ...]


class SearchService:
    """The API's operations over one :class:`Searcher`, independent of HTTP.

    Concurrency: searches run on the server's threads at once (the strategy caches are
    thread-safe LRU caches), at most ``workers`` at a time and at most ``heavy_workers`` of
    them costly (more than :data:`HEAVY_TERMS` terms; a quarter by default), so slow queries
    cannot take every lane; lanes go to waiting requests in arrival order
    (:class:`~sparsemm.web.lanes.FairSemaphore`); a request that waits longer than
    ``queue_timeout`` seconds for a lane, or finds ``max_waiting`` requests already
    waiting, is refused with :class:`ServerBusy` (503).

    Re-index: at most once every ``check_every`` seconds a request stats the collection's and
    index's manifests; when a writer committed a new version, a new Searcher is opened and
    swapped in atomically (requests in progress finish on the one they started with). If it
    cannot be opened, requests get :class:`IndexUnavailable` (503) until it can.
    """

    def __init__(
        self,
        searcher: Searcher,
        images: ImageStore | None = None,
        *,
        workers: int = DEFAULT_WORKERS,
        heavy_workers: int | None = None,
        max_waiting: int = MAX_WAITING,
        queue_timeout: float = QUEUE_TIMEOUT,
        check_every: float = RELOAD_CHECK_SECONDS,
    ) -> None:
        if workers < 1:
            raise SparsemmError(f"workers must be at least 1, got {workers}")
        root = searcher.collection.root
        gen, digest = index_version(root)
        images = images if images is not None else ImageStore.from_collection(searcher.collection)
        self._current = self._served(searcher, images, gen, digest, _stamp(root))
        self._pinned = threading.local()  # the version a request in this thread started on
        self._lanes = FairSemaphore(workers)
        heavy = max(1, workers // 4) if heavy_workers is None else heavy_workers
        self._heavy_lanes = FairSemaphore(max(1, min(heavy, workers)))
        self.workers, self.max_waiting, self.queue_timeout = workers, max_waiting, queue_timeout
        self.heavy_terms = HEAVY_TERMS
        self._waiting = 0
        self._count_lock = threading.Lock()  # _waiting, _requests
        self._reload_lock = threading.Lock()
        self.check_every = check_every
        self._checked = time.monotonic()
        self._reload_error: str | None = None
        self._failing: str | None = None  # the last search failed unexpectedly: why
        self._settling = False  # settle_heap was asked for: keep the heap settled
        self._settle_at: float | None = None  # when to try again (after a reload)
        self._replaced: list[weakref.ref[Searcher]] = []  # versions a reload swapped out
        self.resettle_after = RESETTLE_SECONDS
        self.thumbs = ThumbCache()
        self._requests = 0

    @staticmethod
    def _served(
        searcher: Searcher,
        images: ImageStore,
        gen: int,
        digest: str,
        stamp: tuple[tuple[int, int, int], ...],
    ) -> _Served:
        row_of = {item_id: row for row, item_id in enumerate(searcher.collection.ids)}
        return _Served(searcher, images, row_of, gen, digest, stamp)

    # -- the served version ------------------------------------------------------------
    @property
    def state(self) -> _Served:
        pinned: _Served | None = getattr(self._pinned, "state", None)
        return pinned if pinned is not None else self._current

    @property
    def searcher(self) -> Searcher:
        return self.state.searcher

    @property
    def collection(self) -> Collection:
        return self.state.searcher.collection

    @property
    def images(self) -> ImageStore:
        return self.state.images

    @property
    def row_of(self) -> dict[str, int]:
        return self.state.row_of

    @property
    def n_dims(self) -> int:
        return int(self.state.searcher.index.dim)

    def refresh(self, force: bool = False) -> None:
        """Swap in a re-indexed collection if a writer committed one (checked at most once
        every ``check_every`` seconds; the check is two stat calls)."""
        now = time.monotonic()
        if not force and now - self._checked < self.check_every:
            return
        if not self._reload_lock.acquire(blocking=False):
            return  # another thread is checking or reopening; serve the current version
        try:
            if not force and now - self._checked < self.check_every:
                return
            self._checked = now
            old = self._current
            root = old.searcher.collection.root
            stamp = _stamp(root)
            if stamp == old.stamp and self._reload_error is None:
                return
            try:
                gen, digest = index_version(root)
                if (gen, digest) == (old.generation, old.digest) and self._reload_error is None:
                    # a manifest rewritten with the same segments (e.g. metadata only)
                    self._current = dataclasses.replace(old, stamp=stamp)
                    return
                new = Searcher(
                    root,
                    encoder=old.searcher._encoder,
                    store=_remote_store(old),
                    in_memory=old.searcher.index.in_memory,
                )
                new.default_strategy = old.searcher.default_strategy
                _ = new.text_context
                images = ImageStore.from_collection(new.collection)
                self._current = self._served(new, images, gen, digest, _stamp(root))
                self._reload_error = None
                if self._settling:  # the heap is settled again once old is gone
                    gc.unfreeze()
                    self._replaced.append(weakref.ref(old.searcher))
                    self._settle_at = time.monotonic() + self.resettle_after
                log.info("the index of %s changed (generation %d, %s): reopened", root, gen, digest)
            except (SparsemmError, OSError, ValueError, KeyError) as exc:
                self._reload_error = (
                    f"the index of {root.name} changed on disk and cannot be opened ({exc}); "
                    "wait for the re-index to finish or restart the server"
                )
                log.warning("%s", self._reload_error)
        finally:
            self._reload_lock.release()

    def settle_heap(self) -> None:
        """Collect once, then freeze every object alive now (:func:`gc.freeze`), for a
        server that has loaded what it serves. A collection's item records are hundreds of
        thousands of Python objects, and every full pass of the cyclic garbage collector
        walked them all with every thread stopped: 0.4 s at 100k items, a dozen times in
        30 s under load (docs/results.md, "Server load"). Frozen objects are
        still freed when their last reference goes. A reload unfreezes the heap; once no
        request uses the replaced version any more, it is collected and the heap is frozen
        again (so a version kept alive only by a reference cycle is not kept forever).
        What requests in flight hold at that moment is frozen with the rest: if some of it
        becomes cyclic garbage, it waits for the next reload (bounded, once per reload).
        Process-wide, so only for a server process."""
        with self._reload_lock:
            self._settle()

    def _settle(self) -> None:  # with _reload_lock held
        self._settling = True
        gc.unfreeze()
        gc.collect()
        if any(ref() is not None for ref in self._replaced):
            log.debug("a replaced index version is still in use; settling the heap later")
            self._settle_at = time.monotonic() + self.resettle_after
            return
        self._replaced.clear()
        self._settle_at = None
        gc.freeze()

    def _settle_if_due(self) -> None:
        due = self._settle_at
        if due is None or time.monotonic() < due or not self._reload_lock.acquire(blocking=False):
            return
        try:  # checked again under the lock: a reload may have just moved it
            if self._settle_at is not None and time.monotonic() >= self._settle_at:
                self._settle()
        finally:
            self._reload_lock.release()

    @contextlib.contextmanager
    def pinned(self) -> Iterator[_Served]:
        """Serve one request from one version: refresh, then pin the current version to
        this thread until the request is answered."""
        self.refresh()
        if self._reload_error is not None:
            raise IndexUnavailable(self._reload_error)
        searcher = self._current.searcher
        if searcher.store is searcher.index:
            try:  # a segment file changed on disk: other values than the verified ones
                searcher.index.check_files()
            except SparsemmError as exc:
                self._reload_error = str(exc)
                self._checked = 0.0  # look for a rebuilt index at the next request
                raise IndexUnavailable(str(exc)) from None
        self._settle_if_due()
        prev = getattr(self._pinned, "state", None)
        self._pinned.state = state = self._current
        try:
            yield state
        finally:
            self._pinned.state = prev

    @contextlib.contextmanager
    def lane(self, heavy: bool = False) -> Iterator[None]:
        """Hold a worker lane (and a heavy lane for a costly query) while searching; refuse
        with ServerBusy when too many wait or the wait passes ``queue_timeout``."""
        with self._count_lock:
            if self._waiting >= self.max_waiting:
                raise ServerBusy(
                    f"the server is busy ({self._waiting} searches waiting); retry shortly"
                )
            self._waiting += 1
        held: list[FairSemaphore] = []
        try:
            deadline = time.monotonic() + self.queue_timeout
            for sem in (self._heavy_lanes, self._lanes) if heavy else (self._lanes,):
                if not sem.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise ServerBusy(
                        f"the server is busy (no search lane free within "
                        f"{self.queue_timeout:g} s); retry shortly"
                    )
                held.append(sem)
        except BaseException:
            for sem in reversed(held):
                sem.release()
            raise
        finally:
            with self._count_lock:
                self._waiting -= 1
        try:
            yield
        finally:
            for sem in reversed(held):
                sem.release()

    # -- rendering ---------------------------------------------------------------------
    def image_url(self, item_id: str, prefix: str = "") -> str | None:
        if item_id not in self.images:
            return None
        return f"{prefix}/images/{quote(item_id, safe='')}"

    def _item_fields(self, row: int, prefix: str) -> dict[str, Any]:
        item = self.collection.items[row]
        item_id = str(item["id"])
        captions = [str(c) for c in item.get("captions") or []]
        return {
            "id": item_id,
            "caption": captions[0] if captions else "",
            "labels": [str(x) for x in item.get("labels") or []],
            "also": [str(x) for x in item.get("also") or []],
            "image": self.image_url(item_id, prefix),
            "thumb": (
                f"{prefix}/thumbs/{quote(item_id, safe='')}" if item_id in self.images else None
            ),
        }

    @staticmethod
    def _concepts(concepts: Sequence[MatchedConcept]) -> list[ConceptOut]:
        return [ConceptOut(dim=c.dim, weight=c.weight, words=list(c.words)) for c in concepts]

    def _checks(
        self, checks: Sequence[ExcludedCheck], row: int, values: dict[int, float] | None = None
    ) -> list[ExcludedOut]:
        """``values``: the item's code as {dim: value} (None: read from the index)."""
        if not checks:
            return []
        if values is None:
            values = _code_values(self.searcher.item_code(row), 0)
        return [
            ExcludedOut(
                term=e.term,
                dims=list(e.dims),
                item_mass=e.item_mass,
                item_peak=max((abs(values.get(j, 0.0)) for j in e.dims), default=0.0),
                words=e.words,
            )
            for e in checks
        ]

    def _hit(
        self,
        hit: Hit,
        prefix: str,
        exclude: Sequence[str] = (),
        values: dict[int, float] | None = None,
    ) -> HitOut:
        fields = self._item_fields(hit.row, prefix)
        return HitOut(
            **fields,
            rank=hit.rank,
            score=hit.score,
            matched=self._concepts(hit.matched),
            excluded=self._checks(hit.excluded, hit.row, values),
            evidence=[  # fields by hand: dataclasses.asdict deep-copies (~0.1 ms each)
                EvidenceOut(
                    term=e.term,
                    side=e.side,
                    kind=e.kind,
                    value=e.value,
                    dims=list(e.dims),
                    words=list(e.words),
                    read_as=list(e.read_as),
                )
                for e in hit.evidence
            ],
            scored_by=dict(hit.scored_by),
            violations=violations(fields["labels"], exclude, hit.evidence),
        )

    # -- operations --------------------------------------------------------------------
    def health(self) -> HealthOut:
        with self.pinned() as st:
            return self._health(st)

    def _health(self, st: _Served) -> HealthOut:
        return HealthOut(
            status="failing" if self._failing else "ok",
            error=self._failing,
            version=__version__,
            collection=self.collection.root.name,
            index_generation=st.generation,
            index_digest=st.digest,
            items=len(self.collection.items),
            images=len(self.images),
            dims=self.n_dims,
            strategies=self.searcher.strategies(),
            default_strategy=self.searcher.default_strategy,
            max_k=MAX_K,
            max_query_chars=MAX_QUERY_CHARS,
            filter_threshold=float(HardFilter.params["threshold"]),
            concept_floor=CONCEPT_FLOOR if self._probability_codes() else 0.0,
            example=st.searcher.example_query(),
        )

    def _probability_codes(self) -> bool:
        """Whether the item codes hold class probabilities (the photo concept model)."""
        model = self.searcher.model
        return getattr(model, "kind", "") == "imagenet_concepts" and not model.unit_codes

    def _bound_caches(self) -> None:
        """Drop the strategy context's per-query caches once they pass MAX_CACHE_BYTES
        (checked every CACHE_CHECK_EVERY requests)."""
        with self._count_lock:
            self._requests += 1
            if self._requests % CACHE_CHECK_EVERY:
                return
        dicts = self.searcher.query_caches()
        size = sum(_nbytes(c) for c in dicts)
        if size > MAX_CACHE_BYTES:
            log.info("query caches hold %.0f MB; clearing them", size / 2**20)
            for c in dicts:
                c.clear()

    def search(self, req: SearchRequest, prefix: str = "", image: Any = None) -> SearchOut:
        """A text query, or "more like" ``req.like`` (an item id) or ``image`` (a decoded
        upload) with the query's exclusions (:meth:`Searcher.answer`)."""
        like: Any = image if image is not None else req.like
        with self.pinned():
            if like is not None and image is None:
                self.row(str(req.like))  # 404 for an unknown item
            request = build_request(
                req.q,
                req.include,
                req.exclude,
                k=req.k,
                offset=req.offset,
                strategy=req.strategy,
                like=like,
                min_score=req.min_score,
                count=req.count,
            )
            try:
                out = self._search(request, prefix, image)
            except SparsemmError:
                raise  # the request's own fault (or busy): the searches themselves work
            except Exception as exc:
                # a search that fails for no fault of the request (a 500): /api/health says
                # so until one succeeds, instead of "ok"
                self._failing = f"searches fail ({type(exc).__name__}); see the server log"
                raise
            self._failing = None
            return out

    def _search(self, request: QueryRequest, prefix: str, image: Any) -> SearchOut:
        query = request.query
        heavy = request.heavy_terms > self.heavy_terms
        if request.like is None and not heavy:
            # Text encoding happens before a lane is taken: the waiting requests' texts go
            # through the encoder in shared batches (one thread, torch without the GIL)
            # while the lanes rank other queries. A costly query encodes in its lane.
            self.searcher.prepare(query, request.strategy)
        with self.lane(heavy=heavy):
            try:  # the searcher names unknown strategies and terms (Searcher.check_terms)
                answer = self.searcher.answer(request)
            finally:
                self._bound_caches()
        label = None
        if request.like is not None:
            label = "uploaded image" if image is not None else f"item {request.like}"
        hits = answer.hits
        # the hits' codes in one read (the excluded-term checks show each item's peak)
        codes = self.searcher.item_codes([h.row for h in hits])
        log.debug(
            "search %r like %s [%s] -> %d hits", query.text, label, answer.strategy, len(hits)
        )
        full = len(hits) == request.k and request.offset + request.k <= MAX_OFFSET
        return SearchOut(
            query=_query_out(query),
            strategy=answer.strategy,
            k=request.k,
            offset=request.offset,
            next_offset=request.offset + request.k if full else None,
            total=len(self.collection.items),
            like=label,
            unknown_words=answer.unknown_words,
            notes=answer.notes,
            probabilistic=answer.probabilistic,
            threshold=answer.threshold,
            matches=answer.matches,
            min_score=answer.min_score,
            certified=answer.certified,
            hits=[
                self._hit(h, prefix, query.exclude, _code_values(codes, i))
                for i, h in enumerate(hits)
            ],
        )

    def row(self, item_id: str) -> int:
        if item_id not in self.row_of:
            raise NotFound("unknown item id")
        return self.row_of[item_id]

    def explain(
        self, item_id: str, query: Query, prefix: str = "", like: str | None = None
    ) -> ExplainOut:
        """Why ``item_id`` matches ``query`` (with ``like``: like that item, ``query``
        holding only exclusions)."""
        with self.pinned():
            return self._explain(item_id, query, prefix, like)

    def _explain(self, item_id: str, query: Query, prefix: str, like: str | None) -> ExplainOut:
        row = self.row(item_id)
        if like is not None:
            self.row(like)
        with self.lane(heavy=len(query.include) + len(query.exclude) > self.heavy_terms):
            try:
                if like is None:
                    matched, checks = self.searcher.explain(row, query, n_dims=EXPLAIN_DIMS)
                else:
                    matched, checks = self.searcher.explain_like(
                        row, like, query.exclude, n_dims=EXPLAIN_DIMS
                    )
            finally:
                self._bound_caches()
        code = self.searcher.item_code(row)
        order = np.argsort(-code.data, kind="stable")[:ITEM_CONCEPTS]
        own = [
            ConceptOut(
                dim=int(code.indices[i]),
                weight=float(code.data[i]),
                words=self.searcher.dim_words(int(code.indices[i])),
            )
            for i in order
            if code.data[i] > 0
        ]
        item = self.collection.items[row]
        return ExplainOut(
            item=ItemDetailOut(
                **self._item_fields(row, prefix),
                captions=[str(c) for c in item.get("captions") or []],
            ),
            query=_query_out(query),
            matched=self._concepts(matched),
            excluded=self._checks(checks, row),
            concepts=own,
        )

    def dim(self, dim: int, n: int = 12, prefix: str = "") -> DimOut:
        with self.pinned(), self.lane():
            return self._dim(dim, n, prefix)

    def _dim(self, dim: int, n: int, prefix: str) -> DimOut:
        if not 0 <= dim < self.n_dims:
            raise NotFound(f"no dimension {dim}; dimensions are 0..{self.n_dims - 1}")
        # the dim's posting list through the index: highest value first, ties by lower row
        res = self.searcher.index.search((np.array([dim]), np.array([1.0], np.float32)), k=n)
        rows, vals = np.asarray(res.rows), np.asarray(res.scores)
        order = np.arange(len(rows))
        s = self.searcher
        return DimOut(
            dim=dim,
            words=s.dim_words(dim),
            data_words=list(s.labels_data[dim]) if dim < len(s.labels_data) else [],
            spine_words=list(s.labels_spine[dim]) if dim < len(s.labels_spine) else [],
            items=[
                DimItemOut(**self._item_fields(int(rows[i]), prefix), value=float(vals[i]))
                for i in order
                if vals[i] > 0
            ],
        )


def _remote_store(served: _Served) -> Any:
    """The store a reopened Searcher should read: a remote one (Qdrant) carries over, the
    collection's own index is reopened with it."""
    store = served.searcher.store
    return None if store is served.searcher.index else store


def _nbytes(obj: Any, depth: int = 0) -> int:
    """Approximate memory held by a cache value: arrays by their buffers, containers summed."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if sp.issparse(obj):
        return sum(
            int(getattr(obj, a).nbytes) for a in ("data", "indices", "indptr") if hasattr(obj, a)
        )
    if depth < 4 and isinstance(obj, dict):
        # a snapshot under the cache's own lock: other threads' searches write to it
        with getattr(obj, "_lock", contextlib.nullcontext()):
            values = list(obj.values())
        return sum(_nbytes(v, depth + 1) + 64 for v in values)
    if depth < 4 and isinstance(obj, list | tuple):
        return sum(_nbytes(v, depth + 1) for v in obj)
    return 64
