"""The short form of benchmarks/load.py: 20 concurrent keep-alive clients for 3 s against a
real uvicorn server (``sparsemm serve``'s settings) on a free loopback port, serving the
web toy collection. Asserts every request succeeded (timings are machine-dependent and
only reported; the full 100-client, 30-s run is benchmarks/load.py)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from load import run_load, search_paths, serve_in_thread
from webtoy import WORDS, WebKeywordEncoder

from sparsemm.query.searcher import Searcher
from sparsemm.web.app import create_app

log = logging.getLogger(__name__)

pytestmark = pytest.mark.slow  # a live server under concurrent clients (CONTRIBUTING.md)


def test_twenty_clients_for_three_seconds_without_errors(toy_collection: Path) -> None:
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()), warm=True)
    paths = search_paths(WORDS, n=200)
    with serve_in_thread(app) as port:
        report = asyncio.run(run_load("127.0.0.1", port, paths, clients=20, duration=3.0))
        # an error answer over the same path still counts: a 400 is not a success here
        bad = asyncio.run(run_load("127.0.0.1", port, ["/api/search?q="], clients=2, duration=0.2))
    log.info("load test: %s", report.summary())
    assert report.errors == 0, report.summary()
    assert report.requests >= 20, report.summary()
    assert bad.errors == bad.requests > 0 and bad.error_kinds == {"HTTP 400": bad.errors}


def test_serve_bounds_concurrency_and_keep_alive(
    toy_collection: Path, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    assert cli("serve", str(toy_collection), "--max-connections", "64").code == 0
    (kw,) = calls
    assert kw["host"] == "127.0.0.1"  # loopback unless told otherwise
    # idle connections must not count against the work limit (uvicorn's limit_concurrency)
    assert "limit_concurrency" not in kw and kw["timeout_keep_alive"] == 5
    assert kw["http"].max_connections == 64 and kw["http"].header_timeout == 10.0
    assert kw["h11_max_incomplete_event_size"] == 16 * 1024
    assert kw["server_header"] is False and kw["proxy_headers"] is False
    cli("serve", str(toy_collection), "--max-connections", "0").one_line_error(
        "--max-connections must be at least 1"
    )
    cli("serve", str(toy_collection), "--search-threads", "0").one_line_error(
        "--search-threads must be at least 1"
    )
