"""Serving a collection: the search page and the JSON API under uvicorn, hardened.

:func:`serve` is what ``sparsemm serve`` and ``sparsemm up`` run: it checks the address,
builds the app (:func:`sparsemm.web.app.create_app`), announces the server so that
``sparsemm search`` on the collection is answered by it, and blocks until stopped.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
from collections.abc import Sequence
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


def check_port_free(host: str, port: int) -> None:
    """SparsemmError when ``host:port`` cannot be bound (e.g. an earlier ``up`` still
    serves there), before the text encoder is loaded rather than after."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise SparsemmError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); stop the server "
                "already there (an earlier sparsemm up/serve?) or pass --port"
            ) from exc


def check_address(host: str, port: int) -> None:
    """SparsemmError for a port outside 1..65535."""
    if not 1 <= port <= 65535:
        raise SparsemmError(f"--port must be in 1..65535, got {port}")


def serve(
    collection: str | Path,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    allow_hosts: Sequence[str] = (),
    cors_origins: Sequence[str] = (),
    search_threads: int | None = None,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Serve ``collection`` at ``host:port`` until stopped (Ctrl+C or SIGTERM)."""
    try:
        import uvicorn
    except ModuleNotFoundError:
        require_extra("uvicorn", "web")
    from sparsemm.web.app import create_app
    from sparsemm.web.service import DEFAULT_WORKERS

    check_address(host, port)
    check_port_free(host, port)  # one line, before the collection loads, not uvicorn's
    if max_connections < 1:
        raise SparsemmError(f"--max-connections must be at least 1, got {max_connections}")
    threads = DEFAULT_WORKERS if search_threads is None else search_threads
    if threads < 1:
        raise SparsemmError(f"--search-threads must be at least 1, got {threads}")
    if not is_loopback(host):
        log.warning(
            "binding %s: the search API and every image the collection references are "
            "reachable from the network, without authentication; use --host 127.0.0.1 to "
            "keep it local",
            host or "all addresses",
        )
    app = create_app(
        collection,
        allowed_hosts=allowed_hosts(host, list(allow_hosts)),
        cors_origins=list(cors_origins),
        warm=True,
        workers=threads,
        settle_heap=True,
    )
    shown = f"[{host}]" if ":" in host else host
    log.info("serving %s at http://%s:%d/ (Ctrl+C to stop)", collection, shown, port)
    from sparsemm.pipeline.running import announce

    # uvicorn re-raises the SIGTERM it stopped on once it is done; exit through Python
    # then, so the record below is removed (Ctrl+C already does).
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        # While it runs, `sparsemm search` on this collection is answered by this server.
        with announce(collection, host, port):
            uvicorn.run(
                app, host=host, port=port, log_level="info", **server_options(max_connections)
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
