"""``sparsemm serve``: the search page and HTTP API for an indexed collection (uvicorn)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparsemm.pipeline.serve import (
    DEFAULT_HOST,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PORT,
    HEADER_TIMEOUT_SECONDS,
    serve,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the search page and JSON API for an indexed collection",
        description="Starts a web server with the search page (an include box, a 'but not' "
        "box, an image grid with concept chips and explanations) and the JSON API under "
        "/api/. It listens on 127.0.0.1 only unless --host says otherwise; there is no "
        "authentication, so binding another address exposes the collection's captions and "
        "images to that network.",
    )
    p.add_argument(
        "collection",
        type=Path,
        help="the photo folder `sparsemm up` ran on (or its -o folder), or an indexed "
        "collection folder",
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to this host name (repeatable); by default "
        "only the loopback names and the bound address, or any name on a wildcard bind",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="open connections beyond which new ones are closed at once "
        f"(default {DEFAULT_MAX_CONNECTIONS}); idle and slow clients are dropped after "
        f"{HEADER_TIMEOUT_SECONDS:g} s without a complete request head",
    )
    p.add_argument(
        "--search-threads",
        type=int,
        default=None,
        metavar="N",
        help="searches answered at once (default 4); more wait in a bounded queue and get "
        "503 after 10 s",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from ORIGIN (e.g. http://localhost:3000) call the API "
        "(repeatable; CORS is off by default)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    serve(
        args.collection,
        args.host,
        args.port,
        allow_hosts=args.allow_host,
        cors_origins=args.cors_origin,
        search_threads=args.search_threads,
        max_connections=args.max_connections,
    )
    return 0
