"""The server under the abuse a server on a network meets: idle and slow-loris
connections, malformed requests, slow queries beside fast ones, thread-safe caches, and a
re-index under a running server. Real uvicorn servers on free loopback ports; no timed
assertions (events order the concurrent steps; the full figures come from
``benchmarks/load.py --abuse``)."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from load import run_load, search_paths, serve_in_thread
from webtoy import WORDS, WebKeywordEncoder, make_collection, make_sr

from sparsemm.query.indexing import build_index
from sparsemm.query.searcher import Searcher
from sparsemm.query.strategies import LRUCache
from sparsemm.web.app import create_app
from sparsemm.web.schemas import SearchRequest
from sparsemm.web.service import ServerBusy, _nbytes

pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx")
from fastapi.testclient import TestClient

pytestmark = pytest.mark.slow  # live servers under idle, slow and many clients (CONTRIBUTING.md)


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(10)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_idle_connections_do_not_crowd_out_real_clients(toy_collection: Path) -> None:
    """600 connected sockets that send nothing: every search of 10 clients still succeeds
    (uvicorn's limit_concurrency counted them and answered 503)."""
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()), warm=True)
    with serve_in_thread(app) as port:
        idle = [_connect(port) for _ in range(600)]
        try:
            report = asyncio.run(
                run_load("127.0.0.1", port, search_paths(WORDS, n=50), clients=10, duration=1.5)
            )
        finally:
            for s in idle:
                s.close()
    assert report.errors == 0 and report.requests > 0, report.summary()


def test_slow_loris_is_dropped_and_bad_requests_get_json(toy_collection: Path) -> None:
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()))
    with serve_in_thread(app, header_timeout=0.3) as port:
        # trickle a header byte every 0.05 s: the head deadline still closes it
        s = _connect(port)
        closed = False
        for b in b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200:
            try:
                s.sendall(bytes([b]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
            s.setblocking(False)
            try:
                data = s.recv(65536)
            except BlockingIOError:
                data = None
            s.setblocking(True)
            if data is not None:  # answered (408) or closed
                closed = data == b"" or data.startswith(b"HTTP/1.1 408")
                break
        s.close()
        assert closed, "a trickling client was never dropped"
        # a body trickled after a complete head is cut by the same deadline
        s = _connect(port)
        s.sendall(
            b"POST /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        got = None
        for _ in range(100):  # up to 10 s of trickling; the deadline is 0.3 s
            try:
                s.sendall(b" ")
                s.setblocking(False)
                got = s.recv(65536)
                break
            except BlockingIOError:
                time.sleep(0.1)
            except OSError:
                got = b""
                break
            finally:
                s.setblocking(True)
        s.close()
        assert got is not None, "a trickled body was never cut"
        # a malformed request line: the API's JSON error shape, not uvicorn's text
        s = _connect(port)
        s.sendall(b"GARBAGE\x01 / HTTP/1.1\r\n\r\n")
        raw = _read_all(s)
        s.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
        assert "malformed HTTP request" in json.loads(body)["error"]
        # a head still incomplete past 16 KiB (h11's incomplete-event limit) is refused
        # the same way
        s = _connect(port)
        try:
            s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000)
        except OSError:
            pass  # the server answered and closed while the rest was being sent
        raw = _read_all(s)
        s.close()
        assert raw.startswith(b"HTTP/1.1 400") and b'{"error"' in raw


def test_connections_beyond_the_cap_are_closed(toy_collection: Path) -> None:
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()))
    with serve_in_thread(app, max_connections=5) as port:
        held = [_connect(port) for _ in range(5)]
        extra = _connect(port)
        extra.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            assert _read_all(extra) == b""  # closed without an answer
        except ConnectionResetError:
            pass
        for s in held:
            s.close()
        extra.close()


def test_a_slow_search_does_not_stall_the_others(toy_collection: Path) -> None:
    """One search is held inside the searcher until a second one has been answered: with
    the old service-wide lock the second would wait forever (the event times out)."""
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()))
    service = app.state.service
    searcher = service.searcher
    real = searcher.answer
    inside, release = threading.Event(), threading.Event()

    def answer(request: Any) -> Any:
        if "tree" in request.query.include:
            inside.set()
            assert release.wait(10), "the other search never finished beside this one"
        return real(request)

    searcher.answer = answer
    slow = threading.Thread(target=service.search, args=(SearchRequest(q="tree"),))
    slow.start()
    assert inside.wait(10)
    fast = service.search(SearchRequest(q="dog but not cat"))
    release.set()
    slow.join(10)
    assert fast.hits and not slow.is_alive()


def test_costly_queries_get_a_share_of_the_lanes_and_a_full_queue_is_503(
    toy_collection: Path,
) -> None:
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()), workers=2)
    service = app.state.service
    service.queue_timeout = 0.2
    searcher = service.searcher
    real = searcher.answer
    inside, release = threading.Event(), threading.Event()

    def answer(request: Any) -> Any:
        if len(request.query.include) > 1:
            inside.set()
            release.wait(10)
        return real(request)

    searcher.answer = answer
    service.heavy_terms = 2  # more than 2 terms is costly here
    heavy = SearchRequest(q="dog", include=["ball"], exclude=["cat"])
    first = threading.Thread(target=service.search, args=(heavy,))
    first.start()
    assert inside.wait(10)
    try:
        # the only heavy lane is taken: a second costly query waits, then gets 503 ...
        with pytest.raises(ServerBusy, match="busy"):
            service.search(heavy)
        # ... while a cheap one still has its lane
        assert service.search(SearchRequest(q="dog")).hits
        with TestClient(app, base_url="http://127.0.0.1") as client:
            r = client.post("/api/search", json=heavy.model_dump())
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert "busy" in r.json()["error"]
    finally:
        release.set()
        first.join(10)


def test_lru_cache_is_safe_under_threads() -> None:
    cache = LRUCache(64)
    failures: list[BaseException] = []

    def hammer(seed: int) -> None:
        try:
            for i in range(20_000):
                key = (seed * 7 + i) % 200
                cache[key] = i
                cache.get((key + 3) % 200)
                cache.setdefault((key + 5) % 200, i)
                if key in cache:
                    cache.get(key)
        except BaseException as exc:
            failures.append(exc)

    def measure() -> None:  # what the server's cache bound does beside the searches
        try:
            for _ in range(2_000):
                _nbytes({"cache": cache})
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(6)]
    threads.append(threading.Thread(target=measure))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and len(cache) <= 64


def test_running_server_picks_up_a_reindex(tmp_path: Path) -> None:
    col = make_collection(tmp_path)
    sr = make_sr(tmp_path)
    build_index(col, sr)
    app = create_app(searcher=Searcher(col, encoder=WebKeywordEncoder()))
    service = app.state.service
    service.check_every = 0.0  # check the manifests on every request
    with TestClient(app, base_url="http://127.0.0.1") as client:
        before = client.get("/api/health").json()
        old_searcher = service.searcher
        assert client.get("/api/search", params={"q": "dog"}).status_code == 200
        build_index(col, sr, top_k=2)  # a re-index: new segment, old files removed
        after = client.get("/api/health").json()
        assert after["index_generation"] > before["index_generation"]
        assert after["index_digest"] != before["index_digest"]
        assert service.searcher is not old_searcher
        r = client.get("/api/search", params={"q": "dog but not cat"})
        assert r.status_code == 200 and r.json()["hits"]
        # an index that cannot be opened: a clear 503 until it can
        manifest = col / "index" / "manifest.json"
        good = manifest.read_bytes()
        manifest.write_text("{not json")
        r = client.get("/api/search", params={"q": "dog"})
        assert r.status_code == 503
        assert "changed on disk and cannot be opened" in r.json()["error"]
        manifest.write_bytes(good)
        assert client.get("/api/search", params={"q": "dog"}).status_code == 200


@pytest.fixture()
def unfreeze() -> Iterator[None]:
    yield
    gc.unfreeze()  # settle_heap is process-wide: give the other tests a normal collector


def test_a_settled_server_frees_the_version_a_reindex_replaced(
    tmp_path: Path, unfreeze: None
) -> None:
    """`sparsemm serve` freezes what it loaded out of the garbage collector's full passes;
    a re-index swaps in a new searcher, and the replaced one must not stay frozen forever."""
    col = make_collection(tmp_path)
    sr = make_sr(tmp_path)
    build_index(col, sr)
    app = create_app(searcher=Searcher(col, encoder=WebKeywordEncoder()), settle_heap=True)
    service = app.state.service
    assert gc.get_freeze_count() > 0
    service.check_every = service.resettle_after = 0.0
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/api/search", params={"q": "dog but not cat"}).status_code == 200
        searcher = service.searcher
        searcher.own_cycle = searcher  # only the cyclic collector can free it
        old = weakref.ref(searcher)
        build_index(col, sr, top_k=2)
        assert client.get("/api/search", params={"q": "dog but not cat"}).status_code == 200
        assert service.searcher is not searcher
        # a request still on the old version (here: this reference) defers the re-settle
        assert client.get("/api/search", params={"q": "dog"}).status_code == 200
        assert gc.get_freeze_count() == 0 and old() is not None
        del searcher
        assert client.get("/api/search", params={"q": "dog"}).status_code == 200
        assert old() is None  # collected by the re-settle, with no gc.collect() here
        assert gc.get_freeze_count() > 0
