"""The served default through the index (certified candidates + exact rescoring,
``Match.rank_store``, ``Hybrid.rank_store``) against brute force over every item, in one run.

For each query kind ("A but not B" label pairs; negated sentences from the ``queries.jsonl``
of a ``sparsemm bench negation`` run) it prints:

* brute force: ``rank_query`` over a context holding every code (the reference);
* served, retrieval: ``Hybrid.rank_store`` alone (index candidates, rescoring, certificate);
* served, end to end: ``Searcher.search`` as the CLI and web API run it (parse, text
  encoding, retrieval, rescoring, explanations and evidence), the in-memory text caches
  cleared before every query: "never seen" with an empty text-embedding store (MiniLM runs
  on every text), "texts stored" with the texts in the store
  (:mod:`sparsemm.encoders.text_store`, what a text seen before by any search costs); the
  difference is what encoding a never-seen text adds;
* query texts: embedding and coding a query's terms alone, never seen / stored / in memory,
  and how much of it the text encoder takes (a MiniLM pass, or a read of the store);

with recall@10 against brute force, the share of results certified exact (a scan of every
item is exact by construction), the share ranked by such a scan, the mean pool size, p50/p90
latency in ms and the mean number of index searches per query; and the text encoder's
share of an end-to-end search, never seen and stored.
``--scale N`` serves a synthetic collection of N items instead: the collection's codes
resampled with log-normal value noise (sigma 0.3), renormalised and indexed in a temp
folder; item i shows the metadata of the item it was drawn from. Run it on one core for the
issue's latency targets::

    taskset -c 0 python benchmarks/two_stage.py runs/demo/collection \\
        --sentences runs/neg-final/queries.jsonl --scale 1000000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.encoders.text_store import StoredTextEncoder, TextEmbeddingStore
from sparsemm.index import InvertedIndex
from sparsemm.linalg import normalize_rows
from sparsemm.query.parse import parse_query
from sparsemm.query.searcher import Searcher
from sparsemm.query.strategies import ExclusionContext, get_strategy
from sparsemm.query.strategies.ranking import rank_query
from sparsemm.query.unit_lists import MIN_ITEMS, build_unit_lists


class _Resampled:
    """Collection stand-in for a synthetic index: row i shows source item ``src[i]``."""

    def __init__(self, collection: Any, src: np.ndarray) -> None:
        self._col, self._src = collection, src
        self.items = _Items(collection.items, src)
        self.ids = [str(i) for i in range(len(src))]
        self.root, self.manifest = collection.root, collection.manifest


class _Items:
    def __init__(self, items: list[dict[str, Any]], src: np.ndarray) -> None:
        self._items, self._src = items, src

    def __len__(self) -> int:
        return len(self._src)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self._items[int(self._src[i])], "id": str(i)}

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (self[i] for i in range(len(self)))


def _pcts(times: list[float]) -> tuple[float, float]:
    return statistics.median(times), statistics.quantiles(times, n=10)[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("collection")
    ap.add_argument("--sentences", help="queries.jsonl of a bench negation run")
    ap.add_argument("--queries", type=int, default=200, help="per kind (pairs, sentences)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=int, default=0, help="synthetic collection of this size")
    ap.add_argument("--candidates", type=int, default=256, help="first pool per list")
    ap.add_argument(
        "--strategy",
        default=None,
        help="the served scorer timed (default: the model's, match; hybrid: the older one)",
    )
    args = ap.parse_args()
    # a store of its own, so that "never seen" is never seen (not the user's store)
    store_dir = Path(tempfile.mkdtemp(prefix="two-stage-texts-"))
    os.environ["SPARSEMM_TEXT_STORE"] = str(store_dir / "shared")
    s = Searcher(args.collection)
    stored = s.encoder if isinstance(s.encoder, StoredTextEncoder) else None
    shared = stored.store if stored is not None else None
    strategy = args.strategy or s.default_strategy
    if not s.served(strategy):
        raise SystemExit(f"{strategy} is not served through the index for this collection")
    rng = np.random.default_rng(args.seed)
    labels = sorted({lab for it in s.collection.items for lab in it.get("labels") or []})
    codes = s.codes
    text = s.text_context  # encoders and detectors, before any synthetic swap
    if args.scale:
        t0 = time.perf_counter()
        src = rng.integers(0, codes.shape[0], args.scale)
        x = sp.csr_matrix(codes[src])
        x.data *= rng.lognormal(0.0, 0.3, x.nnz).astype(np.float32)
        codes = normalize_rows(x)
        tmp = Path(tempfile.mkdtemp(prefix="two-stage-"))
        index = InvertedIndex.build(tmp / "index", codes, [str(i) for i in range(args.scale)])
        s.index = s.store = index
        s.collection = _Resampled(s.collection, src)  # type: ignore[assignment]
        s._codes = None
        print(f"synthetic {args.scale} items built and indexed in {time.perf_counter() - t0:.0f} s")
        s.unit_lists = None
        if strategy == "match" and text.detectors is not None and args.scale >= MIN_ITEMS:
            # what `sparsemm index` computes for the served match (sparsemm.query.unit_lists)
            t0 = time.perf_counter()
            lists = build_unit_lists(s.match_strategy().scorer, text, codes, index)
            s.unit_lists = lists
            print(
                f"unit lists ({lists.length} items per detector) built in "
                f"{time.perf_counter() - t0:.0f} s, "
                f"{(lists.rows.nbytes + lists.ub.nbytes) / 1e6:.0f} MB"
            )
    index = s.index
    index.warm(quantized=True)
    full = ExclusionContext(
        items_codes=codes,
        text_encoder=text.text_encoder,
        query_coder=text.query_coder,
        detectors=text.detectors,
        concepts=text.concepts,
    )
    full._emb, full._code = text._emb, text._code
    n = len(index)
    print(
        f"{n} items, {codes.nnz / n:.1f} non-zeros per item, index {index.nbytes / n:.0f} B/item,"
        f" one-byte impacts in memory {index.impact_nbytes / 1e6:.0f} MB"
    )
    pairs = [f"{a} but not {b}" for a, b in itertools.permutations(labels, 2)]
    texts = {"label pairs": [pairs[i] for i in rng.permutation(len(pairs))[: args.queries]]}
    if args.sentences:
        with open(args.sentences) as fh:
            rows = [json.loads(line)["text"] for line in fh]
        texts["sentences"] = [rows[i] for i in rng.permutation(len(rows))[: args.queries]]
    head = f"{'queries':>12} {'mode':>22} {'recall@10':>10} {'certified':>10} {'pool':>7}"
    print(f"{strategy}: {head} {'p50 ms':>8} {'p90 ms':>8} {'searches':>9} {'scanned':>8}")
    for kind, qs in texts.items():
        parsed = [parse_query(t) for t in qs]
        for q in parsed:  # text codes cached: brute force and retrieval time scoring alone
            full.term_code(q.include_text)
        truth, bt = [], []
        for q in parsed:
            full.cache.clear()  # per-item arrays are not reused across queries
            t0 = time.perf_counter()
            truth.append(rank_query(full, q, strategy, k=10)[0].tolist())
            bt.append((time.perf_counter() - t0) * 1000)
        p50, p90 = _pcts(bt)
        print(
            f"{kind:>12} {'brute force':>22} {1.0:10.3f} {1.0:10.3f} {n:7d} {p50:8.2f} {p90:8.2f}"
        )
        rec, cert, pool, st, nsearch, scanned = [], [], [], [], [], []
        for q, want in zip(parsed, truth, strict=True):
            t0 = time.perf_counter()
            if strategy == "match":
                res = get_strategy("match", text).rank_store(
                    index, q, k=10, candidates=args.candidates, unit_lists=s.unit_lists
                )
            else:
                res = get_strategy(strategy, text).rank_store(
                    index, q, k=10, candidates=args.candidates
                )
            st.append((time.perf_counter() - t0) * 1000)
            rec.append(len(set(res.rows.tolist()) & set(want)) / max(len(want), 1))
            cert.append(res.certified)
            pool.append(res.candidates)
            nsearch.append(res.searches)
            scanned.append(res.mode == "scan")
        p50, p90 = _pcts(st)
        print(
            f"{kind:>12} {'served, retrieval':>22} {np.mean(rec):10.3f} {np.mean(cert):10.3f} "
            f"{np.mean(pool):7.0f} {p50:8.2f} {p90:8.2f} {np.mean(nsearch):9.2f} "
            f"{np.mean(scanned):8.3f}"
        )
        e2e: dict[str, float] = {}
        for mode in ("never seen", "texts stored"):
            if mode == "texts stored":  # fill the store, then time reading it
                for t in qs:
                    s.clear_text_caches()
                    s.search(t, k=10, strategy=strategy)
            et, rec = [], []
            for i, (t, want) in enumerate(zip(qs, truth, strict=True)):
                s.clear_text_caches()  # the text is in no in-memory cache
                if stored is not None:
                    stored.store = (
                        TextEmbeddingStore(store_dir / kind / str(i), stored.store.record)
                        if mode == "never seen"
                        else shared
                    )
                t0 = time.perf_counter()
                hits = s.search(t, k=10, strategy=strategy)
                et.append((time.perf_counter() - t0) * 1000)
                rec.append(len({h.row for h in hits} & set(want)) / max(len(want), 1))
            p50, p90 = _pcts(et)
            e2e[mode] = p50
            print(
                f"{kind:>12} {'end to end, ' + mode:>22} {np.mean(rec):10.3f} {'':>10} "
                f"{'':>7} {p50:8.2f} {p90:8.2f}"
            )
        # the query texts alone (embedding and query code of every term), each way
        cost: dict[str, list[float]] = {"never seen": [], "texts stored": [], "in memory": []}
        enc_cost: dict[str, list[float]] = {"never seen": [], "texts stored": []}
        for i, q in enumerate(parsed):
            terms = [*q.include, *q.exclude]
            for mode in cost:
                if mode != "in memory":
                    s.clear_text_caches()
                if stored is not None:
                    stored.store = (
                        TextEmbeddingStore(store_dir / kind / f"t{i}", stored.store.record)
                        if mode == "never seen"
                        else shared
                    )
                t0 = time.perf_counter()
                if mode != "in memory":  # the text encoder alone (MiniLM pass or store read)
                    s.encoder.encode_text([text.term_text(t) for t in terms])
                    enc_cost[mode].append((time.perf_counter() - t0) * 1000)
                text.prefetch(terms, codes=True)
                cost[mode].append((time.perf_counter() - t0) * 1000)
        if stored is not None:
            stored.store = shared
        print(
            f"{kind:>12} query texts (embedded and coded), p50 ms: "
            + ", ".join(f"{m} {statistics.median(v):.2f}" for m, v in cost.items())
        )
        print(
            f"{kind:>12} of which the text encoder, p50 ms: "
            + ", ".join(
                f"{m} {statistics.median(v):.2f} "
                f"({100 * statistics.median(v) / e2e[m]:.1f}% of an end-to-end search)"
                for m, v in enc_cost.items()
            )
        )


if __name__ == "__main__":
    main()
