"""``sparsemm train align``: the dense baseline, a linear contrastive alignment of two frozen
backbones (:mod:`sparsemm_experiments.models.lit`), trained on the same pairs as SR. ``sparsemm
index --dense-model`` serves it to the dense strategies.

Registered into ``sparsemm train`` by :func:`register_model`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register_model(models: argparse._SubParsersAction) -> None:
    """Add ``align`` to the model sub-parsers of ``sparsemm train``."""
    al = models.add_parser(
        "align",
        help="dense baseline: linear contrastive alignment of two frozen backbones (LiT-style)",
        description="Train one linear head per modality into a shared unit-sphere space with "
        "the same InfoNCE, pairs and optimiser as SR: the dense model SR is compared with when "
        "images and texts come from different backbones.",
    )
    al.add_argument("collection", type=Path, help="collection folder (sparsemm encode)")
    al.add_argument("-o", "--out", type=Path, required=True, help="model output folder")
    al.add_argument(
        "--split", default="train", help="items used for training (default train; 'all': every)"
    )
    al.add_argument("--dim", type=int, default=512, help="shared space width")
    al.add_argument("--tau", type=float, default=0.05)
    al.add_argument("--epochs", type=int, default=20)
    al.add_argument("--batch-size", type=int, default=256)
    al.add_argument("--lr", type=float, default=1e-3)
    al.add_argument("--seed", type=int, default=0)
    al.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    al.add_argument("--no-progress", action="store_true")
    al.set_defaults(func=run_align)


def run_align(args: argparse.Namespace) -> int:
    from sparsemm.data.collection import open_collection
    from sparsemm.models.base import encoder_record
    from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection
    from sparsemm_experiments.models.lit import AlignConfig
    from sparsemm_experiments.train.lit import train_aligner

    col = open_collection(args.collection)
    image, text, pair_item, _ = sr_pairs_from_collection(col, col.split_mask(args.split), None)
    config = AlignConfig(
        image_dim=image.shape[1], text_dim=text.shape[1], dim=args.dim, tau=args.tau
    )
    tc = SRTrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    aligner, hist = train_aligner(
        image,
        text,
        pair_item,
        config,
        args.out,
        tc,
        resume=args.resume,
        progress=not args.no_progress,
    )
    # Record the encoders, so index/search refuse the aligner on another backbone pair.
    aligner.training_info = encoder_record(col.manifest, args.collection)
    aligner.save_pretrained(args.out)
    print(
        f"trained the aligner on {len(image)} items / {len(text)} captions -> {args.out} "
        f"(nce {hist[-1]['nce'] if hist else float('nan'):.4f})"
    )
    return 0
