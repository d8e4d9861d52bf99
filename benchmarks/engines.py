"""The local inverted index vs scipy brute force vs Qdrant Edge, in one run.

For each data variant and size it generates synthetic sparse codes deterministically (seeded
by variant and size), builds every engine on them, and measures, single-threaded: build time,
memory per item, p50/p99 latency (wall clock) and p50 CPU time of the whole process (which
includes Qdrant Edge's own search thread) for plain top-k queries and for exclusion queries
(2-4 excluded dims, hard filter: drop items with a value > 0 on any of them), and recall@k of
each engine against brute force.

Variants: ``uniform`` (1,000 dims, ~64 non-zeros per item, dims drawn uniformly) and ``vdr``
(30,000 dims like a BERT vocabulary, ~64 non-zeros, dims drawn with Zipf-skewed frequencies,
p_d ~ 1 / (d + 1)^s). Queries have ~``--qnnz`` dims drawn from the same distribution;
excluded dims are drawn from it too, leaving out the 1% most frequent (stop-word-like) dims.

Engines: ``local`` (sparsemm.index.InvertedIndex, numba kernels, NUMBA_NUM_THREADS=1),
``brute`` (scipy CSR @ q then argpartition), ``edge`` (qdrant-edge-py's EdgeShard: one sparse
named vector, the exclusion as ``must_not`` on a lookup-indexed integer-list payload of each
item's active dims, ``max_search_threads=--edge-threads``).

    nice -n 5 python benchmarks/engines.py --sizes 100000 1000000 --out runs/engines

With ``--out`` it writes config.json, metrics.json and the git commit there.
"""

from __future__ import annotations

import os

# Single thread for every library, set before numpy/scipy/numba load their thread pools.
for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from _common import dim_probs, git_commit, random_codes  # noqa: E402

from sparsemm.index import Exclusion, InvertedIndex  # noqa: E402

log = logging.getLogger("engines")

VARIANTS: dict[str, dict[str, Any]] = {
    "uniform": {"dims": 1000, "nnz": 64, "zipf": 0.0},
    "vdr": {"dims": 30000, "nnz": 64, "zipf": 1.0},
}


# ------------------------------------------------------------------------------------ data


def make_queries(
    nq: int, spec: dict[str, Any], qnnz: int, rng: np.random.Generator
) -> tuple[sp.csr_matrix, list[np.ndarray]]:
    """Query codes (nq, dims) and per query 2-4 excluded dims (not in the query)."""
    dims = spec["dims"]
    p = dim_probs(dims, spec["zipf"])
    queries = random_codes(nq, dims, qnnz, rng, p)
    n_top = max(1, dims // 100) if p is not None else 0
    pool = np.arange(n_top, dims)  # dims are ordered by popularity: skip the top 1%
    pp = None if p is None else p[n_top:] / p[n_top:].sum()
    excl = []
    for i in range(nq):
        qd = set(queries.indices[queries.indptr[i] : queries.indptr[i + 1]].tolist())
        m = int(rng.integers(2, 5))
        picked: list[int] = []
        while len(picked) < m:
            d = int(rng.choice(pool, p=pp))
            if d not in qd and d not in picked:
                picked.append(d)
        excl.append(np.asarray(sorted(picked), np.int64))
    return queries, excl


# ---------------------------------------------------------------------------------- engines


def brute_topk(
    codes: sp.csr_matrix, codes_t: sp.csc_matrix, q: sp.csr_matrix, k: int, ban: np.ndarray | None
) -> np.ndarray:
    """Top-k rows of codes @ q (ties: lower row), dropping rows with a value > 0 on ``ban``."""
    qd = np.zeros(codes.shape[1], np.float32)
    qd[q.indices] = q.data
    scores = codes @ qd
    if ban is not None:
        banned = np.asarray((codes_t[:, ban] > 0).sum(axis=1)).ravel() > 0
        scores[banned] = -np.inf
    part = np.argpartition(-scores, k - 1)[:k]
    return part[np.lexsort((part, -scores[part]))]


class LocalEngine:
    name = "local"

    def __init__(self, codes: sp.csr_matrix, workdir: Path) -> None:
        self.path = workdir / "local_index"
        ids = [str(i) for i in range(codes.shape[0])]
        t0 = time.perf_counter()
        InvertedIndex.build(self.path, codes, ids, overwrite=True)
        self.build_s = time.perf_counter() - t0
        self.index = InvertedIndex.open(self.path)
        self.index.warm()
        n = codes.shape[0]
        # long posting lists are also held as dense value rows (built by warm())
        dense_rows = sum(seg.dense_lists()[1].nbytes for seg in self.index._segments)
        self.memory = {
            "arrays_bytes_per_item": self.index.nbytes / n,
            "dense_rows_bytes_per_item": dense_rows / n,
            "postings_bytes_per_item": 8.0 * codes.nnz / n,
            "disk_bytes_per_item": dir_bytes(self.path) / n,
        }

    def query(self, q: sp.csr_matrix, k: int, ban: np.ndarray | None) -> np.ndarray:
        ex = None if ban is None else Exclusion(ban)
        return self.index.search(q, k, exclude=ex).rows

    def close(self) -> None:
        del self.index
        shutil.rmtree(self.path, ignore_errors=True)


class EdgeEngine:
    name = "edge"

    def __init__(
        self, codes: sp.csr_matrix, workdir: Path, threads: int, batch: int, progress: bool
    ) -> None:
        import qdrant_edge as qe

        self.qe = qe
        self.path = workdir / "edge_shard"
        shutil.rmtree(self.path, ignore_errors=True)
        rss0 = rss_bytes()
        t0 = time.perf_counter()
        cfg = qe.EdgeConfig(
            sparse_vectors={"code": qe.EdgeSparseVectorParams()}, max_search_threads=threads
        )
        self.shard = qe.EdgeShard.create(str(self.path), cfg)
        self.shard.update(
            qe.UpdateOperation.create_field_index(
                "active", qe.IntegerIndexParams(lookup=True, range=False)
            )
        )
        n = codes.shape[0]
        t_points = 0.0
        for lo in range(0, n, batch):
            hi = min(n, lo + batch)
            tp = time.perf_counter()
            pts = []
            for i in range(lo, hi):
                a, b = codes.indptr[i], codes.indptr[i + 1]
                idx = codes.indices[a:b].tolist()
                # active dims at threshold 0: every stored dim (values are > 0)
                pts.append(
                    qe.Point(
                        i,
                        {"code": qe.SparseVector(idx, codes.data[a:b].tolist())},
                        {"active": idx},
                    )
                )
            t_points += time.perf_counter() - tp
            self.shard.update(qe.UpdateOperation.upsert_points(pts))
            if progress and (hi // batch) % 50 == 0:
                log.info("  edge: %d / %d points", hi, n)
        t_up = time.perf_counter()
        self.shard.optimize()
        self.build_s = time.perf_counter() - t0
        self.build_parts = {
            "python_points_s": t_points,
            "upsert_s": t_up - t0 - t_points,
            "optimize_s": time.perf_counter() - t_up,
        }
        self.memory = {
            "disk_bytes_per_item": dir_bytes(self.path) / n,
            "rss_delta_bytes_per_item": max(0, rss_bytes() - rss0) / n,
            "segments": self.shard.info().segments_count,
        }

    def query(self, q: sp.csr_matrix, k: int, ban: np.ndarray | None) -> np.ndarray:
        qe = self.qe
        vec = qe.SparseVector(q.indices.tolist(), q.data.tolist())
        flt = None
        if ban is not None:
            flt = qe.Filter(must_not=[qe.FieldCondition("active", match=qe.MatchAny(ban.tolist()))])
        pts = self.shard.query(
            qe.QueryRequest(limit=k, query=qe.Query.Nearest(vec, using="code"), filter=flt)
        )
        return np.asarray([int(p.id) for p in pts], np.int64)

    def close(self) -> None:
        self.shard.close()
        del self.shard
        shutil.rmtree(self.path, ignore_errors=True)


# ---------------------------------------------------------------------------------- helpers


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def percentile_ms(ns: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(ns, np.float64) / 1e6, q))


def time_queries(
    fn: Callable[[sp.csr_matrix, int, np.ndarray | None], np.ndarray],
    qs: list[sp.csr_matrix],
    bans: list[np.ndarray | None],
    k: int,
) -> tuple[dict[str, float], list[np.ndarray]]:
    """Run every query once after a short warm-up; wall and process-CPU percentiles."""
    for i in range(min(10, len(qs))):
        fn(qs[i], k, bans[i])
    wall, cpu, out = [], [], []
    for q, ban in zip(qs, bans, strict=True):
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        rows = fn(q, k, ban)
        wall.append(time.perf_counter_ns() - t0)
        cpu.append(time.process_time_ns() - c0)
        out.append(rows)
    stats = {
        "p50_ms": percentile_ms(wall, 50),
        "p99_ms": percentile_ms(wall, 99),
        "cpu_p50_ms": percentile_ms(cpu, 50),
    }
    return stats, out


def recall(got: list[np.ndarray], ref: list[np.ndarray], k: int) -> tuple[float, float]:
    """Mean recall@k against brute force and the share of queries with the identical list."""
    rec = [
        len(set(g.tolist()) & set(r.tolist())) / max(1, min(k, len(r)))
        for g, r in zip(got, ref, strict=False)
    ]
    same = [np.array_equal(g, r) for g, r in zip(got, ref, strict=False)]
    return float(np.mean(rec)), float(np.mean(same))


def memcpy_gbps(mb: int = 512) -> float:
    """Single-thread memcpy bandwidth (GB/s of bytes copied) on buffers larger than L3."""
    a = np.ones(mb << 20, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9


# ------------------------------------------------------------------------------------- runs


def run_one(variant: str, n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    spec = VARIANTS[variant]
    seed = args.seed * 1_000_003 + n * 7 + (0 if variant == "uniform" else 1)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    codes = random_codes(n, spec["dims"], spec["nnz"], rng, dim_probs(spec["dims"], spec["zipf"]))
    queries, excl = make_queries(args.queries, spec, args.qnnz, rng)
    log.info(
        "%s n=%d: data in %.1fs (%.1f nnz/item)",
        variant,
        n,
        time.perf_counter() - t0,
        codes.nnz / n,
    )
    qs = [queries[i] for i in range(args.queries)]
    res: dict[str, Any] = {
        "variant": variant,
        "n": n,
        "dims": spec["dims"],
        "nnz_per_item": codes.nnz / n,
        "csr_bytes_per_item": (codes.data.nbytes + codes.indices.nbytes + codes.indptr.nbytes) / n,
        "engines": {},
    }
    # Postings a query touches: its dims' lists (and the excluded dims' lists).
    col_nnz = np.bincount(codes.indices, minlength=spec["dims"]) if args.postings else None
    if col_nnz is not None:
        plain = [int(col_nnz[q.indices].sum()) for q in qs]
        exq = [p + int(col_nnz[e].sum()) for p, e in zip(plain, excl, strict=True)]
        res["postings_per_query"] = {
            "plain": float(np.median(plain)),
            "exclusion": float(np.median(exq)),
        }
    nb = min(args.brute_queries, args.queries)
    refs: dict[str, list[np.ndarray]] = {}
    codes_t = codes.tocsc()

    def brute(q: sp.csr_matrix, k: int, ban: np.ndarray | None) -> np.ndarray:
        return brute_topk(codes, codes_t, q, k, ban)

    for label in ("plain", "exclusion"):
        bans = [excl[i] if label == "exclusion" else None for i in range(nb)]
        stats, out = time_queries(brute, qs[:nb], bans, args.k)
        refs[label] = out
        res["engines"].setdefault("brute", {"build_s": 0.0, "memory": {}})[label] = stats
    for name in args.engines:
        if name == "brute":
            continue
        if name == "edge" and n > args.edge_max_size:
            log.info("%s n=%d: edge skipped (n > --edge-max-size)", variant, n)
            continue
        log.info("%s n=%d: building %s", variant, n, name)
        eng: Any = (
            LocalEngine(codes, workdir)
            if name == "local"
            else EdgeEngine(codes, workdir, args.edge_threads, args.edge_batch, True)
        )
        entry: dict[str, Any] = {"build_s": eng.build_s, "memory": eng.memory}
        if hasattr(eng, "build_parts"):
            entry["build_parts"] = eng.build_parts
        log.info("%s n=%d: %s built in %.1fs", variant, n, name, eng.build_s)
        for label in ("plain", "exclusion"):
            bans = [excl[i] if label == "exclusion" else None for i in range(args.queries)]
            stats, out = time_queries(eng.query, qs, bans, args.k)
            stats["recall"], stats["identical"] = recall(out[:nb], refs[label], args.k)
            entry[label] = stats
        eng.close()
        del eng
        gc.collect()
        res["engines"][name] = entry
    return res


def print_table(results: list[dict[str, Any]], bw: float) -> None:
    head = (
        f"{'variant':>8} {'items':>9} {'engine':>6} {'query':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'cpu p50':>8} {'recall':>7} {'build s':>8} {'MB/s postings':>13}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        for name in ("local", "edge", "brute"):
            e = r["engines"].get(name)
            if e is None:
                continue
            for label in ("plain", "exclusion"):
                m = e[label]
                post = r.get("postings_per_query", {}).get(label)
                rate = f"{8 * post / (m['cpu_p50_ms'] * 1e3):>13.0f}" if post else f"{'-':>13}"
                rec = f"{m['recall']:>7.3f}" if "recall" in m else f"{'ref':>7}"
                print(
                    f"{r['variant']:>8} {r['n']:>9} {name:>6} {label:>9} {m['p50_ms']:>8.3f} "
                    f"{m['p99_ms']:>8.3f} {m['cpu_p50_ms']:>8.3f} {rec} {e['build_s']:>8.1f} "
                    f"{rate}"
                )
    print(
        "(p50/p99: wall clock per query, single thread; cpu: p50 CPU time of the process; "
        "recall@k vs brute force; MB/s postings: 8 bytes per posting the query touches / cpu p50)"
    )
    print(f"single-thread memcpy bandwidth: {bw:.2f} GB/s")
    for r in results:
        parts = [f"CSR {r['csr_bytes_per_item']:.0f} B/item"]
        for name in ("local", "edge"):
            e = r["engines"].get(name)
            if e:
                mem = ", ".join(
                    f"{k.replace('_bytes_per_item', '')} {v:.0f}"
                    for k, v in e["memory"].items()
                    if k.endswith("per_item")
                )
                parts.append(f"{name} [{mem}] B/item")
        if "postings_per_query" in r:
            pq = r["postings_per_query"]
            parts.append(f"postings/query {pq['plain']:.0f} (+excl {pq['exclusion']:.0f})")
        print(f"  {r['variant']} {r['n']}: " + "; ".join(parts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["uniform", "vdr"])
    ap.add_argument(
        "--engines",
        nargs="+",
        choices=("local", "edge", "brute"),
        default=["local", "edge", "brute"],
    )
    ap.add_argument("--qnnz", type=int, default=16, help="non-zeros per query")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--brute-queries", type=int, default=50, help="queries run by brute force")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--edge-threads", type=int, default=1, help="Qdrant Edge search threads")
    ap.add_argument("--edge-batch", type=int, default=2000, help="points per Edge upsert")
    ap.add_argument(
        "--edge-max-size", type=int, default=10**9, help="skip Edge above this many items"
    )
    ap.add_argument("--no-postings", dest="postings", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="where engines store data")
    ap.add_argument("--out", type=Path, default=None, help="write config/metrics.json here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)

    bw = memcpy_gbps()
    results = []
    with tempfile.TemporaryDirectory(prefix="engines.") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for variant in args.variants:
            for n in args.sizes:
                results.append(run_one(variant, n, args, workdir))
                if args.out is not None:  # keep partial results of long runs
                    write_out(args, results, bw)
    print_table(results, bw)
    if args.out is not None:
        write_out(args, results, bw)
    return 0


def write_out(args: argparse.Namespace, results: list[dict[str, Any]], bw: float) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config["git_commit"] = git_commit()
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    metrics = {"memcpy_gbps": bw, "results": results}
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
