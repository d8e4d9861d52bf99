"""Recall@10 and latency of the served scorer through the index (candidates + exact
rescoring, ``sparsemm.query.two_stage``) against brute force over every item, in one run.

Queries: "A but not B" label pairs and negated sentences (the ``queries.jsonl`` of a
``sparsemm bench negation`` run), parsed as the CLI does. Brute force is ``rank_query``, the
served default today.

    python benchmarks/two_stage.py runs/demo/collection --sentences runs/neg-final/queries.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import numpy as np

from sparsemm.query.parse import parse_query
from sparsemm.query.rank import rank_query
from sparsemm.query.searcher import Searcher
from sparsemm.query.two_stage import two_stage_rank


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("collection")
    ap.add_argument("--sentences", help="queries.jsonl of a bench negation run")
    ap.add_argument("--queries", type=int, default=200, help="per kind (pairs, sentences)")
    ap.add_argument("--candidates", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--exclusions", action="store_true", help="candidates also by the exclusions' proxy"
    )
    ap.add_argument(
        "--scale",
        type=int,
        default=0,
        help="score a synthetic collection of this many items instead: the collection's "
        "codes resampled with log-normal value noise (sigma 0.3), indexed in a temp folder",
    )
    args = ap.parse_args()
    s = Searcher(args.collection)
    ctx = s.context
    rng = np.random.default_rng(args.seed)
    index = s.index
    if args.scale:
        import tempfile
        from pathlib import Path

        import scipy.sparse as sp

        from sparsemm.eval.retrieval import normalize_rows
        from sparsemm.index import InvertedIndex
        from sparsemm.query.strategies import ExclusionContext

        t0 = time.perf_counter()
        x = sp.csr_matrix(s.codes[rng.integers(0, s.codes.shape[0], args.scale)])
        x.data *= rng.lognormal(0.0, 0.3, x.nnz).astype(np.float32)
        x = normalize_rows(x)
        tmp = Path(tempfile.mkdtemp(prefix="two-stage-"))
        index = InvertedIndex.build(tmp / "index", x, [str(i) for i in range(args.scale)])
        ctx = ExclusionContext(
            items_codes=x,
            text_encoder=ctx.text_encoder,
            query_coder=ctx.query_coder,
            detectors=ctx.detectors,
            reference=ctx.reference if ctx.detectors is None else None,
        )
        print(f"synthetic {args.scale} items built and indexed in {time.perf_counter() - t0:.0f} s")
    labels = sorted({lab for it in s.collection.items for lab in it.get("labels") or []})
    pairs = [f"{a} but not {b}" for a, b in itertools.permutations(labels, 2)]
    texts = {"label pairs": [pairs[i] for i in rng.permutation(len(pairs))[: args.queries]]}
    if args.sentences:
        with open(args.sentences) as fh:
            rows = [json.loads(line)["text"] for line in fh]
        texts["sentences"] = [rows[i] for i in rng.permutation(len(rows))[: args.queries]]
    print(f"{ctx.n_items} items; exact top-10 by brute force vs two-stage")
    print(f"{'queries':>12} {'mode':>18} {'recall@10':>10} {'p50 ms':>8} {'p90 ms':>8}")
    for kind, qs in texts.items():
        parsed = [parse_query(t) for t in qs]
        for q in parsed:  # warm the text caches: both modes then time scoring alone
            rank_query(ctx, q, "hybrid", k=10)
        truth, times = [], []
        for q in parsed:
            ctx.cache.clear()  # per-item arrays are not reused across queries
            t0 = time.perf_counter()
            truth.append(set(rank_query(ctx, q, "hybrid", k=10)[0].tolist()))
            times.append((time.perf_counter() - t0) * 1000)
        print(f"{kind:>12} {'brute force':>18} {1.0:10.3f} {statistics.median(times):8.2f} "
              f"{statistics.quantiles(times, n=10)[-1]:8.2f}")  # fmt: skip
        for n in args.candidates:
            rec, times = [], []
            for q, want in zip(parsed, truth, strict=True):
                ctx.cache.clear()
                t0 = time.perf_counter()
                got = set(
                    two_stage_rank(index, ctx, q, k=10, candidates=n, exclusions=args.exclusions)[
                        0
                    ].tolist()
                )
                times.append((time.perf_counter() - t0) * 1000)
                rec.append(len(got & want) / max(len(want), 1))
            p50, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
            mode = f"two-stage N={n}"
            print(f"{kind:>12} {mode:>18} {np.mean(rec):10.3f} {p50:8.2f} {p90:8.2f}")


if __name__ == "__main__":
    main()
