"""HTTP API and search page over one indexed collection (FastAPI).

``create_app(collection_dir)`` wraps a :class:`~sparsemm.query.searcher.Searcher`:

=========================================  =====================================================
``GET /``                                  the search page (static HTML + vanilla JS)
``GET /api/health``                        collection name, item/dimension counts, strategies
``GET|POST /api/search``                   q, include[], exclude[], k (<= 100), offset, strategy
                                           -> hits with score, caption, labels, image URL,
                                           matched concepts and excluded-concept checks
``GET /api/items/{id}/explain``            ?q=&include=&exclude= -> why the item matches, plus
                                           its own strongest concepts
``GET /api/dims/{dim}``                    ?n= -> the dimension's label words and its top items
                                           by activation in the index codes
``POST /api/search/image``                 the same query parameters, the body an image
                                           (PNG/JPEG/..., <= 8 MiB): "more like this
                                           picture", the query naming only what to leave out
``GET /images/{id}``                       the item's image file
``GET /thumbs/{id}``                       a small JPEG of it, made and cached by the server
=========================================  =====================================================

Every error is JSON ``{"error": message}``: a :class:`~sparsemm.errors.SparsemmError`,
invalid parameters or a query term that means nothing to the model (its query code is
empty) give 400, an unknown item, dimension or image 404, an oversized body 413, a full
search queue or an index that changed on disk and cannot be reopened 503 (with Retry-After),
anything unexpected 500 (details only in the server log). The OpenAPI schema documents
exactly these.

Safety: only image files referenced by the collection's items are served, looked up by item
id (a request path is never joined to a folder, so ``..`` cannot escape), and only with an
image suffix; requests whose Host header is not an allowed name are refused (a DNS-rebinding
page cannot read a local server); CORS is off unless origins are given; the page runs under a
strict Content-Security-Policy; query text, term lists, k, offset and request bodies are
bounded, and so is the memory the per-query caches of the strategies may take
(:data:`MAX_CACHE_BYTES`), so a stream of distinct queries cannot exhaust it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import numpy as np
import scipy.sparse as sp

from sparsemm import __version__
from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import read_json
from sparsemm.query.parse import MAX_QUERY_CHARS, Query, parse_query
from sparsemm.query.searcher import INDEX_DIR, Concept, ExcludedCheck, Hit, Searcher
from sparsemm.query.strategies import HardFilter, available_strategies

try:
    from fastapi import FastAPI, HTTPException
    from fastapi import Query as QueryParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from pydantic import BaseModel, ConfigDict, Field, field_validator
    from starlette.datastructures import Headers, MutableHeaders
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise SparsemmError(
        f"the web server needs the '{exc.name}' package: pip install 'sparsemm[web]'"
    ) from exc

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
# Host names a loopback server answers to; anything else is refused (DNS rebinding).
LOCAL_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
MAX_K = 100
MAX_OFFSET = 10_000  # deep paging costs a full sort; nobody pages 100 screens of images
MAX_TERMS = 16  # per include / exclude list
MAX_DIM_ITEMS = 100
MAX_BODY_BYTES = 64 * 1024  # a search request is a few hundred bytes of JSON
MAX_UPLOAD_BYTES = 8 * 2**20  # a query image (POST /api/search/image); a phone photo fits
MAX_UPLOAD_PIXELS = 40_000_000  # decoded size cap: a small file can expand to huge pixels
UPLOAD_PATH = "/api/search/image"
THUMB_PX = 256  # longest side of a thumbnail (the page shows cards at 256 px)
THUMB_CACHE_BYTES = 32 * 2**20  # thumbnails kept in memory, least recently used dropped
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
# Suffixes served from /images/ and their media types; any other referenced file is not served.
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
}
SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
}


# ---------------------------------------------------------------------------- API models


class ErrorOut(BaseModel):
    """Every error response: one line saying what went wrong and what to do."""

    error: str


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorOut,
        "description": "Invalid input: a malformed query, a parameter out of range, an "
        "unknown strategy, a term the model knows nothing about, or an unknown host name",
    },
    404: {"model": ErrorOut, "description": "Unknown item, dimension or path"},
    413: {"model": ErrorOut, "description": "Request body larger than 64 KiB"},
    503: {
        "model": ErrorOut,
        "description": "Too many searches waiting, or the index changed on disk and cannot "
        "be reopened yet; retry after the Retry-After seconds",
    },
    500: {"model": ErrorOut, "description": "Unexpected server error (details in its log)"},
}


class SearchRequest(BaseModel):
    """A search: the typed query ``q`` plus extra include / exclude terms.

    ``q`` uses the query grammar of :mod:`sparsemm.query.parse` ("dog but not cat"); each
    ``include`` / ``exclude`` value is parsed the same way and may hold several
    comma-separated terms ("cat, ball"); a single string stands for a one-value list.
    """

    model_config = ConfigDict(extra="forbid")

    q: str = Field("", max_length=MAX_QUERY_CHARS, description="typed query text")
    include: list[str] = Field(default_factory=list, description="extra terms to find")
    exclude: list[str] = Field(default_factory=list, description="terms to leave out")
    k: int = Field(10, ge=1, le=MAX_K, description="results per page")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="results to skip (paging)")
    strategy: str | None = Field(
        None, max_length=64, description="exclusion strategy (default: the model's)"
    )
    like: str | None = Field(
        None,
        max_length=512,
        description="more like this item (its id): its code is the include side; q, include "
        "and exclude then only name what to leave out",
    )

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _one_value(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ConceptOut(BaseModel):
    dim: int
    weight: float  # matched: contribution q_j x_j to the score; item concepts: x_j
    words: list[str]


class ExcludedOut(BaseModel):
    term: str
    dims: list[int]  # the excluded term's concept dimensions
    item_mass: float  # the item's summed value on those dimensions
    item_peak: float  # its largest value on one of them (the filter strategy's test)
    words: list[str]


class ItemOut(BaseModel):
    id: str
    caption: str
    labels: list[str]
    image: str | None  # URL of the image, None when the item has no servable image
    thumb: str | None = None  # URL of its server-made thumbnail (same None rule)


class EvidenceOut(BaseModel):
    """How strongly the item carries one query term ("dog 0.93", "not cat 0.02")."""

    term: str
    side: str  # include | exclude
    kind: str  # detector (value: P(present)) | code similarity (value: cosine)
    value: float
    dims: list[int]  # the concept dimensions behind the value
    words: list[str]


class HitOut(ItemOut):
    rank: int
    score: float
    matched: list[ConceptOut]
    excluded: list[ExcludedOut]
    evidence: list[EvidenceOut] = []
    violations: list[str] = []  # excluded terms among the item's labels (it breaks the query)


class ItemDetailOut(ItemOut):
    captions: list[str]


class DimItemOut(ItemOut):
    value: float  # the item's activation on the dimension


class QueryOut(BaseModel):
    include: list[str]
    exclude: list[str]
    text: str  # canonical form, e.g. 'dog -cat'


class SearchOut(BaseModel):
    query: QueryOut
    strategy: str
    k: int
    offset: int
    next_offset: int | None  # offset of the next page; None when this page was the last
    total: int  # items in the collection (every one is ranked)
    like: str | None = None  # "more like this" target ("item ID" / "image NAME"), or None
    # query words in no vocabulary of the collection (Searcher.unknown_words), in query order
    unknown_words: list[str] = []
    hits: list[HitOut]


class ExplainOut(BaseModel):
    item: ItemDetailOut
    query: QueryOut
    matched: list[ConceptOut]
    excluded: list[ExcludedOut]
    concepts: list[ConceptOut]  # the item's strongest dimensions, query or not


class DimOut(BaseModel):
    dim: int
    words: list[str]  # the label shown for the dimension
    data_words: list[str]  # caption words over-represented among its items
    spine_words: list[str]  # SPINE top words (when the index was built with --spine)
    items: list[DimItemOut]


class HealthOut(BaseModel):
    status: str
    version: str
    collection: str
    index_generation: int  # the index manifest's commit counter (next_segment)
    index_digest: str  # SHA-256 (16 hex) of its segment list: changes with every re-index
    items: int
    images: int
    dims: int
    strategies: list[str]
    default_strategy: str
    max_k: int
    max_query_chars: int
    filter_threshold: float  # the filter strategy drops items whose peak exceeds this


# ------------------------------------------------------------------------------- queries


def _terms_of(value: Any, side: str) -> Query | None:
    if not isinstance(value, str):
        raise SparsemmError(f"{side} terms must be text, got {type(value).__name__}")
    return parse_query(value) if value.strip() else None


def build_query(q: str = "", include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Query:
    """One :class:`Query` from typed text plus include / exclude term lists.

    ``q`` is parsed with the full grammar; each list value too ("cat, ball" gives two
    terms; "dog -cat" in ``include`` adds both sides), except that an ``exclude`` value may
    not itself exclude something. Blank values are skipped; duplicates are dropped, first
    occurrence wins. Raises SparsemmError for malformed input or too many terms.
    """
    if not isinstance(q, str):
        raise SparsemmError(f"q must be text, got {type(q).__name__}")
    for values, side in ((include, "include"), (exclude, "exclude")):
        if isinstance(values, str):
            raise SparsemmError(f"{side} must be a list of terms, not one string")
        if len(values) > MAX_TERMS:
            raise SparsemmError(f"at most {MAX_TERMS} {side} values are accepted per query")
    inc: list[str] = []
    exc: list[str] = []
    if q.strip():
        base = parse_query(q)
        inc += base.include
        exc += base.exclude
    for value in include:
        part = _terms_of(value, "include")
        if part is None:
            continue
        inc += part.include
        exc += part.exclude
    for value in exclude:
        part = _terms_of(value, "exclude")
        if part is None:
            continue
        if part.exclude:
            raise SparsemmError(
                f"the exclude value {value!r} excludes something itself; list the terms to "
                "leave out, e.g. 'cat, ball'"
            )
        exc += part.include
    if not inc and not exc:
        raise SparsemmError("type what to search for, e.g. 'dog' (and what not to: 'cat')")
    inc = list(dict.fromkeys(inc))
    exc = list(dict.fromkeys(exc))
    if len(inc) > MAX_TERMS or len(exc) > MAX_TERMS:
        raise SparsemmError(f"a query may hold at most {MAX_TERMS} include and exclude terms")
    return Query(tuple(inc), tuple(exc))


def _query_out(q: Query) -> QueryOut:
    return QueryOut(include=list(q.include), exclude=list(q.exclude), text=q.text)


def like_exclusions(q: str = "", include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Query:
    """The exclusions of a "more like this" query: ``q`` and the lists may only leave
    things out ("but not cat"); nothing at all is fine. SparsemmError for an include term."""
    if not q.strip() and not any(v.strip() for v in [*include, *exclude] if isinstance(v, str)):
        return Query.empty()
    query = build_query(q, include, exclude)
    if query.include:
        raise SparsemmError(
            f"a 'more like this' search only takes terms to leave out (got "
            f"{', '.join(query.include)!r} to find); write them as 'but not X'"
        )
    return query


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def violations(labels: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """The excluded terms that one of ``labels`` names (case and a plural 's' ignored;
    'person' matches the label 'person', 'dogs' the label 'dog')."""
    have = {_stem(" ".join(re.findall(r"[\w-]+", str(lab).lower()))) for lab in labels}
    return [t for t in exclude if _stem(" ".join(re.findall(r"[\w-]+", t.lower()))) in have]


def decode_upload(data: bytes) -> Any:
    """A query image from an upload's bytes (a PIL image, RGB); SparsemmError when it is
    empty, too large or not an image."""
    from PIL import Image

    if not data:
        raise SparsemmError("send the query image as the request body (PNG, JPEG, WebP, ...)")
    if len(data) > MAX_UPLOAD_BYTES:
        raise SparsemmError(f"the image is larger than {MAX_UPLOAD_BYTES // 2**20} MiB")
    try:
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > MAX_UPLOAD_PIXELS:
            raise SparsemmError(
                f"the image has {img.width}x{img.height} pixels; send one under "
                f"{MAX_UPLOAD_PIXELS // 10**6} megapixels"
            )
        return img.convert("RGB")
    except SparsemmError:
        raise
    except Exception as exc:  # PIL raises several types for a non-image or a broken file
        raise SparsemmError(
            "the upload is not an image this server can read; send a PNG, JPEG, GIF, WebP "
            "or BMP file"
        ) from exc


# -------------------------------------------------------------------------------- images


class ImageStore:
    """Item id -> image file, for the images the collection's items reference.

    An item's ``image`` may be absolute or relative to the collection folder. Only existing
    regular files with a suffix in :data:`IMAGE_TYPES` are kept; a request can name nothing
    else, since it is looked up by id and never joined to a folder.
    """

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    @classmethod
    def from_collection(cls, col: Collection) -> ImageStore:
        paths: dict[str, Path] = {}
        skipped = 0
        for item in col.items:
            ref = item.get("image")
            if not isinstance(ref, str) or not ref:
                continue
            path = Path(ref).expanduser()
            if not path.is_absolute():
                path = col.root / path
            try:
                path = path.resolve(strict=True)
            except (OSError, RuntimeError):
                skipped += 1
                continue
            if path.suffix.lower() in IMAGE_TYPES and path.is_file():
                paths[str(item["id"])] = path
            else:
                skipped += 1
        if skipped:
            log.warning(
                "%d item image(s) are missing or not image files; those items show as "
                "caption cards",
                skipped,
            )
        return cls(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self.paths

    def get(self, item_id: str) -> Path | None:
        """The image file of ``item_id``; None when it has none or the file changed."""
        path = self.paths.get(item_id)
        if path is None:
            return None
        try:
            # A file swapped for a symlink since startup resolves elsewhere: refuse it.
            if path.resolve(strict=True) != path or not path.is_file():
                return None
        except (OSError, RuntimeError):
            return None
        return path


class ThumbCache:
    """Thumbnails (JPEG, longest side :data:`THUMB_PX`) made from the served images on first
    request, kept in memory up to :data:`THUMB_CACHE_BYTES` (least recently used dropped);
    a file changed since is made again (keyed by path, size and mtime)."""

    def __init__(self, max_bytes: int = THUMB_CACHE_BYTES, px: int = THUMB_PX) -> None:
        self.max_bytes, self.px = max_bytes, px
        self._items: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: Path) -> bytes | None:
        """The thumbnail of ``path``; None when the file cannot be read as an image."""
        try:
            st = path.stat()
        except OSError:
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        data = self._make(path)
        if data is None:
            return None
        with self._lock:
            if key not in self._items:
                self._items[key] = data
                self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)
        return data

    def _make(self, path: Path) -> bytes | None:
        from PIL import Image

        try:
            with Image.open(path) as img:
                if img.width * img.height > MAX_UPLOAD_PIXELS:
                    return None
                img.draft("RGB", (self.px, self.px))  # JPEG: decode at a reduced scale
                small = img.convert("RGB")
                small.thumbnail((self.px, self.px))
                out = io.BytesIO()
                small.save(out, format="JPEG", quality=85)
                return out.getvalue()
        except Exception:  # a broken or non-image file: the page falls back to a caption
            log.warning("cannot make a thumbnail of %s", path, exc_info=True)
            return None


# ------------------------------------------------------------------------------- service


def index_version(collection_root: Path) -> tuple[int, str]:
    """(generation, digest) of the committed index in a collection folder: the manifest's
    ``next_segment`` counter and the first 16 hex digits of the SHA-256 of its segment list
    (names, counts, checksums), which changes with every commit that changes the items."""
    manifest = read_json(collection_root / INDEX_DIR / "manifest.json")
    segments = json.dumps(manifest.get("segments", []), sort_keys=True).encode()
    return int(manifest.get("next_segment", 0)), hashlib.sha256(segments).hexdigest()[:16]


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
    cannot take every lane; a request that waits longer than ``queue_timeout`` seconds for a
    lane, or finds ``max_waiting`` requests already waiting, is refused with
    :class:`ServerBusy` (503).

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
        self._lanes = threading.BoundedSemaphore(workers)
        heavy = max(1, workers // 4) if heavy_workers is None else heavy_workers
        self._heavy_lanes = threading.BoundedSemaphore(max(1, min(heavy, workers)))
        self.workers, self.max_waiting, self.queue_timeout = workers, max_waiting, queue_timeout
        self.heavy_terms = HEAVY_TERMS
        self._waiting = 0
        self._count_lock = threading.Lock()  # _waiting, _requests
        self._reload_lock = threading.Lock()
        self.check_every = check_every
        self._checked = time.monotonic()
        self._reload_error: str | None = None
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
                new = Searcher(root, encoder=old.searcher._encoder, store=_remote_store(old))
                new.default_strategy = old.searcher.default_strategy
                _ = new.text_context
                images = ImageStore.from_collection(new.collection)
                self._current = self._served(new, images, gen, digest, _stamp(root))
                self._reload_error = None
                log.info("the index of %s changed (generation %d, %s): reopened", root, gen, digest)
            except (SparsemmError, OSError, ValueError, KeyError) as exc:
                self._reload_error = (
                    f"the index of {root.name} changed on disk and cannot be opened ({exc}); "
                    "wait for the re-index to finish or restart the server"
                )
                log.warning("%s", self._reload_error)
        finally:
            self._reload_lock.release()

    @contextlib.contextmanager
    def pinned(self) -> Iterator[_Served]:
        """Serve one request from one version: refresh, then pin the current version to
        this thread until the request is answered."""
        self.refresh()
        if self._reload_error is not None:
            raise IndexUnavailable(self._reload_error)
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
        held: list[threading.BoundedSemaphore] = []
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
            "image": self.image_url(item_id, prefix),
            "thumb": (
                f"{prefix}/thumbs/{quote(item_id, safe='')}" if item_id in self.images else None
            ),
        }

    @staticmethod
    def _concepts(concepts: Sequence[Concept]) -> list[ConceptOut]:
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
            evidence=[EvidenceOut(**asdict(e)) for e in hit.evidence],
            violations=violations(fields["labels"], exclude),
        )

    # -- operations --------------------------------------------------------------------
    def health(self) -> HealthOut:
        with self.pinned() as st:
            return self._health(st)

    def _health(self, st: _Served) -> HealthOut:
        return HealthOut(
            status="ok",
            version=__version__,
            collection=self.collection.root.name,
            index_generation=st.generation,
            index_digest=st.digest,
            items=len(self.collection.items),
            images=len(self.images),
            dims=self.n_dims,
            strategies=available_strategies(),
            default_strategy=self.searcher.default_strategy,
            max_k=MAX_K,
            max_query_chars=MAX_QUERY_CHARS,
            filter_threshold=float(HardFilter.params["threshold"]),
        )

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
        upload) with the query's exclusions (:meth:`Searcher.search_like`)."""
        like: Any = image if image is not None else req.like
        with self.pinned():
            if like is not None and image is None:
                self.row(str(req.like))  # 404 for an unknown item
            if like is not None:
                query = like_exclusions(req.q, req.include, req.exclude)
            else:
                query = build_query(req.q, req.include, req.exclude)
            return self._search(req, query, prefix, like, image)

    def _search(
        self, req: SearchRequest, query: Query, prefix: str, like: Any, image: Any
    ) -> SearchOut:
        strategy = req.strategy or self.searcher.default_strategy
        label = None
        with self.lane(heavy=len(query.include) + len(query.exclude) > self.heavy_terms):
            try:  # the searcher names unknown strategies and terms (Searcher.check_terms)
                if like is None:
                    hits = self.searcher.search(
                        query, k=req.k, strategy=strategy, offset=req.offset
                    )
                else:
                    label = "uploaded image" if image is not None else f"item {req.like}"
                    hits = self.searcher.search_like(
                        like, query.exclude, k=req.k, strategy=strategy, offset=req.offset
                    )
            finally:
                self._bound_caches()
        hits = [h for h in hits if math.isfinite(h.score)]
        # the hits' codes in one read (the excluded-term checks show each item's peak)
        codes = self.searcher.item_codes([h.row for h in hits])
        log.debug("search %r like %s [%s] -> %d hits", query.text, label, strategy, len(hits))
        full = len(hits) == req.k and req.offset + req.k <= MAX_OFFSET
        return SearchOut(
            query=_query_out(query),
            strategy=strategy,
            k=req.k,
            offset=req.offset,
            next_offset=req.offset + req.k if full else None,
            total=len(self.collection.items),
            like=label,
            unknown_words=self.searcher.unknown_words(query),
            hits=[
                self._hit(h, prefix, query.exclude, _code_values(codes, i))
                for i, h in enumerate(hits)
            ],
        )

    def row(self, item_id: str) -> int:
        if item_id not in self.row_of:
            raise HTTPException(404, "unknown item id")
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
            raise HTTPException(404, f"no dimension {dim}; dimensions are 0..{self.n_dims - 1}")
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


# ----------------------------------------------------------------------------- middleware


def _host_name(host: str) -> str:
    """The name part of a Host header: 'a.b:80' -> 'a.b', '[::1]:80' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class _Guard:
    """Host check, request-size limit and security headers (pure ASGI middleware)."""

    def __init__(
        self,
        app: ASGIApp,
        allowed_hosts: Sequence[str],
        max_body: int,
        path_limits: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.allowed = {_host_name(h) for h in allowed_hosts}
        self.max_body = max_body
        self.path_limits = dict(path_limits or {})  # larger bodies for named paths (uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self.any_host and _host_name(headers.get("host", "")) not in self.allowed:
            await self._error(scope, receive, send, 400, "request for an unknown host name")
            return
        length = headers.get("content-length")
        max_body = self.path_limits.get(scope.get("path", ""), self.max_body)
        if length is not None and (not length.isdigit() or int(length) > max_body):
            await self._error(scope, receive, send, 413, "request body too large")
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await self._error(scope, receive, send, 411, "send the body with a Content-Length")
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    out.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _error(
        self, scope: Scope, receive: Receive, send: Send, status: int, message: str
    ) -> None:
        response = JSONResponse({"error": message}, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        await response(scope, receive, send)


def _validation_message(exc: RequestValidationError) -> str:
    """One line from pydantic's errors: 'k: Input should be less than or equal to 100'."""
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            parts.append("the request body is not valid JSON")
            continue
        loc = [str(x) for x in err.get("loc", ())]
        # ("query", "k") -> "k"; ("body",) -> "request body"
        where = ".".join(loc[1:]) if len(loc) > 1 else "request body" if loc else "request"
        parts.append(f"{where}: {err.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request"


# ------------------------------------------------------------------------------------ app


def create_app(
    collection_dir: str | Path | None = None,
    *,
    searcher: Searcher | None = None,
    encoder: Any = None,
    allowed_hosts: Sequence[str] = LOCAL_HOSTS,
    cors_origins: Sequence[str] = (),
    warm: bool = False,
    workers: int = DEFAULT_WORKERS,
) -> FastAPI:
    """The FastAPI app serving the search page and JSON API over one indexed collection.

    Give ``collection_dir`` (opened with ``Searcher(collection_dir, encoder=encoder)``) or a
    ready ``searcher``. ``allowed_hosts``: Host-header names accepted (``"*"`` for any);
    ``cors_origins``: origins allowed to call the API from other sites (none by default).
    ``warm`` loads the text encoder and strategy context now instead of at the first query.
    ``workers``: searches answered at once (see :class:`SearchService`).
    Raises SparsemmError when the collection has no index or it does not match.
    """
    if searcher is None:
        if collection_dir is None:
            raise SparsemmError("create_app needs a collection folder or a Searcher")
        searcher = Searcher(collection_dir, encoder=encoder)
    if warm:
        _ = searcher.context
        _ = searcher.text_context
    service = SearchService(searcher, workers=workers)

    app = FastAPI(
        title="sparsemm",
        version=__version__,
        description="Sparse concept search with exclusion queries ('dog but not cat').",
        docs_url=None,  # the Swagger page loads scripts from a CDN: no
        redoc_url=None,
        openapi_url="/api/openapi.json",
        responses=ERROR_RESPONSES,
    )
    app.state.service = service

    def openapi() -> dict[str, Any]:
        # FastAPI documents a 422 for invalid parameters; this API answers them with 400.
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            for operations in schema.get("paths", {}).values():
                for op in operations.values():
                    op.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal server error; see the server log"}, 500)

    @app.exception_handler(SparsemmError)
    async def _user_error(request: Request, exc: SparsemmError) -> JSONResponse:
        if isinstance(exc, ServerBusy | IndexUnavailable):
            return JSONResponse({"error": str(exc)}, status_code=503, headers={"retry-after": "1"})
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _bad_params(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _validation_message(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    def prefix(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get("/api/health")
    def health() -> HealthOut:
        return service.health()

    @app.get("/api/search")
    def search_get(request: Request, params: Annotated[SearchRequest, QueryParam()]) -> SearchOut:
        return service.search(params, prefix(request))

    @app.post("/api/search")
    def search_post(request: Request, body: SearchRequest) -> SearchOut:
        return service.search(body, prefix(request))

    @app.get("/api/items/{item_id:path}/explain")
    def explain(
        request: Request,
        item_id: str,
        q: Annotated[str, QueryParam(max_length=MAX_QUERY_CHARS)] = "",
        include: Annotated[list[str] | None, QueryParam()] = None,
        exclude: Annotated[list[str] | None, QueryParam()] = None,
        like: Annotated[str | None, QueryParam(max_length=512)] = None,
    ) -> ExplainOut:
        service.row(item_id)  # 404 before parsing the query
        if like is not None:
            query = like_exclusions(q, include or [], exclude or [])
        elif not q.strip() and not any(v.strip() for v in [*(include or []), *(exclude or [])]):
            query = Query.empty()  # an uploaded image's hit: the item's own concepts only
        else:
            query = build_query(q, include or [], exclude or [])
        return service.explain(item_id, query, prefix(request), like=like)

    @app.get("/api/dims/{dim}")
    def dim(
        request: Request,
        dim: int,
        n: Annotated[int, QueryParam(ge=1, le=MAX_DIM_ITEMS)] = 12,
    ) -> DimOut:
        return service.dim(dim, n, prefix(request))

    @app.get("/images/{item_id:path}", include_in_schema=False)
    def image(item_id: str) -> FileResponse:
        path = service.images.get(item_id)
        if path is None:
            raise HTTPException(404, "no such image")
        return FileResponse(
            path,
            media_type=IMAGE_TYPES[path.suffix.lower()],
            headers={"cache-control": "private, max-age=3600"},
        )

    @app.post(UPLOAD_PATH)
    async def search_image(
        request: Request, params: Annotated[SearchRequest, QueryParam()]
    ) -> SearchOut:
        """More like the image in the request body (raw bytes, any image type), with the
        query parameters' exclusions; 400 for a non-image, 413 over 8 MiB."""
        from starlette.concurrency import run_in_threadpool

        if params.like is not None:
            raise SparsemmError("send either an image or like=ID, not both")
        data = await request.body()
        if len(data) > MAX_UPLOAD_BYTES:
            raise HTTPException(413, f"the image is larger than {MAX_UPLOAD_BYTES // 2**20} MiB")
        image = decode_upload(data)
        return await run_in_threadpool(service.search, params, prefix(request), image)

    @app.get("/thumbs/{item_id:path}", include_in_schema=False)
    def thumb(item_id: str) -> Response:
        path = service.images.get(item_id)
        data = service.thumbs.get(path) if path is not None else None
        if data is None:
            raise HTTPException(404, "no such image")
        return Response(
            data, media_type="image/jpeg", headers={"cache-control": "private, max-age=3600"}
        )

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["content-type"],
        )
    app.add_middleware(
        _Guard,
        allowed_hosts=list(allowed_hosts),
        max_body=MAX_BODY_BYTES,
        path_limits={UPLOAD_PATH: MAX_UPLOAD_BYTES},
    )
    return app
