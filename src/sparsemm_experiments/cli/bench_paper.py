"""``sparsemm bench paper``: the SR paper's Tables 1-3 on the COCO caption-proxy.

Examples::

    sparsemm bench paper --data ../shared/data -o runs/paper
    sparsemm bench paper --collection runs/demo/collection -o runs/paper   # reuse an encoding
    sparsemm bench paper --quick -o /tmp/paper-quick                        # CI-sized
    sparsemm bench paper --quick -o runs/paper-quick --check     # ... against expected figures

Registered into ``sparsemm bench`` by :func:`register_bench`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError


def register_bench(benches: argparse._SubParsersAction) -> None:
    """Add ``paper`` to the sub-parsers of ``sparsemm bench``."""
    p = benches.add_parser(
        "paper",
        help="the SR paper's Tables 1-3 (all methods, significance, d sweep) in one command",
        description="Encode the COCO caption-proxy (or reuse --collection), train SPINE and "
        "SR at every latent dimension (and without the SPINE bias), VDR and SpLiCE, run the "
        "exclusion benchmark for every system on the same queries, and write Table 1 "
        "(exclusion: MRR/NDCG/AP@1,3,10, violation@10, hard subset, paired t-tests against "
        "the baselines), Table 2 (image-text retrieval AP@1/5/10) and Table 3 (SR d sweep "
        "and no-bias) as metrics.json, report.md and plots. Every stage is cached in OUT.",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder holding coco/val2017.json and splice/laion.txt "
        "(default $SPARSEMM_DATA or ../shared/data)",
    )
    p.add_argument("-o", "--out", type=Path, required=True, help="report folder (and caches)")
    p.add_argument("--collection", type=Path, help="an encoded caption-proxy collection to reuse")
    p.add_argument(
        "--dims",
        type=int,
        nargs="+",
        default=None,
        help="SR latent dimensions for Table 3 (default 500 1000 1500 2000)",
    )
    p.add_argument("--main-dim", type=int, default=None, help="SR d of Tables 1-2 (1000)")
    p.add_argument("--sr-epochs", type=int, default=None)
    p.add_argument("--spine-epochs", type=int, default=None)
    p.add_argument("--vdr-steps", type=int, default=None)
    p.add_argument("--no-vdr", action="store_true", help="leave VDR out")
    p.add_argument("--no-splice", action="store_true", help="leave SpLiCE out")
    p.add_argument("--no-nobias", action="store_true", help="leave the no-bias SR out")
    p.add_argument("--quick", action="store_true", help="reduced size (160 images, tiny models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--check",
        action="store_true",
        help="then compare metrics.json with the preset's expected figures "
        "(presets/paper[_quick].expected.json): a table, exit 1 on a miss",
    )
    p.set_defaults(func=run_paper)


def run_paper(args: argparse.Namespace) -> int:
    from sparsemm_experiments.paper_bench import QUICK, PaperBenchConfig, run_paper_bench

    data = args.data or Path(os.environ.get("SPARSEMM_DATA", "../shared/data"))
    kwargs: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.dims:
        kwargs["dims"] = tuple(args.dims)
        if args.main_dim is None and kwargs.get("main_dim", 1000) not in kwargs["dims"]:
            kwargs["main_dim"] = kwargs["dims"][len(kwargs["dims"]) // 2]
    overrides = {
        "main_dim": args.main_dim,
        "sr_epochs": args.sr_epochs,
        "spine_epochs": args.spine_epochs,
        "vdr_steps": args.vdr_steps,
    }
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    kwargs.update(
        vdr=not args.no_vdr, splice=not args.no_splice, no_bias=not args.no_nobias, seed=args.seed
    )
    preset = "paper_quick" if args.quick else "paper"
    if args.check:
        from sparsemm_experiments.expected import start_check

        start_check(
            preset,
            {
                "--dims": bool(args.dims),
                "--main-dim": args.main_dim is not None,
                "--sr-epochs": args.sr_epochs is not None,
                "--spine-epochs": args.spine_epochs is not None,
                "--vdr-steps": args.vdr_steps is not None,
                "--no-vdr": args.no_vdr,
                "--no-splice": args.no_splice,
                "--no-nobias": args.no_nobias,
                "--seed": args.seed != 0,
            },
        )
    cfg = PaperBenchConfig(**kwargs)
    if args.collection is None and not (data / "coco" / "val2017.json").is_file():
        raise SparsemmError(
            f"{data / 'coco' / 'val2017.json'} not found; pass --data (the folder holding "
            "coco/val2017.json) or --collection"
        )
    m = run_paper_bench(
        data, args.out, cfg, collection=args.collection, progress=not args.no_progress
    )
    t1 = m["table1"]["subsets"]["all"]["means"]
    best = max(t1, key=lambda k: t1[k]["ap@10"] or 0.0)
    print(f"report: {args.out / 'report.md'}  (metrics: {args.out / 'metrics.json'})")
    print(
        f"{m['n_queries']} queries; best AP@10: {best} {t1[best]['ap@10']:.3f}; "
        + "; ".join(
            f"{k} {t1[k]['ap@10']:.3f}"
            for k in ("Dense Avg Emb", "SR (two-step)", "VDR (two-step)", "SpLiCE (two-step)")
            if k in t1
        )
    )
    print(f"total {m['seconds']['total']:.0f} s; config: {dataclasses.asdict(cfg)}")
    if args.check:
        from sparsemm_experiments.expected import report_check

        return report_check(preset, m)
    return 0
