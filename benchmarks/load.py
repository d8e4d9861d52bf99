"""Bounded HTTP load test of the search server on loopback: throughput, p50/p99, errors.

N concurrent keep-alive clients (asyncio, raw HTTP/1.1, so the load generator costs little
CPU next to the server) send ``GET /api/search`` exclusion queries ("A but not B", pairs of
the collection's labels or of the toy concepts) for a fixed time; every non-200 answer,
connection failure or timeout counts as an error. The server runs in a child process with
the settings of ``sparsemm serve`` (:func:`sparsemm.pipeline.serve.server_options`), one torch
thread.

    python benchmarks/load.py --toy --clients 100 --duration 30
    python benchmarks/load.py --collection runs/x/collection --clients 100 --duration 30

Abuse mode (``--abuse``): while the clients run, ``--idle`` connections (600) are held
open by a misbehaving client: most send nothing, every 10th trickles a header byte a
second (a slow-loris; the server drops it and it reconnects); ``--heavy-clients`` of the
clients send the costliest query the API accepts (16 include + 16 exclude distinct words);
the well-behaved clients' and the heavy clients' figures are reported apart.
``--fresh-words`` makes every request's words distinct and never seen before, so that nothing
is cached and every request pays for its text encoding, as a real user's new query does.
``--strategy NAME`` sends every search with another scorer than the collection's default
(``hybrid`` against the default ``match``, in one sitting).

    python benchmarks/load.py --collection C --clients 100 --duration 30 --abuse
    python benchmarks/load.py --collection C --clients 100 --duration 30 --fresh-words

Upload-abuse mode (``--uploaders N``): the clients run twice for ``--duration``, first
alone, then beside N uploaders that POST a one-bit PNG of a few KB that decodes to
``--upload-megapixels`` (23.9: just under the server's cap, so it is decoded; 39.7: over
it, refused from its header) to ``/api/search/image`` over and over; it reports the good
clients' throughput with uploaders as a share of it without, their p99, the uploads'
answers and the server's memory (peak and current resident set, from /proc).

    python benchmarks/load.py --toy --clients 20 --duration 30 --uploaders 8

``--toy`` builds a synthetic collection in a temp folder: ``--toy-items`` items, each with
1-4 of 200 concepts, a keyword encoder and a hand-made SR model (dimension j = concept j).
``--collection`` serves an indexed collection (``sparsemm index``) with its own text
encoder. With ``--out`` it writes config.json, metrics.json and the git commit there.
The short form of this test runs in the default test suite
(tests/reliability/test_server_load.py: 20 clients for 3 s, asserting zero errors).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import numpy as np

from sparsemm.web.service import DEFAULT_WORKERS

log = logging.getLogger("load")

TOY_CONCEPTS = 200


# ------------------------------------------------------------------------------ the client


@dataclass
class LoadReport:
    """What a load run measured; latencies in milliseconds."""

    clients: int
    duration_s: float  # wall time until the last client finished
    requests: int  # completed requests (any status)
    errors: int  # non-200 answers + connection errors + timeouts
    error_kinds: dict[str, int] = field(default_factory=dict)
    throughput_rps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")

    def summary(self) -> str:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(self.error_kinds.items()))
        return (
            f"{self.clients} clients, {self.duration_s:.1f} s: {self.requests} requests, "
            f"{self.errors} errors{f' ({kinds})' if kinds else ''}; "
            f"throughput {self.throughput_rps:.1f} req/s; latency p50 {self.p50_ms:.1f} ms, "
            f"p99 {self.p99_ms:.1f} ms, max {self.max_ms:.1f} ms"
        )


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, server closes) of one HTTP/1.1 response."""
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("connection closed by the server")
    status = int(line.split()[1])
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)  # data + CRLF
            if size == 0:
                break
            parts.append(chunk[:-2])
        body = b"".join(parts)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, body, headers.get("connection", "").lower() == "close"


async def _client(
    host: str,
    port: int,
    paths: Sequence[str],
    first: int,
    deadline: float,
    timeout: float,
    latencies: list[float],
    errors: Counter[str],
) -> None:
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    i = first
    while time.perf_counter() < deadline:
        path = paths[i % len(paths)]
        i += 1
        t0 = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), timeout
                )
            assert reader is not None
            request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: */*\r\n\r\n"
            writer.write(request.encode("ascii"))
            status, body, close = await asyncio.wait_for(_read_response(reader), timeout)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            errors[type(exc).__name__] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
            continue
        latencies.append(time.perf_counter() - t0)
        if status != 200 or not body.startswith(b"{"):
            errors[f"HTTP {status}"] += 1
        if close:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def run_load(
    host: str,
    port: int,
    paths: Sequence[str],
    clients: int = 100,
    duration: float = 30.0,
    timeout: float = 30.0,
) -> LoadReport:
    """Run ``clients`` keep-alive clients cycling through ``paths`` for ``duration`` seconds."""
    if not paths:
        raise ValueError("no request paths")
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    deadline = start + duration
    await asyncio.gather(
        *(
            _client(host, port, paths, c * 7, deadline, timeout, latencies, errors)
            for c in range(clients)
        )
    )
    elapsed = time.perf_counter() - start
    n_err = sum(errors.values())
    report = LoadReport(
        clients=clients,
        duration_s=elapsed,
        requests=len(latencies),
        errors=n_err,
        error_kinds=dict(errors),
        throughput_rps=len(latencies) / elapsed if elapsed > 0 else 0.0,
    )
    if latencies:
        ms = np.asarray(latencies) * 1000.0
        report.p50_ms, report.p99_ms = (float(v) for v in np.percentile(ms, [50, 99]))
        report.max_ms = float(ms.max())
    return report


def search_paths(terms: Sequence[str], n: int = 2000, k: int = 10, seed: int = 0) -> list[str]:
    """``n`` search URLs: "A but not B" for random pairs of ``terms``, every 4th plain "A"."""
    rng = np.random.default_rng(seed)
    terms = list(dict.fromkeys(terms))
    if len(terms) < 2:
        raise ValueError("need at least two terms for exclusion queries")
    out = []
    for j in range(n):
        a, b = rng.choice(len(terms), size=2, replace=False)
        q = terms[a] if j % 4 == 3 else f"{terms[a]} but not {terms[b]}"
        out.append("/api/search?" + urlencode({"q": q, "k": k}))
    return out


def heavy_paths(terms: Sequence[str], n: int = 200, per_side: int = 16, seed: int = 1) -> list[str]:
    """``n`` POST-free GET URLs of the costliest accepted query: ``per_side`` include and
    ``per_side`` exclude distinct terms (the API's maximum), drawn at random from ``terms``."""
    rng = np.random.default_rng(seed)
    terms = list(dict.fromkeys(terms))
    if len(terms) < 2 * per_side:
        raise ValueError(f"need {2 * per_side} distinct terms for the heavy query")
    out = []
    for _ in range(n):
        pick = [terms[i] for i in rng.choice(len(terms), size=2 * per_side, replace=False)]
        query = [("include", t) for t in pick[:per_side]] + [
            ("exclude", t) for t in pick[per_side:]
        ]
        out.append("/api/search?" + urlencode([*query, ("k", 10)]))
    return out


def fresh_paths(words: Sequence[str], k: int = 10, seed: int = 2) -> list[str]:
    """One search per pair of ``words`` ("A -B", every 4th plain "A"), each word used
    once, so no request finds its words in the server's caches (while the list lasts)."""
    rng = np.random.default_rng(seed)
    words = [words[i] for i in rng.permutation(len(words))]
    out = []
    for j in range(0, len(words) - 1, 2):
        a, b = words[j], words[j + 1]
        out.append("/api/search?" + urlencode({"q": a if j % 8 == 6 else f"{a} -{b}", "k": k}))
    return out


async def abusive_connections(
    host: str, port: int, n: int, deadline: float, trickle_every: int = 10
) -> Counter[str]:
    """Hold ``n`` connections open until ``deadline``: most silent, every
    ``trickle_every``-th sending one header byte a second; any the server closes is
    reopened. Returns counts of what happened (opened, dropped by the server)."""
    stats: Counter[str] = Counter()

    async def one(i: int) -> None:
        trickle = trickle_every > 0 and i % trickle_every == 0
        head = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
        while time.perf_counter() < deadline:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                stats["refused"] += 1
                await asyncio.sleep(0.5)
                continue
            stats["opened"] += 1
            sent = 0
            try:
                while time.perf_counter() < deadline:
                    if trickle and sent < len(head):
                        writer.write(head[sent : sent + 1])
                        sent += 1
                    try:
                        data = await asyncio.wait_for(reader.read(4096), 1.0)
                    except TimeoutError:
                        continue
                    if not data or data.startswith(b"HTTP/"):
                        stats["dropped by the server"] += 1
                        break
            except OSError:
                stats["dropped by the server"] += 1
            finally:
                writer.close()

    await asyncio.gather(*(one(i) for i in range(n)))
    return stats


def fresh_words(collection: str | Path, limit: int = 20_000) -> list[str]:
    """Words for ``fresh_paths`` and ``heavy_paths``: the collection's caption words plus,
    when the MiniLM wheel is installed, the whole words of its vocabulary (letters only, 4+
    characters); only words the query parser accepts as a search term are kept."""
    from sparsemm.data.collection import open_collection
    from sparsemm.errors import SparsemmError
    from sparsemm.query.parse import parse_query
    from sparsemm.text import tokenize

    col = open_collection(collection)
    words = {w for it in col.items for c in it.get("captions") or [] for w in tokenize(c)}
    with contextlib.suppress(SparsemmError, OSError, KeyError, ValueError):
        from sparsemm.encoders.minilm import default_model_path

        vocab = json.loads((default_model_path() / "tokenizer.json").read_text())["model"]["vocab"]
        words |= {w for w in vocab if len(w) >= 4 and w.isalpha() and w.isascii()}

    def term(w: str) -> bool:
        try:
            return parse_query(w).include == (w,)
        except SparsemmError:
            return False

    return [w for w in sorted(words) if len(w) >= 3 and w.isalpha() and term(w)][:limit]


def collection_terms(collection: str | Path, limit: int = 80) -> list[str]:
    """Query terms for a collection: its most common item labels, else caption words."""
    from sparsemm.data.collection import open_collection
    from sparsemm.text import tokenize

    col = open_collection(collection)
    counts: Counter[str] = Counter(lab for it in col.items for lab in it.get("labels") or [])
    if len(counts) < 2:
        counts = Counter(
            w for it in col.items for c in it.get("captions") or [] for w in set(tokenize(c))
        )
    if len(counts) < 2:  # photos without labels or captions (`sparsemm up`): concept names
        counts = index_terms(col.root)
    if len(counts) < 2:
        raise SystemExit(
            f"{collection} has fewer than two labels, caption words or indexed concepts to "
            "query; index it first (sparsemm index / sparsemm up)"
        )
    return [t for t, _ in counts.most_common(limit)]


def index_terms(collection_root: Path) -> Counter[str]:
    """The first label of each dimension of a collection's index, counted by the items
    holding it (so the most common concepts come first); empty without an index."""
    from sparsemm.errors import SparsemmError
    from sparsemm.index import InvertedIndex
    from sparsemm.query.parse import parse_query

    root = collection_root / "index"
    if not (root / "manifest.json").is_file():
        return Counter()
    index = InvertedIndex.open(root)
    labels = (index.meta.get("labels") or {}).get("data") or []
    codes = index.codes(np.arange(len(index)))
    held = np.bincount(codes.indices, minlength=index.dim)
    counts: Counter[str] = Counter()
    for j, names in enumerate(labels[: index.dim]):
        name = str(names[0]).strip().lower() if names else ""
        try:  # a name the parser reads as one term ("person (face)" is not)
            ok = bool(name) and parse_query(name).include == (name,)
        except SparsemmError:
            ok = False
        if ok and held[j]:
            counts[name] = max(counts[name], int(held[j]))
    return counts


# ------------------------------------------------------------------------------ the server


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A listening TCP socket on a free port of ``host``."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    return sock


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", **options: Any) -> Iterator[int]:
    """Serve ``app`` with uvicorn (``sparsemm serve``'s settings; ``options`` go to
    :func:`~sparsemm.pipeline.serve.server_options`) in a daemon thread on a free loopback port;
    yields the port and stops the server on exit."""
    import uvicorn

    from sparsemm.pipeline.serve import server_options

    sock = bound_socket(host)
    config = uvicorn.Config(app, log_level="warning", **server_options(**options))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        limit = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > limit:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


# -------------------------------------------------------------------------- toy collection


class ToyEncoder:
    """Text -> counts of the toy concepts ``c0``..``c199`` among its words, L2-normalised."""

    name = "loadtoy"
    modalities = ("text",)

    def __init__(self, model: str | None = None) -> None:
        self.dim = TOY_CONCEPTS
        self.model_id = "loadtoy-v1"

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in text.lower().split():
                if w.startswith("c") and w[1:].isdigit() and int(w[1:]) < self.dim:
                    out[i, int(w[1:])] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def build_toy(root: Path, n_items: int = 20_000, seed: int = 0) -> Path:
    """An indexed toy collection under ``root``; returns the collection folder."""
    import torch

    from sparsemm.data.collection import write_collection
    from sparsemm.models.sr import SRConfig, SRModel
    from sparsemm.query.indexing import build_index

    rng = np.random.default_rng(seed)
    enc = ToyEncoder()
    items, texts = [], []
    for i in range(n_items):
        concepts = [
            f"c{j}" for j in rng.choice(TOY_CONCEPTS, size=rng.integers(1, 5), replace=False)
        ]
        caps = [" and ".join(concepts), "a photo of " + " with ".join(concepts)]
        items.append({"id": f"item{i:06d}", "captions": caps, "labels": concepts})
        texts += [{"item": i, "text": c} for c in caps]
    col = root / "collection"
    write_collection(
        col,
        items,
        {"name": enc.name, "dim": enc.dim, "model": enc.model_id},
        image_emb=enc.encode_text([" ".join(it["labels"]) for it in items]),
        text_emb=enc.encode_text([t["text"] for t in texts]),
        texts=texts,
    )
    d = TOY_CONCEPTS
    model = SRModel(SRConfig(text_dim=d, image_dim=d, latent_dim=d, top_k=8))
    with torch.no_grad():
        model.enc_text.weight.copy_(torch.eye(d))
        model.enc_text.bias.zero_()
    model.save_pretrained(root / "sr")
    build_index(col, root / "sr")
    return col


# ------------------------------------------------------------------------------ entry point


def _serve_child(collection: str, toy: bool, workers: int, batch_texts: bool) -> None:
    """``--serve`` mode: serve ``collection`` on a free loopback port; print the port."""
    import torch

    torch.set_num_threads(1)
    import uvicorn

    from sparsemm.pipeline.serve import server_options
    from sparsemm.web.app import create_app

    app = create_app(
        collection,
        encoder=ToyEncoder() if toy else None,
        warm=True,
        workers=workers,
        batch_texts=batch_texts,
        settle_heap=True,
    )
    sock = bound_socket()
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", **server_options())).run(sockets=[sock])


async def _abuse_run(
    args: argparse.Namespace, port: int, paths: list[str], heavy: list[str], warmed: bool
) -> tuple[LoadReport, LoadReport, Counter[str]]:
    """The abusive connections, the well-behaved clients and the heavy clients at once."""
    host = "127.0.0.1"
    deadline = time.perf_counter() + args.duration + 1.0
    abuse = asyncio.ensure_future(abusive_connections(host, port, args.idle, deadline))
    await asyncio.sleep(1.0)  # the idle connections are in place before the clients start
    good, bad = await asyncio.gather(
        run_load(host, port, paths, args.clients - args.heavy_clients, args.duration, args.timeout),
        run_load(host, port, heavy, args.heavy_clients, args.duration, args.timeout),
    )
    return good, bad, await abuse


def bomb_png(megapixels: float = 23.9) -> bytes:
    """A one-bit PNG of a few KB that decodes to about ``megapixels`` (4:3): 23.9 is just
    under the server's 24-megapixel cap (decoded), 39.7 over it (refused from the header)."""
    import io

    from PIL import Image

    height = int((megapixels * 1e6 * 3 / 4) ** 0.5)
    out = io.BytesIO()
    Image.new("1", (int(megapixels * 1e6 / height), height)).save(out, format="PNG")
    return out.getvalue()


async def _uploader(
    host: str, port: int, body: bytes, deadline: float, timeout: float, answers: Counter[str]
) -> None:
    """POST ``body`` as a query image until ``deadline``, counting the answers."""
    head = (
        f"POST /api/search/image HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: image/png\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode("ascii")
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while time.perf_counter() < deadline:
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), timeout
                )
            assert reader is not None
            writer.write(head + body)
            status, _, close = await asyncio.wait_for(_read_response(reader), timeout)
            answers[f"HTTP {status}"] += 1
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            answers[type(exc).__name__] += 1
            close = True
        if close and writer is not None:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def _upload_run(
    args: argparse.Namespace, port: int, paths: list[str]
) -> tuple[LoadReport, Counter[str]]:
    """The clients beside ``args.uploaders`` bomb uploaders."""
    host, body, answers = "127.0.0.1", bomb_png(args.upload_megapixels), Counter[str]()
    deadline = time.perf_counter() + args.duration
    good, *_ = await asyncio.gather(
        run_load(host, port, paths, args.clients, args.duration, args.timeout),
        *(
            _uploader(host, port, body, deadline, args.timeout, answers)
            for _ in range(args.uploaders)
        ),
    )
    return good, answers


def process_memory(pid: int) -> dict[str, float]:
    """Peak and current resident set of a process, in MB (Linux /proc)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out["peak_mb" if key == "VmHWM" else "rss_mb"] = int(value.split()[0]) / 1024
    return out


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--collection", type=Path, help="an indexed collection folder")
    src.add_argument("--toy", action="store_true", help="a synthetic collection in a temp folder")
    p.add_argument("--toy-items", type=int, default=20_000)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before measuring")
    p.add_argument("--k", type=int, default=10, help="results per query")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (s)")
    p.add_argument(
        "--abuse", action="store_true", help="idle/slow-loris connections + heavy queries"
    )
    p.add_argument("--idle", type=int, default=600, help="abusive connections (--abuse)")
    p.add_argument(
        "--heavy-clients", type=int, default=10, help="clients sending 16+16-term queries"
    )
    p.add_argument("--fresh-words", action="store_true", help="never-seen words in every request")
    p.add_argument(
        "--strategy", default=None, help="search with this scorer (default: the collection's)"
    )
    p.add_argument(
        "--uploaders",
        type=int,
        default=0,
        help="clients posting decompression-bomb PNGs beside the clients (after a run alone)",
    )
    p.add_argument(
        "--upload-megapixels",
        type=float,
        default=23.9,
        help="size of the uploaders' PNG (23.9: just under the 24-MP cap; 39.7: over it)",
    )
    p.add_argument(
        "--search-threads", type=int, default=DEFAULT_WORKERS, help="the server's search lanes"
    )
    p.add_argument(
        "--no-batch-texts",
        action="store_true",
        help="encode each request's texts on its own (the server batches concurrent ones)",
    )
    p.add_argument("--out", type=Path, help="write config.json / metrics.json here")
    p.add_argument("--serve", help=argparse.SUPPRESS)  # child mode: serve this collection
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.serve:
        _serve_child(args.serve, args.toy, args.search_threads, not args.no_batch_texts)
        return 0

    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sparsemm-load-") as tmp:
        if args.toy:
            t0 = time.perf_counter()
            collection = build_toy(Path(tmp), args.toy_items)
            log.info(
                "built a %d-item toy collection in %.1f s", args.toy_items, time.perf_counter() - t0
            )
            terms = [f"c{j}" for j in range(TOY_CONCEPTS)]
        else:
            collection = args.collection
            terms = collection_terms(collection)
        paths = warm_paths = search_paths(terms, k=args.k)
        vocab = [f"c{j}" for j in range(TOY_CONCEPTS)] if args.toy else fresh_words(collection)
        if args.fresh_words:
            paths = fresh_paths(vocab, k=args.k)
        if args.strategy:  # another scorer than the collection's default, for a comparison
            tail = "&" + urlencode({"strategy": args.strategy})
            paths, warm_paths = [q + tail for q in paths], [q + tail for q in warm_paths]
        mode = ["--toy"] if args.toy else ["--collection", str(collection)]
        cmd = [sys.executable, __file__, "--serve", str(collection), *mode]
        cmd += ["--search-threads", str(args.search_threads)]
        cmd += ["--no-batch-texts"] if args.no_batch_texts else []
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert server.stdout is not None
            line = server.stdout.readline().strip()
            if not line.isdigit():
                raise SystemExit(f"the server did not start (exit {server.poll()})")
            port = int(line)
            log.info("server pid %d on 127.0.0.1:%d; %d query paths", server.pid, port, len(paths))
            if args.warmup > 0:  # on the label queries: the fresh words stay unseen
                warm = asyncio.run(
                    run_load("127.0.0.1", port, warm_paths, args.clients, args.warmup, args.timeout)
                )
                log.info("warm-up: %s", warm.summary())
            if args.abuse:
                report, heavy, abuse = asyncio.run(
                    _abuse_run(args, port, paths, heavy_paths(vocab), args.warmup > 0)
                )
                log.info("abusive connections: %s", dict(abuse))
                print(f"heavy clients: {heavy.summary()}")
            elif args.uploaders:
                alone = asyncio.run(
                    run_load("127.0.0.1", port, paths, args.clients, args.duration, args.timeout)
                )
                print(f"without uploaders: {alone.summary()}")
                before = process_memory(server.pid)
                report, answers = asyncio.run(_upload_run(args, port, paths))
                memory = process_memory(server.pid)
                share = report.throughput_rps / max(alone.throughput_rps, 1e-9)
                print(f"uploads answered: {dict(answers)}")
                print(
                    f"with {args.uploaders} uploaders: the clients keep {100 * share:.0f}% of "
                    f"their req/s, p99 {report.p99_ms:.0f} ms; server memory peak "
                    f"{memory.get('peak_mb', float('nan')):.0f} MB, now "
                    f"{memory.get('rss_mb', float('nan')):.0f} MB (before the uploads "
                    f"{before.get('rss_mb', float('nan')):.0f} MB)"
                )
                extra = {
                    "alone": asdict(alone),
                    "uploads": dict(answers),
                    "kept_share": share,
                    "memory_before": before,
                    "memory_after": memory,
                }
            else:
                report = asyncio.run(
                    run_load("127.0.0.1", port, paths, args.clients, args.duration, args.timeout)
                )
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
    print(report.summary())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        config["git_commit"] = _git_commit()
        (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        metrics = {**asdict(report), **extra}
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return 0 if report.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
