"""``sparsemm collages``: build the Fashion-MNIST multi-object demo collection."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collages",
        help="build multi-object Fashion-MNIST collages with captions (demo data)",
        description="2x2 and 3x3 collages of real Fashion-MNIST images; labels = the classes "
        "present; captions from varied templates. Writes OUT/items.jsonl and PNG images, "
        "ready for `sparsemm encode OUT/items.jsonl --encoder efficientnet --text-encoder "
        "minilm`.",
    )
    p.add_argument("-o", "--out", type=Path, required=True)
    p.add_argument("--train", type=int, default=2000, help="number of training collages")
    p.add_argument("--test", type=int, default=500, help="number of test collages")
    p.add_argument(
        "--source",
        type=Path,
        default=None,
        help="folder with the Fashion-MNIST IDX files (default: find or download)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparsemm_experiments.data.fashion import build_collages

    items = build_collages(
        args.out,
        args.train,
        args.test,
        seed=args.seed,
        source=args.source,
        progress=not args.no_progress,
    )
    print(f"{args.train} train + {args.test} test collages -> {items}")
    return 0
