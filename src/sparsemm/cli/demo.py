"""``sparsemm demo``: the main job. The SR pipeline end to end on the COCO caption-proxy."""

from __future__ import annotations

import argparse
from pathlib import Path

from sparsemm.data.paths import default_data_dir
from sparsemm.eval.sr_coco import ProxyRunConfig, run_sr_coco


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the SR pipeline end to end on the COCO caption-proxy and write a report",
        description="encode (MiniLM, cached) -> SPINE on GloVe -> SR training -> evaluation "
        "on the test split. Every stage is cached/resumable in OUT.",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder holding coco/val2017.json (default $SPARSEMM_DATA or ../shared/data)",
    )
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/demo, runs/demo-quick with --quick, -nobias suffix "
        "with --no-bias), so runs with other settings never share cached stages",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="reduced size (600 images, short training) for a smoke test",
    )
    p.add_argument("--sr-epochs", type=int, default=None)
    p.add_argument("--spine-epochs", type=int, default=None)
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--no-bias", action="store_true", help="ablation: no SPINE caption bias")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = ProxyRunConfig()
    if args.quick:
        base = ProxyRunConfig(limit=600, spine_top_words=3000, spine_epochs=5, sr_epochs=3)
    cfg = ProxyRunConfig(
        **{
            **base.__dict__,
            "top_k": args.top_k,
            "use_bias": not args.no_bias,
            "seed": args.seed,
            **({"sr_epochs": args.sr_epochs} if args.sr_epochs else {}),
            **({"spine_epochs": args.spine_epochs} if args.spine_epochs else {}),
        }
    )
    data = args.data or default_data_dir()
    if args.out is None:
        args.out = Path(
            "runs/demo" + ("-quick" if args.quick else "") + ("-nobias" if args.no_bias else "")
        )
    m = run_sr_coco(data, args.out, cfg, progress=not args.no_progress)
    t = m["test"]
    ch = m["chosen_inference_mask"]
    print(f"report: {args.out / 'report.md'}  (metrics: {args.out / 'metrics.json'})")
    print(
        f"test text->image R@1/5/10  dense {t['dense']['R@1']:.3f}/{t['dense']['R@5']:.3f}/"
        f"{t['dense']['R@10']:.3f}   SR[{ch}] {t[ch]['R@1']:.3f}/{t[ch]['R@5']:.3f}/"
        f"{t[ch]['R@10']:.3f}, {t[ch]['nnz_image']:.0f} non-zeros per image code"
    )
    return 0
