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

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from sparsemm import __version__
from sparsemm.errors import SparsemmError
from sparsemm.index.inverted import InvertedIndex
from sparsemm.query.parse import MAX_QUERY_CHARS, Query
from sparsemm.query.request import build_query, like_exclusions
from sparsemm.query.searcher import Searcher

try:
    from fastapi import FastAPI, HTTPException
    from fastapi import Query as QueryParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise SparsemmError(
        f"the web server needs the '{exc.name}' package: pip install 'sparsemm[web]'"
    ) from exc


from sparsemm.web.images import (
    IMAGE_TYPES,
    MAX_UPLOAD_BYTES,
    DecodeBusy,
    decode_upload,
    upload_bytes,
)
from sparsemm.web.middleware import (
    LOCAL_HOSTS,
    MAX_BODY_BYTES,
    Guard,
    validation_message,
)
from sparsemm.web.schemas import (
    ERROR_RESPONSES,
    DimOut,
    ExplainOut,
    HealthOut,
    SearchOut,
    SearchRequest,
)
from sparsemm.web.service import (
    DEFAULT_WORKERS,
    MAX_DIM_ITEMS,
    IndexUnavailable,
    NotFound,
    SearchService,
    ServerBusy,
)

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
UPLOAD_PATH = "/api/search/image"


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
    batch_texts: bool = True,
    settle_heap: bool = False,
) -> FastAPI:
    """The FastAPI app serving the search page and JSON API over one indexed collection.

    Give ``collection_dir`` (opened with ``Searcher(collection_dir, encoder=encoder)``) or a
    ready ``searcher``. ``allowed_hosts``: Host-header names accepted (``"*"`` for any);
    ``cors_origins``: origins allowed to call the API from other sites (none by default).
    ``warm`` loads the text encoder and strategy context now instead of at the first query.
    ``workers``: searches answered at once (see :class:`SearchService`). ``batch_texts``:
    the query texts of concurrent searches share encoder passes
    (:meth:`Searcher.batch_text_encoding`). ``settle_heap``: freeze what is loaded out of
    the garbage collector's full passes (:meth:`SearchService.settle_heap`; process-wide,
    for a server process: ``sparsemm serve`` sets it).
    Raises SparsemmError when the collection has no index or it does not match.
    """
    if searcher is None:
        if collection_dir is None:
            raise SparsemmError("create_app needs a collection folder or a Searcher")
        searcher = Searcher(collection_dir, encoder=encoder, in_memory=True)
    _prepare(searcher, warm, batch_texts)
    service = SearchService(searcher, workers=workers)
    if settle_heap:
        service.settle_heap()

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
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    _add_error_handlers(app)
    _add_api_routes(app, service)
    _add_file_routes(app, service)
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["content-type"],
        )
    app.add_middleware(
        Guard,
        allowed_hosts=list(allowed_hosts),
        max_body=MAX_BODY_BYTES,
        path_limits={UPLOAD_PATH: MAX_UPLOAD_BYTES},
    )
    return app


def _prepare(searcher: Searcher, warm: bool, batch_texts: bool) -> None:
    """Hold ``searcher``'s index in memory; ``batch_texts``, ``warm``: see :func:`create_app`."""
    # Segments read into memory, not mapped: a segment file cut short in place while
    # clients search would end a mapped read (and the server) with SIGBUS.
    searcher.index.hold_in_memory()
    if batch_texts:
        searcher.batch_text_encoding()
    if warm:
        _ = searcher.context
        _ = searcher.text_context
        if isinstance(searcher.store, InvertedIndex):
            # what the served path builds in memory on its first query (dense rows, one-byte
            # impacts: 0.2-0.4 s at a million items), built now instead
            searcher.store.warm(quantized=True, pages=False)
        _warm_search(searcher)


# A query whose search loads what any later one needs (the default scorer's term readings,
# its unit lists), so that the first user's request does not wait for them.
WARM_QUERY = "a person but not a dog"


def _warm_search(searcher: Searcher) -> None:
    """One search through the default served path, its answer dropped. A model that cannot
    read the warm query's words warms less and says nothing: the server still starts."""
    try:
        searcher.search(WARM_QUERY, k=1)
    except SparsemmError as exc:
        log.debug("warm search skipped: %s", exc)
    # the warm query's texts may come from the store of texts seen before: the text model
    # itself is built now too, for the first never-seen word
    load = getattr(searcher.encoder, "load_text_model", None)
    try:
        if load is not None:
            load()
    except SparsemmError as exc:  # texts seen before are still answered from the store
        log.warning("the text model could not be loaded: %s", exc)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI schema, made once. FastAPI documents a 422 for invalid parameters; this
    API answers them with 400."""
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


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as JSON ``{"error": message}`` with its status (module docstring)."""

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal server error; see the server log"}, 500)

    @app.exception_handler(SparsemmError)
    async def _user_error(request: Request, exc: SparsemmError) -> JSONResponse:
        if isinstance(exc, ServerBusy | IndexUnavailable | DecodeBusy):
            return JSONResponse({"error": str(exc)}, status_code=503, headers={"retry-after": "1"})
        return JSONResponse(
            {"error": str(exc)}, status_code=404 if isinstance(exc, NotFound) else 400
        )

    @app.exception_handler(RequestValidationError)
    async def _bad_params(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": validation_message(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )


def _prefix(request: Request) -> str:
    """The path the app is mounted under (``root_path``), for the URLs in answers."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _add_api_routes(app: FastAPI, service: SearchService) -> None:
    """The JSON API: health, search (text or an uploaded image), explain, dimensions."""

    @app.get("/api/health")
    def health() -> HealthOut:
        return service.health()

    @app.get("/api/search")
    def search_get(request: Request, params: Annotated[SearchRequest, QueryParam()]) -> SearchOut:
        return service.search(params, _prefix(request))

    @app.post("/api/search")
    def search_post(request: Request, body: SearchRequest) -> SearchOut:
        return service.search(body, _prefix(request))

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
        return service.explain(item_id, query, _prefix(request), like=like)

    @app.get("/api/dims/{dim}")
    def dim(
        request: Request,
        dim: int,
        n: Annotated[int, QueryParam(ge=1, le=MAX_DIM_ITEMS)] = 12,
    ) -> DimOut:
        return service.dim(dim, n, _prefix(request))

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
        # a form is parsed off the event loop too (bounded: MAX_FORM_PARTS parts)
        data = await run_in_threadpool(upload_bytes, data, request.headers.get("content-type", ""))
        # decoded off the event loop, at most DECODE_SLOTS at once (the rest get 503)
        image = await run_in_threadpool(decode_upload, data)
        return await run_in_threadpool(service.search, params, _prefix(request), image)


def _add_file_routes(app: FastAPI, service: SearchService) -> None:
    """The search page, its static files and the collection's images and thumbnails."""

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
