"""``sparsemm demo``: the main job.

``sparsemm demo`` (or ``demo collages``) runs the offline demo on real pixels: Fashion-MNIST
collages -> EfficientNet-Lite0 + MiniLM -> SPINE -> SR and the dense alignment baseline ->
index -> exclusion benchmark -> HTML report. ``sparsemm demo coco`` runs the SR pipeline on
the COCO caption-proxy (its report: SPINE against raw GloVe, SR against dense retrieval).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sparsemm_experiments.data.paths import default_data_dir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a pipeline end to end: collages on real images (default) or the COCO proxy",
        description="collages (default): Fashion-MNIST collages -> EfficientNet-Lite0 image "
        "features + MiniLM captions -> SPINE -> SR and a dense linear-alignment baseline -> "
        "inverted index -> exclusion benchmark -> HTML report with dense vs SR results. "
        "coco: encode (MiniLM) -> SPINE -> SR -> evaluation on the COCO caption-proxy. Every "
        "stage is cached/resumable in OUT.",
    )
    p.add_argument(
        "which",
        nargs="?",
        choices=("collages", "coco"),
        default="collages",
        help="which demo (default collages)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="coco: folder holding coco/val2017.json (default $SPARSEMM_DATA or ../shared/data)",
    )
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        default=None,
        help="output folder (default runs/collages-demo, or runs/demo for coco; -quick and "
        "-nobias suffixes for those settings, so runs never share cached stages)",
    )
    p.add_argument("--quick", action="store_true", help="reduced size for a smoke test")
    p.add_argument("--train", type=int, default=None, help="collages: train collages (2000)")
    p.add_argument("--test", type=int, default=None, help="collages: test collages (500)")
    p.add_argument("--image-size", type=int, default=None, help="collages: side in pixels (224)")
    p.add_argument("--no-bench", action="store_true", help="collages: skip the benchmark")
    p.add_argument("--sr-epochs", type=int, default=None)
    p.add_argument("--spine-epochs", type=int, default=None)
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--no-bias", action="store_true", help="ablation: no SPINE caption bias")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def _out(args: argparse.Namespace, base: str) -> Path:
    if args.out is not None:
        return Path(args.out)
    return Path(base + ("-quick" if args.quick else "") + ("-nobias" if args.no_bias else ""))


def run(args: argparse.Namespace) -> int:
    return run_coco(args) if args.which == "coco" else run_collages(args)


def run_collages(args: argparse.Namespace) -> int:
    from sparsemm_experiments.collage_run import CollageRunConfig, run_collage_demo

    base = CollageRunConfig()
    if args.quick:
        base = CollageRunConfig(
            n_train=240,
            n_test=80,
            spine_top_words=1000,
            spine_epochs=10,
            sr_epochs=4,
            align_epochs=4,
            max_grid=2,
        )
    over = {
        "n_train": args.train,
        "n_test": args.test,
        "image_size": args.image_size,
        "sr_epochs": args.sr_epochs,
        "spine_epochs": args.spine_epochs,
    }
    cfg = CollageRunConfig(
        **{
            **base.__dict__,
            **{k: v for k, v in over.items() if v is not None},
            "top_k": args.top_k,
            "use_bias": not args.no_bias,
            "bench": not args.no_bench,
            "seed": args.seed,
        }
    )
    out = _out(args, "runs/collages-demo")
    s = run_collage_demo(out, cfg, progress=not args.no_progress)
    t = s["timings_s"]
    print(f"report: {s['report']}  (open it in a browser)")
    if s.get("headline"):
        print(s["headline"])
    if s["bench"]:
        print(f"benchmark: {Path(s['bench']) / 'report.md'}")
    print(
        "wall time: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in t.items() if k != "total")
        + f"; total {t['total']:.0f} s"
    )
    print(f"search page: sparsemm serve {s['collection']}  (then open http://127.0.0.1:8000)")
    return 0


def run_coco(args: argparse.Namespace) -> int:
    from sparsemm_experiments.sr_coco import ProxyRunConfig, run_sr_coco

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
    out = _out(args, "runs/demo")
    m = run_sr_coco(data, out, cfg, progress=not args.no_progress)
    t = m["test"]
    ch = m["chosen_inference_mask"]
    print(f"report: {out / 'report.md'}  (metrics: {out / 'metrics.json'})")
    print(
        f"test text->image R@1/5/10  dense {t['dense']['R@1']:.3f}/{t['dense']['R@5']:.3f}/"
        f"{t['dense']['R@10']:.3f}   SR[{ch}] {t[ch]['R@1']:.3f}/{t[ch]['R@5']:.3f}/"
        f"{t[ch]['R@10']:.3f}, {t[ch]['nnz_image']:.0f} non-zeros per image code"
    )
    return 0
