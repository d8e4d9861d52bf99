"""Latency of the embedded inverted index vs scipy CSR brute force, single thread.

Synthetic codes: each item has ~``--nnz`` random dims (uniform, or Zipf-skewed dimension
popularity with ``--zipf S``) with positive values; each query ~``--qnnz`` dims. For every
size it measures build time (create + add + fsync), open time, bytes per item, and p50/p99
latency of plain top-k, of exclusion queries (2-4 random excluded dims, filter mode,
threshold 0) and of correlated exclusions (the query's own two heaviest dims excluded, as in
"sports but not basketball", where most high scorers are banned) for the index and for
brute force (``codes @ q`` in scipy, then argpartition) in the same run, checks that both
return the same top-k, and prints a table with the speed-ups.

    python benchmarks/index_latency.py --sizes 100000 1000000 --out runs/index_latency

``--plain-scan`` also times the index with max-score pruning off (``index.pruning = False``,
the kernel before pruning) on the same queries, so the ratio comes from one run.
``--approx SHARE`` also times approximate search (``search(..., approx=SHARE)``) on the
plain queries and reports its recall@k against the exact index results.

With ``--out`` it writes config.json, metrics.json and the git commit there.
"""

from __future__ import annotations

import os

# Single thread for every library, set before numpy/scipy/numba load their thread pools.
for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from _common import dim_probs, git_commit, random_codes  # noqa: E402

from sparsemm.index import Exclusion, InvertedIndex  # noqa: E402

log = logging.getLogger("index_latency")

CHUNK = 200_000  # rows per batch of draws: part of the seeded data, keep it


def brute_topk(codes: sp.csr_matrix, q: np.ndarray, k: int, ban: np.ndarray | None) -> np.ndarray:
    """Top-k rows of ``codes @ q`` (ties: lower row), skipping rows where ``codes @ ban > 0``."""
    scores = codes @ q
    if ban is not None:
        # codes are non-negative here, so (codes @ indicator) > 0 <=> some excluded value > 0
        scores[(codes @ ban) > 0] = -np.inf
    part = np.argpartition(-scores, k - 1)[:k]
    return part[np.lexsort((part, -scores[part]))]


def percentiles(ns: list[int]) -> tuple[float, float]:
    ms = np.asarray(ns, dtype=np.float64) / 1e6
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def run_size(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    p = dim_probs(args.dims, args.zipf)
    t0 = time.perf_counter()
    codes = random_codes(n, args.dims, args.nnz, rng, p, chunk=CHUNK)
    log.info("n=%d: generated codes in %.1fs (nnz %d)", n, time.perf_counter() - t0, codes.nnz)
    queries = random_codes(args.queries, args.dims, args.qnnz, rng, p, chunk=CHUNK)
    exclusions = []
    for i in range(args.queries):
        qdims = set(queries.indices[queries.indptr[i] : queries.indptr[i + 1]].tolist())
        cand = np.setdiff1d(np.arange(args.dims), list(qdims))
        m = int(rng.integers(2, 5))
        exclusions.append(rng.choice(cand, size=m, replace=False))
    # exclusions correlated with the query, as in "sports but not basketball": the query's
    # own two heaviest dims, so most of the high scorers are banned
    correlated = []
    for i in range(args.queries):
        lo, hi = queries.indptr[i], queries.indptr[i + 1]
        order = np.argsort(-queries.data[lo:hi], kind="stable")[:2]
        correlated.append(queries.indices[lo:hi][order])
    ids = [f"item{i}" for i in range(n)]

    path = workdir / f"index_{n}"
    t0 = time.perf_counter()
    index = InvertedIndex.build(path, codes, ids, overwrite=True)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = InvertedIndex.open(path)
    open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.warm()  # steady state of a running service: pages of the mapped arrays faulted in
    warm_s = time.perf_counter() - t0
    files = [f for f in path.rglob("*") if f.is_file()]
    disk_bytes = sum(f.stat().st_size for f in files)
    # the posting lists (post_*.npy) and the row store kept for exact rescoring (row_*.npy)
    part_bytes = {
        part: sum(f.stat().st_size for f in files if f.name.startswith(part))
        for part in ("post_", "row_")
    }

    q_rows = [queries[i] for i in range(args.queries)]
    q_dense = [np.asarray(queries[i].toarray()).ravel() for i in range(args.queries)]
    ex_sets = {"exclusion": exclusions, "correlated": correlated}
    ex_objs = {lab: [Exclusion(dims=e.tolist()) for e in es] for lab, es in ex_sets.items()}
    ban_dense: dict[str, list[np.ndarray]] = {lab: [] for lab in ex_sets}
    for lab, es in ex_sets.items():
        for e in es:
            v = np.zeros(args.dims, np.float32)
            v[e] = 1.0
            ban_dense[lab].append(v)

    for i in range(min(10, args.queries)):  # warm-up: numba compile / cache load, page-in
        index.search(q_rows[i], args.k)
        index.search(q_rows[i], args.k, exclude=ex_objs["exclusion"][i])
        index.search(q_rows[i], args.k, exclude=ex_objs["correlated"][i])
        brute_topk(codes, q_dense[i], args.k, None)

    res: dict[str, Any] = {
        "n": n,
        "nnz": int(codes.nnz),
        "build_s": build_s,
        "open_s": open_s,
        "warm_s": warm_s,
        "queries": args.queries,
    }
    agree = 0
    for label in ("plain", "exclusion", "correlated"):
        use_ex = label != "plain"
        # Each method runs its own loop (steady state, as in a service answering a stream of
        # queries); interleaving them would let each evict the other's data from the caches.
        t_idx, t_bf, c_idx, c_bf, hits = [], [], [], [], []
        for i in range(args.queries):
            ex = ex_objs[label][i] if use_ex else None
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            hit = index.search(q_rows[i], args.k, exclude=ex)
            t_idx.append(time.perf_counter_ns() - t0)
            c_idx.append(time.thread_time_ns() - c0)
            hits.append(hit.rows)
        for i in range(args.queries):
            ban = ban_dense[label][i] if use_ex else None
            c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
            ref = brute_topk(codes, q_dense[i], args.k, ban)
            t_bf.append(time.perf_counter_ns() - t0)
            c_bf.append(time.thread_time_ns() - c0)
            agree += int(np.array_equal(hits[i], ref))
        i50, i99 = percentiles(t_idx)
        b50, b99 = percentiles(t_bf)
        res[label] = {
            "index_p50_ms": i50,
            "index_p99_ms": i99,
            "brute_p50_ms": b50,
            "brute_p99_ms": b99,
            "speedup_p50": b50 / i50,
            # CPU time of the calling thread: less sensitive to other processes on the host
            "index_cpu_p50_ms": percentiles(c_idx)[0],
            "brute_cpu_p50_ms": percentiles(c_bf)[0],
        }
        if args.plain_scan:
            index.pruning = False
            c_old = []
            for i in range(args.queries):
                ex = ex_objs[label][i] if use_ex else None
                c0 = time.thread_time_ns()
                old = index.search(q_rows[i], args.k, exclude=ex)
                c_old.append(time.thread_time_ns() - c0)
                agree_old = np.array_equal(old.rows, hits[i])
                res.setdefault("plain_scan_identical", 0)
                res["plain_scan_identical"] += int(agree_old)
            index.pruning = True
            res[label]["plain_scan_cpu_p50_ms"] = percentiles(c_old)[0]
        if args.approx is not None and not use_ex:
            t0 = time.perf_counter()
            index.warm(approx=args.approx)
            res["approx_build_s"] = time.perf_counter() - t0
            c_ap, rec = [], []
            for i in range(args.queries):
                c0 = time.thread_time_ns()
                ap = index.search(q_rows[i], args.k, approx=args.approx)
                c_ap.append(time.thread_time_ns() - c0)
                rec.append(len(set(ap.rows.tolist()) & set(hits[i].tolist())) / len(hits[i]))
            res["approx"] = {
                "share": args.approx,
                "cpu_p50_ms": percentiles(c_ap)[0],
                "recall": float(np.mean(rec)),
            }
    res["topk_agreement"] = agree / (3 * args.queries)
    res["index_bytes_per_item"] = index.nbytes / n
    res["disk_bytes_per_item"] = disk_bytes / n
    res["postings_bytes_per_item"] = part_bytes["post_"] / n
    res["row_store_bytes_per_item"] = part_bytes["row_"] / n
    res["csr_bytes_per_item"] = (codes.data.nbytes + codes.indices.nbytes + codes.indptr.nbytes) / n
    del index
    if not args.keep:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    return res


def print_table(results: list[dict[str, Any]]) -> None:
    head = (
        f"{'items':>9} {'query':>10} {'index p50':>10} {'index p99':>10} {'brute p50':>10} "
        f"{'brute p99':>10} {'speed-up':>9} {'index cpu':>10} {'brute cpu':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        for label in ("plain", "exclusion", "correlated"):
            m = r[label]
            print(
                f"{r['n']:>9} {label:>10} {m['index_p50_ms']:>8.3f}ms {m['index_p99_ms']:>8.3f}ms "
                f"{m['brute_p50_ms']:>8.3f}ms {m['brute_p99_ms']:>8.3f}ms "
                f"{m['speedup_p50']:>8.1f}x {m['index_cpu_p50_ms']:>8.3f}ms "
                f"{m['brute_cpu_p50_ms']:>8.3f}ms"
            )
    print("(p50/p99: wall clock per query; cpu: p50 CPU time of the searching thread)")
    for r in results:
        for label in ("plain", "exclusion", "correlated"):
            old = r[label].get("plain_scan_cpu_p50_ms")
            if old is not None:
                new = r[label]["index_cpu_p50_ms"]
                print(
                    f"{r['n']:>9} {label:>10}: pruning off (plain scan) cpu p50 {old:.3f}ms, "
                    f"pruning on {new:.3f}ms, ratio {old / new:.2f}x"
                )
        if "plain_scan_identical" in r:
            print(
                f"{r['n']:>9} plain scan == pruned results: "
                f"{r['plain_scan_identical']}/{3 * len_queries(r)}"
            )
        if "approx" in r:
            a = r["approx"]
            print(
                f"{r['n']:>9} approx share {a['share']}: cpu p50 {a['cpu_p50_ms']:.3f}ms, "
                f"recall@k vs exact {a['recall']:.4f} (truncated lists built in "
                f"{r['approx_build_s']:.1f}s)"
            )
    print()
    for r in results:
        print(
            f"{r['n']:>9} items: build {r['build_s']:.2f}s, open {r['open_s'] * 1e3:.1f}ms "
            f"+ warm {r['warm_s'] * 1e3:.1f}ms, "
            f"index arrays {r['index_bytes_per_item']:.0f} B/item (disk "
            f"{r['disk_bytes_per_item']:.0f} B/item incl. ids; CSR {r['csr_bytes_per_item']:.0f}"
            f" B/item; on disk posting lists {r['postings_bytes_per_item']:.0f} + row store "
            f"{r['row_store_bytes_per_item']:.0f} B/item), top-k agreement with brute force "
            f"{r['topk_agreement']:.3f}"
        )


def len_queries(r: dict[str, Any]) -> int:
    return int(r["queries"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--dims", type=int, default=1000)
    ap.add_argument("--nnz", type=int, default=64, help="non-zeros per item")
    ap.add_argument("--qnnz", type=int, default=16, help="non-zeros per query")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--zipf", type=float, default=0.0, help="dim popularity skew (0=uniform)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="where to build the indexes")
    ap.add_argument("--keep", action="store_true", help="keep the built indexes")
    ap.add_argument(
        "--plain-scan", action="store_true", help="also time the index with pruning off"
    )
    ap.add_argument(
        "--approx", type=float, default=None, help="also time approximate search at this share"
    )
    ap.add_argument("--out", type=Path, default=None, help="write config/metrics.json here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="index_latency.") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = [run_size(n, args, workdir) for n in args.sizes]
    print_table(results)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        config["git_commit"] = git_commit()
        (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (args.out / "metrics.json").write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
