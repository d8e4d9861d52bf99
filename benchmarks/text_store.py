"""What a never-seen query text costs the text store, by how many texts it already holds.

A running server meets new words all day: each one is embedded once and added to the user's
store of query-text embeddings (:class:`sparsemm.encoders.text_store.TextEmbeddingStore`), in
the request's thread. This times ``put`` of one new text into a store that already holds
``N`` texts, for several N up to a full store, and ``get`` of a stored one, in a temp folder:

    python benchmarks/text_store.py [--sizes 100 2000 19000] [--puts 200]

Printed per size: the median and 90th percentile of a put (ms), its ratio to the put into
the smallest store (a put that rewrote the whole index grew with N), the index rewrites seen
and a get (ms). The chunk file every put writes is fsynced, so the figures include the disk.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from sparsemm.encoders.text_store import INDEX, MAX_ENTRIES, TextEmbeddingStore

RECORD = {"name": "minilm", "model": "all-MiniLM-L6-v2", "dim": 384}


def fill(root: Path, n: int, batch: int = 500) -> TextEmbeddingStore:
    """A store holding ``n`` texts, added ``batch`` at a time."""
    store = TextEmbeddingStore(root, RECORD)
    rng = np.random.default_rng(0)
    for lo in range(0, n, batch):
        texts = [f"a query text number {i}" for i in range(lo, min(n, lo + batch))]
        store.put(texts, rng.normal(size=(len(texts), 384)).astype(np.float32))
    return TextEmbeddingStore(root, RECORD)  # as a new process reads it


def time_puts(store: TextEmbeddingStore, puts: int) -> tuple[np.ndarray, int]:
    """(ms per put of one new text, how many puts rewrote the index)."""
    rng = np.random.default_rng(1)
    out, rewrites = [], 0
    index = store.root / INDEX
    for i in range(puts):
        before = index.stat().st_mtime_ns if index.exists() else 0
        emb = rng.normal(size=(1, 384)).astype(np.float32)
        t = time.perf_counter()
        store.put([f"a never seen word {i}"], emb)
        out.append((time.perf_counter() - t) * 1e3)
        rewrites += int(index.exists() and index.stat().st_mtime_ns != before)
    return np.asarray(out), rewrites


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 2_000, MAX_ENTRIES - 1_000])
    ap.add_argument("--puts", type=int, default=200)
    a = ap.parse_args()
    base = None
    print("texts held | put p50 ms | put p90 ms | p50 / smallest | index rewrites | get ms")
    for n in a.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            store = fill(Path(tmp), n)
            store.get(["a query text number 0"])  # load the index and journal once
            ms, rewrites = time_puts(store, a.puts)
            t = time.perf_counter()
            store.get([f"a query text number {n // 2}"])
            get_ms = (time.perf_counter() - t) * 1e3
        p50 = float(np.median(ms))
        base = base or p50
        print(
            f"{n:>10} | {p50:10.2f} | {np.percentile(ms, 90):10.2f} | {p50 / base:14.2f} | "
            f"{rewrites:>3} of {a.puts:<5} | {get_ms:6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
