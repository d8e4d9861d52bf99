"""``sparsemm train sr``: train the SR model on a collection's (image, caption) pairs, and its
concept detectors (``sparsemm train detectors`` adds them to a model trained without).

The saved model records the training collection's image and text encoders (config.json's
``training`` entry, :func:`sparsemm.models.base.encoder_record`), so ``sparsemm index`` and
``sparsemm search`` refuse a collection from other encoders.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparsemm.cli.plugins import TRAIN_GROUP, registrars

if TYPE_CHECKING:
    from sparsemm.models.detectors import ConceptDetectors

# The library (torch, the models) is imported inside each verb, so that building the
# parser for `sparsemm --help` or another verb stays fast.

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a sparse model on a collection")
    models = p.add_subparsers(dest="model", metavar="MODEL", required=True)
    sr = models.add_parser(
        "sr",
        help="SR: linear sparse codes masked by SPINE caption bias OR top-k",
        description="Train SR on every (image, caption) pair of a split. The SPINE sentence "
        "bias of each caption ORs into the top-k mask of its codes during training.",
    )
    sr.add_argument("collection", type=Path, help="collection folder (sparsemm encode)")
    sr.add_argument("-o", "--out", type=Path, required=True, help="model output folder")
    sr.add_argument("--spine", type=Path, help="SPINE folder (sparsemm spine train)")
    sr.add_argument("--no-bias", action="store_true", help="ablation: top-k mask only")
    sr.add_argument(
        "--split", default="train", help="items used for training (default train; 'all': every)"
    )
    sr.add_argument("--latent-dim", type=int, default=1000)
    sr.add_argument("--top-k", type=int, default=64)
    sr.add_argument("--activation", choices=("relu", "none"), default="relu")
    sr.add_argument("--tau", type=float, default=0.05)
    sr.add_argument("--lambda", dest="lam", type=float, default=1.0, help="contrastive weight")
    sr.add_argument(
        "--per-modality",
        action="store_true",
        help="separate encoders for images and texts (unaligned backbones)",
    )
    sr.add_argument("--epochs", type=int, default=20)
    sr.add_argument("--batch-size", type=int, default=256)
    sr.add_argument("--lr", type=float, default=1e-3)
    sr.add_argument("--seed", type=int, default=0)
    sr.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    sr.add_argument("--no-progress", action="store_true")
    sr.add_argument(
        "--no-detectors",
        action="store_true",
        help="skip the concept detectors (added later with `sparsemm train detectors`)",
    )
    _detector_args(sr)
    sr.set_defaults(func=run_sr)

    de = models.add_parser(
        "detectors",
        help="fit a trained SR model's concept detectors (one per caption word / label)",
        description="Fit one logistic regression per vocabulary term (caption words, frequent "
        "two-word names, labels) over the model's codes of a split's items, and save them in "
        "the model folder (detectors.safetensors + detectors.json). The served scorer uses "
        "them instead of fitting detectors at query time.",
    )
    de.add_argument("model", type=Path, help="SR model folder (sparsemm train sr)")
    de.add_argument("collection", type=Path, help="collection with captions and/or labels")
    de.add_argument("--split", default="train", help="items used (default train; 'all': every)")
    _detector_args(de)
    de.add_argument("--no-progress", action="store_true")
    de.set_defaults(func=run_detectors)

    # align, vdr, lexlip: sparsemm_experiments
    for register_model in registrars(TRAIN_GROUP):
        register_model(models)


def _detector_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-mentions", type=int, default=10, help="items a term needs (default 10)")
    p.add_argument("--max-terms", type=int, default=4000, help="vocabulary size (default 4000)")
    p.add_argument("--no-bigrams", action="store_true", help="single words and labels only")


def _fit_detectors(
    model: Any, col: Any, split: str, args: argparse.Namespace, out: Path
) -> ConceptDetectors:
    """Fit and save ``model``'s detectors on the items of ``split`` ("all": every item)."""
    from sparsemm.models.detectors import DetectorConfig
    from sparsemm.train.detectors import fit_model_detectors

    cfg = DetectorConfig(
        min_mentions=args.min_mentions, max_terms=args.max_terms, bigrams=not args.no_bigrams
    )
    return fit_model_detectors(model, out, col, split, cfg, progress=not args.no_progress)


def run_detectors(args: argparse.Namespace) -> int:
    from sparsemm.data.collection import open_collection
    from sparsemm.models.base import check_encoders
    from sparsemm.models.sr import SRModel

    model = SRModel.from_pretrained(args.model)
    col = open_collection(args.collection)
    check_encoders(model.training_info, col.manifest, args.model, args.collection)
    det = _fit_detectors(model, col, args.split, args, args.model)
    print(f"fitted {len(det)} concept detectors ({args.split} split) -> {args.model}")
    return 0


def run_sr(args: argparse.Namespace) -> int:
    from sparsemm.data.collection import open_collection
    from sparsemm.errors import SparsemmError
    from sparsemm.train.sr import SRTrainConfig, train_sr_on_collection
    from sparsemm.words.spine import SparseWordVectors

    if args.spine is None and not args.no_bias:
        raise SparsemmError("pass --spine DIR (a trained SPINE) or --no-bias for the ablation")
    col = open_collection(args.collection)
    vectors = None if args.no_bias else SparseWordVectors.load(args.spine)
    tc = SRTrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    model, hist, n_items, n_captions = train_sr_on_collection(
        col,
        args.out,
        vectors,
        split=args.split,
        latent_dim=args.latent_dim,
        top_k=args.top_k,
        tau=args.tau,
        train=tc,
        resume=args.resume,
        progress=not args.no_progress,
        shared=not args.per_modality,
        activation=args.activation,
        contrastive_weight=args.lam,
    )
    n_detectors = 0
    if not args.no_detectors:
        try:
            n_detectors = len(_fit_detectors(model, col, args.split, args, args.out))
        except SparsemmError as exc:  # a tiny or captionless collection: serve without
            log.warning("no concept detectors saved: %s", exc)
    last = hist[-1] if hist else {}
    print(
        f"trained SR on {n_items} items / {n_captions} captions -> {args.out} "
        f"(loss {last.get('loss', float('nan')):.4f}, nce {last.get('nce', float('nan')):.4f}; "
        f"{n_detectors} concept detectors)"
    )
    return 0
