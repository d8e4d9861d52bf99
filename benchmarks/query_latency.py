"""Warm per-query latency of the served scorer: model detectors vs detectors fitted per query.

Runs ``Searcher.search`` (parse, text encoding, the hybrid scorer, the explanations) on an
indexed collection whose SR model has concept detectors, twice in one process: with the
model's detectors (query time fits nothing; served through the index) and with them removed
(the scorer fits a detector per new term on the collection's captions, over every item).
Every query uses words not seen before in that run, so no fit is cached. Prints p50/p90 in
ms per mode and their ratio.

    python benchmarks/query_latency.py runs/demo/collection --queries 40
"""

from __future__ import annotations

import argparse
import statistics
import time

from sparsemm.query.searcher import Searcher

WORDS = (
    "dog cat horse sheep cow elephant bear zebra giraffe bird car bus truck train boat "
    "bicycle motorcycle airplane bench chair couch bed table toilet sink oven laptop phone "
    "book clock vase pizza cake banana apple orange sandwich broccoli carrot umbrella kite "
    "skateboard surfboard skis frisbee bottle cup bowl knife spoon fork tv keyboard mouse "
    "refrigerator microwave toaster backpack handbag suitcase tie teddy scissors"
).split()


def queries(n: int) -> list[str]:
    """n queries "A but not B" with every word used once per mode (no cached fits)."""
    out = []
    for i in range(n):
        a, b = WORDS[(2 * i) % len(WORDS)], WORDS[(2 * i + 1) % len(WORDS)]
        out.append(f"a photo of a {a}, but there is no {b} in sight")
    return out


def run(searcher: Searcher, texts: list[str]) -> list[float]:
    times = []
    for text in texts:
        t0 = time.perf_counter()
        searcher.search(text, k=10)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("collection")
    ap.add_argument("--queries", type=int, default=40)
    args = ap.parse_args()
    n = min(args.queries, len(WORDS) // 2)
    texts = queries(n)
    searcher = Searcher(args.collection)
    if searcher.model.detectors is None:
        raise SystemExit("the collection's model has no detectors: `sparsemm train detectors`")
    searcher.search("warm up", k=10)  # loads the encoder and builds the context
    rows = {}
    rows["model detectors"] = run(searcher, texts)
    # Without model detectors the scorer fits one per new term on the collection's
    # captions, over every item (the served path then no longer applies).
    searcher.model.detectors = None
    searcher.context.detectors = None
    searcher.context.cache.clear()
    rows["fitted per query"] = run(searcher, texts)
    n_items = len(searcher.collection.items)
    print(f"{n_items} items, {n} queries with never-seen words, warm, k=10")
    print(f"{'mode':>18} {'p50 ms':>9} {'p90 ms':>9}")
    for name, t in rows.items():
        p90 = statistics.quantiles(t, n=10)[-1]
        print(f"{name:>18} {statistics.median(t):9.1f} {p90:9.1f}")
    ratio = statistics.median(rows["fitted per query"]) / statistics.median(rows["model detectors"])
    print(f"fitting per query is {ratio:.1f}x slower at p50")


if __name__ == "__main__":
    main()
