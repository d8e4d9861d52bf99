"""How cautious should a term to leave out be? The SR scorer's exclude shift, chosen.

The served ``match`` scorer reads a term to leave out more cautiously than a wanted one:
``calibration.exclude_shift`` (log-odds) is added to its P(term | x), so an item that may
show the thing counts as showing it (sparsemm.query.scorers.DetectorScorer). A shift of
log(w) is the calibration refitted with misses weighted w times a false alarm.

For each w of a grid, on one split of a COCO collection (``sparsemm demo coco``):

* **negated sentences** (``sparsemm_experiments.eval.negation``'s families; on the train split only
  the tuning families): R@5 and the share of the top 5 that shows an excluded object;
* **verification over annotated objects** (``coco_concepts.py``'s captions, objects as
  COCO annotates them): accuracy per type of the true caption, and overall.

The choice rule (run on the train split): the least w whose sentence violation@5 is at
most ``hybrid``'s on the same sentences, with R@5 no lower than hybrid's, and whose
verification types are all at least 0.65. The test split's figures are then read for the
chosen w, families and phrasings held out reported apart.

    python benchmarks/exclude_caution.py --collection runs/demo/collection --sr runs/demo/sr \\
        --split train -o runs/exclude-caution-train
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import git_commit

GRID = (1.0, 2.0, 3.0, 5.0, 10.0)


def clear_probabilities(ctx: Any) -> None:
    for key in [k for k in list(ctx.cache.keys()) if isinstance(k, tuple) and k[0] == "match_p"]:
        del ctx.cache[key]


def sentences(ctx: Any, queries: list[Any], labels: list[list[str]], method: str) -> dict:
    from sparsemm_experiments.eval.negation import evaluate_method, parse_all, query_truth

    parsed, _ = parse_all(queries)
    per = evaluate_method(ctx, queries, parsed, query_truth(queries, labels), method, k=10)
    groups = np.asarray([q.group for q in queries])
    out = {}
    for g in ("tune", "heldout", "all"):
        sel = groups == g if g != "all" else np.ones(len(queries), bool)
        if sel.any():
            out[g] = {
                "queries": int(sel.sum()),
                "r@5": round(float(per["recall@5"][sel].mean()), 4),
                "violation@5": round(float(per["violation@5"][sel].mean()), 4),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--collection", type=Path, required=True)
    ap.add_argument("--sr", type=Path, required=True)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--grid", type=float, nargs="+", default=list(GRID))
    ap.add_argument("--per-item", type=int, default=1)
    ap.add_argument("--phrase-factors", type=float, nargs="+", default=[1.0])
    ap.add_argument("--no-verification", action="store_true")
    args = ap.parse_args(argv)
    import coco_concepts as cc

    from sparsemm.data.collection import open_collection
    from sparsemm.io import write_json
    from sparsemm.query.scorers import detector_scorer
    from sparsemm_experiments.eval.negation import FAMILIES, build_negation_queries

    t0 = time.perf_counter()
    col = open_collection(args.collection)
    rows, labels, captions = cc.split_items(col, args.split)
    ctx = cc.build_context(col, args.sr, rows, None)
    fams = FAMILIES if args.split != "train" else tuple(f for f in FAMILIES if f.group == "tune")
    queries = build_negation_queries(captions, labels, fams, per_item=args.per_item, seed=1)
    items = cc.verification_set(labels, captions, seed=0, objects="annotated")
    scorer = detector_scorer(ctx.detectors)
    base = scorer.calibration
    results: dict[str, Any] = {"hybrid": sentences(ctx, queries, labels, "hybrid")}
    print("hybrid", results["hybrid"])
    for f in args.phrase_factors:
        # the phrase slope times f, about the similarity where P is one half
        pa, half = base.phrase_a * f, -base.phrase_c / base.phrase_a
        for w in args.grid:
            scorer.calibration = dataclasses.replace(
                base, exclude_shift=math.log(w), phrase_a=pa, phrase_c=-pa * half
            )
            clear_probabilities(ctx)
            sent = sentences(ctx, queries, labels, "match")
            key = f"w={w:g}" + (f",phrase x{f:g}" if f != 1 else "")
            if args.no_verification:
                results[key] = {"sentences": sent}
                print(key, sent)
                continue
            ver = cc.run_verification(ctx, items, references=False)["accuracy"]["match"]
            results[key] = {"sentences": sent, "verification": ver}
            print(key, sent, {k: v for k, v in ver.items() if ":" not in k})
    scorer.calibration = base
    metrics = {
        "split": args.split,
        "sentences": len(queries),
        "verification_images": len(items),
        "results": results,
        "seconds": round(time.perf_counter() - t0, 1),
        "git_commit": git_commit(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "metrics.json", metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
