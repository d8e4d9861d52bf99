"""``sparsemm serve``: the search page and HTTP API for an indexed collection (uvicorn)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError, require_extra

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# Open connections beyond which new ones are closed on accept. Not uvicorn's
# limit_concurrency: that counts idle connections too, so a few hundred idle sockets made
# every real request a 503. Work is bounded by the search lanes (sparsemm.web.service).
DEFAULT_MAX_CONNECTIONS = 4096
KEEP_ALIVE_SECONDS = 5  # idle keep-alive connections are closed after this
HEADER_TIMEOUT_SECONDS = 10.0  # a request head must arrive complete within this
_WILDCARDS = ("0.0.0.0", "::", "")


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
    p.add_argument("collection", type=Path, help="an indexed collection folder")
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


def is_loopback(host: str) -> bool:
    """True for 'localhost' and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, extra: list[str]) -> list[str]:
    """Host-header names the server accepts: loopback names plus the bound address.

    A wildcard bind (0.0.0.0, ::) can be reached under any name, so it accepts any
    unless names are given with --allow-host.
    """
    from sparsemm.web.middleware import LOCAL_HOSTS

    if host in _WILDCARDS:
        return [*LOCAL_HOSTS, *extra] if extra else ["*"]
    return list(dict.fromkeys([*LOCAL_HOSTS, host.strip("[]").lower(), *extra]))


def server_options(
    max_connections: int = DEFAULT_MAX_CONNECTIONS, header_timeout: float = HEADER_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """The uvicorn settings ``sparsemm serve`` hardens the server with (also used by the
    load test): no Server header, no X-Forwarded-* trust, the guarded HTTP/1.1 protocol
    (:mod:`sparsemm.web.protocol`: a request-head deadline, a connection cap, JSON 400s),
    request heads of at most 16 KiB and an idle keep-alive time."""
    from sparsemm.web.protocol import MAX_HEADER_BYTES, protocol_class

    return {
        "server_header": False,
        "proxy_headers": False,
        "http": protocol_class(header_timeout=header_timeout, max_connections=max_connections),
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
    }


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ModuleNotFoundError:
        require_extra("uvicorn", "web")
    from sparsemm.web.app import create_app
    from sparsemm.web.service import DEFAULT_WORKERS

    if not 1 <= args.port <= 65535:
        raise SparsemmError(f"--port must be in 1..65535, got {args.port}")
    if args.max_connections < 1:
        raise SparsemmError(f"--max-connections must be at least 1, got {args.max_connections}")
    threads = DEFAULT_WORKERS if args.search_threads is None else args.search_threads
    if threads < 1:
        raise SparsemmError(f"--search-threads must be at least 1, got {threads}")
    if not is_loopback(args.host):
        log.warning(
            "binding %s: the search API and every image the collection references are "
            "reachable from the network, without authentication; use --host 127.0.0.1 to "
            "keep it local",
            args.host or "all addresses",
        )
    app = create_app(
        args.collection,
        allowed_hosts=allowed_hosts(args.host, list(args.allow_host)),
        cors_origins=list(args.cors_origin),
        warm=True,
        workers=threads,
        settle_heap=True,
    )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    log.info("serving %s at http://%s:%d/ (Ctrl+C to stop)", args.collection, shown, args.port)
    import signal

    from sparsemm.cli.running import announce

    # uvicorn re-raises the SIGTERM it stopped on once it is done; exit through Python
    # then, so the record below is removed (Ctrl+C already does).
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        # While it runs, `sparsemm search` on this collection is answered by this server.
        with announce(args.collection, args.host, args.port):
            uvicorn.run(
                app,
                host=args.host,
                port=args.port,
                log_level="info",
                **server_options(args.max_connections),
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
