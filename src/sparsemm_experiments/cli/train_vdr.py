"""``sparsemm train vdr``: train a VDR bi-encoder (vocabulary-space codes).

Examples::

    # cross-modal on a collection: captions vs the items' patch features
    sparsemm train vdr runs/demo/collection -o runs/vdr --steps 120
    sparsemm train vdr runs/collages-demo/collection -o runs/vdr-collages --image-input spatial
    # text-to-text on a JSONL of {"query", "document", "hard_negatives": [...]} rows
    sparsemm train vdr pairs.jsonl --mode t2t -o runs/vdr-t2t --hard-negatives 1

Registered into ``sparsemm train`` by :func:`register_model`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError

log = logging.getLogger(__name__)


def register_model(models: argparse._SubParsersAction) -> None:
    """Add ``vdr`` to the model sub-parsers of ``sparsemm train``."""
    p = models.add_parser(
        "vdr",
        help="VDR: codes over the BERT vocabulary (elu1p, max-pool, top-k OR bag-of-words)",
        description="Train VDR from a pretrained BERT (default: the packaged "
        "all-MiniLM-L6-v2) with VDR's in-batch contrastive objective and its bag-of-words "
        "entry. Cross-modal: captions vs the items' patch features (a caption-proxy "
        "collection's caption embeddings, or EfficientNet spatial features of a collection "
        "with images). Text-to-text: a JSONL file of query/document pairs.",
    )
    p.add_argument("source", type=Path, help="collection folder (cross) or pairs JSONL (t2t)")
    p.add_argument("-o", "--out", type=Path, required=True, help="model output folder")
    p.add_argument("--mode", choices=("cross", "t2t"), default="cross")
    p.add_argument(
        "--image-input",
        choices=("auto", "captions", "spatial"),
        default="auto",
        help="cross-modal item side: the items' caption embeddings (caption-proxy) or "
        "EfficientNet-Lite0 7x7 spatial features (collections with images; cached in OUT)",
    )
    p.add_argument("--init", type=Path, help="BERT model folder to start from (default MiniLM)")
    p.add_argument("--split", default="train", help="items used for training (default train)")
    p.add_argument("--steps", type=int, default=120, help="training updates (CPU: minutes)")
    p.add_argument("--epochs", type=int, default=1, help="passes over the pairs (capped by steps)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=None, help="default: VDR's (2e-4 / 2e-5 t2t)")
    p.add_argument("--new-params-lr", type=float, default=1e-3)
    p.add_argument("--freeze-layers", type=int, default=3)
    p.add_argument("--top-k", type=int, default=None, help="default: 512 cross, 768 t2t")
    p.add_argument("--no-bow", action="store_true", help="ablation: no bag-of-words entry")
    p.add_argument("--hard-negatives", type=int, default=0, help="t2t: negatives per query")
    p.add_argument("--max-length", type=int, default=None, help="default: 77 cross, 256 t2t")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_vdr)


def _cross_data(args: argparse.Namespace) -> tuple[Any, Any]:
    import numpy as np

    from sparsemm.data.collection import open_collection
    from sparsemm_experiments.data.patches import collage_patches, proxy_patches
    from sparsemm_experiments.train.vdr import adapter_ridge_init, cross_modal_data

    col = open_collection(args.source)
    kind = args.image_input
    if kind == "auto":
        kind = "captions" if col.manifest.get("image_kind") == "caption_view" else "spatial"
    init = None
    if kind == "captions":
        patches, mask = proxy_patches(col)
    else:
        patches = collage_patches(col, args.out / "spatial", progress=not args.no_progress)
        mask = None
        init = adapter_ridge_init(col, patches)
    data = cross_modal_data(col, args.split, patches, mask, leave_one_out=kind == "captions")
    log.info("%d (caption, item) pairs; item side %s %s", len(data), kind, patches.shape)
    return data, (init, np.asarray(patches.shape))


def _t2t_data(path: Path) -> Any:
    from sparsemm.io import read_jsonl
    from sparsemm_experiments.train.vdr import TextPairData

    rows = read_jsonl(path)
    if not rows or any("query" not in r or "document" not in r for r in rows):
        raise SparsemmError(f"{path}: every row needs 'query' and 'document' strings")
    negs = [list(r.get("hard_negatives") or []) for r in rows]
    return TextPairData(
        [str(r["query"]) for r in rows],
        [str(r["document"]) for r in rows],
        negs if any(negs) else None,
    )


def run_vdr(args: argparse.Namespace) -> int:
    import torch

    from sparsemm.runtime import torch_threads
    from sparsemm.train.checkpoint import has_checkpoint
    from sparsemm_experiments.models.vdr import VDRModel, fast_bf16_available
    from sparsemm_experiments.train.vdr import VDR_PRESETS, preset_train_config, train_vdr

    preset = VDR_PRESETS[args.mode]
    top_k = args.top_k or preset["top_k"]
    overrides = {
        "bow": not args.no_bow,
        "text_top_k": top_k,
        "image_top_k": top_k,
        "normalize": preset["normalize"],
        "max_length": args.max_length or preset["max_length"],
    }
    init = None
    if args.mode == "cross":
        data, (init, shape) = _cross_data(args)
        image_dim: int | None = int(shape[2])
    else:
        data, image_dim = _t2t_data(args.source), None
    if args.init is not None:
        model = VDRModel.from_bert(args.init, image_dim=image_dim, **overrides)
    else:
        model = VDRModel.from_minilm(image_dim=image_dim, **overrides)
    if fast_bf16_available():
        model.head_dtype = torch.bfloat16
    tc = preset_train_config(
        args.mode,
        epochs=args.epochs,
        max_steps=args.steps,
        batch_size=args.batch_size,
        new_params_lr=args.new_params_lr,
        freeze_layers=args.freeze_layers,
        seed=args.seed,
        **({"lr": args.lr} if args.lr else {}),
    )
    with torch_threads(1):
        if not (args.resume and has_checkpoint(args.out)):
            if init is not None and model.image_adapter is not None:
                w, b = init
                with torch.no_grad():
                    model.image_adapter.weight.copy_(torch.from_numpy(w.T.copy()))
                    model.image_adapter.bias.copy_(torch.from_numpy(b))
            if args.mode == "cross":
                n = min(512, len(data))
                items = sorted(set(data.pair_item[:n].tolist()))
                mask = None if data.patch_mask is None else data.patch_mask[items]
                model.calibrate(data.texts[:n], data.patches[items], mask, rank=top_k)
            else:
                model.calibrate(data.queries[:512], rank=top_k)
        _, hist = train_vdr(
            model,
            data,
            args.out,
            tc,
            resume=args.resume,
            progress=not args.no_progress,
            hard_negatives=args.hard_negatives,
        )
    last = hist[-1] if hist else {}
    loss, acc = last.get("loss", float("nan")), last.get("acc", float("nan"))
    print(
        f"trained VDR ({args.mode}) on {len(data)} pairs -> {args.out} "
        f"(loss {loss:.4f}, in-batch acc {acc:.3f})"
    )
    return 0
