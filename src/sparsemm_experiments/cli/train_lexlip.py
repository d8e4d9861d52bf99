"""``sparsemm train lexlip``: LexLIP pre-training on a collection's (item, caption) pairs.

Registered into ``sparsemm train`` by :func:`register_model`. Items are read as patch
features: the frozen caption embeddings of each item (``--image-input captions``, the COCO
caption-proxy) or EfficientNet-Lite0 7x7 spatial features of the item images
(``--image-input efficientnet``, cached under ``--cache``).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def register_model(models: argparse._SubParsersAction) -> None:
    """Add ``lexlip`` to the sub-parsers of ``sparsemm train``."""
    p = models.add_parser(
        "lexlip",
        help="LexLIP: lexicon-bottlenecked pre-training + momentum lexicon contrastive",
        description="Train LexLIP image/text towers whose outputs are weights over a BERT "
        "word-piece lexicon (phase 1: masked-language decoders fed through the lexicon "
        "bottleneck; phase 2: momentum encoders, feature queues and a FLOPs regulariser). "
        "Resumable with --resume.",
    )
    p.add_argument("collection", type=Path, help="collection folder (sparsemm encode)")
    p.add_argument("-o", "--out", type=Path, required=True, help="model output folder")
    p.add_argument("--split", default="train", help="items used for training (default train)")
    p.add_argument(
        "--image-input",
        choices=("auto", "captions", "efficientnet"),
        default="auto",
        help="item patches: caption embeddings (proxy) or EfficientNet spatial features; "
        "auto = efficientnet when every item has an image, else captions",
    )
    p.add_argument("--cache", type=Path, help="folder for cached EfficientNet features")
    p.add_argument(
        "--vocab-min-count",
        type=int,
        default=2,
        help="lexicon = word pieces seen this often in the training captions (0: full vocab)",
    )
    p.add_argument("--frozen-layers", type=int, default=5, help="frozen lower MiniLM layers")
    p.add_argument("--max-text-len", type=int, default=16, help="word pieces per caption")
    p.add_argument("--pretrain-steps", type=int, default=200)
    p.add_argument("--contrastive-steps", type=int, default=400)
    p.add_argument(
        "--captions-per-item",
        type=int,
        default=2,
        help="training captions per item (frozen states cached; 0: all)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--queue-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=5e-5, help="pretrained layers")
    p.add_argument("--new-lr", type=float, default=1e-3, help="freshly initialised layers")
    p.add_argument("--tau", type=float, default=0.05)
    p.add_argument("--flops-weight", type=float, default=0.002, help="lambda (FLOPs)")
    p.add_argument("--momentum", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_lexlip)


def run_lexlip(args: argparse.Namespace) -> int:
    from sparsemm.data.collection import open_collection
    from sparsemm.errors import SparsemmError
    from sparsemm.runtime import torch_threads
    from sparsemm_experiments.models.lexlip import LexLIPConfig
    from sparsemm_experiments.train.lexlip import (
        LexLIPTrainConfig,
        build_config,
        lexlip_data,
        train_lexlip,
    )

    col = open_collection(args.collection)
    kind = args.image_input
    if kind == "auto":
        kind = "efficientnet" if all(it.get("image") for it in col.items) else "captions"
    if args.vocab_min_count < 0:
        raise SparsemmError("--vocab-min-count must be >= 0 (0 keeps the full vocabulary)")
    cache = args.cache or args.out / "features"
    with torch_threads(1):
        data = lexlip_data(
            col, col.split_mask(args.split), kind, cache, progress=not args.no_progress
        )
        base = LexLIPConfig(
            image_input=kind,
            frozen_layers=args.frozen_layers,
            max_text_len=args.max_text_len,
            queue_size=args.queue_size,
            tau=args.tau,
            flops_weight=args.flops_weight,
            momentum=args.momentum,
            seed=args.seed,
        )
        config, vocab = build_config(data, base, args.vocab_min_count or None)
        tc = LexLIPTrainConfig(
            pretrain_steps=args.pretrain_steps,
            contrastive_steps=args.contrastive_steps,
            batch_size=args.batch_size,
            lr=args.lr,
            new_lr=args.new_lr,
            seed=args.seed,
            captions_per_item=args.captions_per_item or None,
        )
        _, hist = train_lexlip(
            data,
            config,
            vocab,
            args.out,
            tc,
            resume=args.resume,
            progress=not args.no_progress,
        )
    last = hist[-1] if hist else {}
    print(
        f"trained LexLIP ({kind} patches, lexicon {config.lexicon_size} pieces) on "
        f"{data.n_items} items / {len(data.captions)} captions -> {args.out} "
        f"(last loss {last.get('loss', float('nan')):.4f})"
    )
    return 0
