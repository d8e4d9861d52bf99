"""``sparsemm index``: encode a collection with a sparse model into its inverted index."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index",
        help="encode a collection's items with an SR model into an inverted index",
        description="Writes COLLECTION/index: posting lists of the items' sparse codes "
        "(memory-mapped, atomic writes) and a label per concept dimension.",
    )
    p.add_argument("collection", type=Path, help="collection folder (sparsemm encode)")
    p.add_argument("--model", type=Path, required=True, help="SR model folder (sparsemm train)")
    p.add_argument("--spine", type=Path, help="SPINE run folder: label dims with its top words")
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="non-zeros per code (default: the model's validated inference k)",
    )
    p.add_argument(
        "--dense-model",
        type=Path,
        default=None,
        help="aligner folder (sparsemm train align): the dense space for dense strategies when "
        "images and texts come from different backbones",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparsemm.query.searcher import build_index

    index = build_index(
        args.collection,
        args.model,
        spine_dir=args.spine,
        top_k=args.top_k,
        dense_model=args.dense_model,
    )
    print(
        f"indexed {len(index)} items ({index.nnz / max(len(index), 1):.1f} non-zeros each, "
        f"{index.dim} dims) -> {args.collection / 'index'}"
    )
    return 0
