"""``sparsemm bench vdr``: VDR's offline runs and ablations, one report folder.

Examples::

    sparsemm bench vdr -o runs/vdr-bench --proxy runs/demo/collection --proxy-sr runs/demo/sr \\
        --collages runs/collages-demo/collection
    sparsemm bench vdr -o /tmp/vdr-quick --quick
    sparsemm bench vdr -o runs/vdr-quick --quick --check   # ... against expected figures

Without ``--proxy`` / ``--collages`` the default collections (``runs/demo/collection``,
``runs/collages-demo/collection``) are used when present. ``--quick`` encodes its own tiny
caption-proxy collection in OUT (120 COCO images), trains for two steps and skips the
collages unless ``--collages`` is given. Trained models, codes, spatial features and the
collage aligner are cached in OUT and reused.
Registered into ``sparsemm bench`` by :func:`register_bench`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError

log = logging.getLogger(__name__)

DEFAULT_PROXY = Path("runs/demo/collection")
DEFAULT_COLLAGES = Path("runs/collages-demo/collection")
QUICK_COCO_ITEMS = 120


def register_bench(benches: argparse._SubParsersAction) -> None:
    """Add ``vdr`` to the sub-parsers of ``sparsemm bench``."""
    p = benches.add_parser(
        "vdr",
        help="VDR offline runs: exclusion + retrieval vs dense/SR, k and BoW ablations",
        description="Train VDR (MiniLM-initialised, vocabulary-space codes) on the COCO "
        "caption-proxy and the Fashion-MNIST collages, then report the exclusion benchmark "
        "(the SR paper's multi-step method and the other sparse strategies, dense "
        "baselines, SR when given), image-text retrieval, effectiveness vs active "
        "dimensions k, the bag-of-words entry on vs off (laziness check: word clouds and "
        "box plots) and explained index searches.",
    )
    p.add_argument("-o", "--out", type=Path, required=True, help="report folder")
    p.add_argument("--proxy", type=Path, help=f"caption-proxy collection (default {DEFAULT_PROXY})")
    p.add_argument(
        "--collages", type=Path, help=f"collage collection with images (default {DEFAULT_COLLAGES})"
    )
    p.add_argument("--no-proxy", action="store_true", help="skip the caption-proxy")
    p.add_argument("--no-collages", action="store_true", help="skip the collages")
    p.add_argument("--proxy-sr", type=Path, help="SR model on the proxy (adds SR rows)")
    p.add_argument("--collages-sr", type=Path, help="SR model on the collages (adds SR rows)")
    p.add_argument(
        "--collages-align",
        type=Path,
        help="dense baseline for the collages (sparsemm train align); default: trained in OUT",
    )
    p.add_argument("--data", type=Path, help="folder with coco/val2017.json (--quick only)")
    p.add_argument("--init", type=Path, help="BERT folder to start from (default MiniLM)")
    p.add_argument("--steps", type=int, default=None, help="training steps per model")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--top-k", type=int, default=None, help="main active dims (default 512)")
    p.add_argument("--no-bow-ablation", action="store_true", help="skip the no-BoW model")
    p.add_argument("--no-zero-shot", action="store_true", help="skip the untrained model")
    p.add_argument(
        "--methods",
        nargs="+",
        metavar="METHOD",
        help="exclusion strategies of the main runs (default: dense baselines, code_a, "
        "paper, code_arith)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"CI-sized run: {QUICK_COCO_ITEMS} COCO images, 2 training steps, tiny grids",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--check",
        action="store_true",
        help="then compare metrics.json with the preset's expected figures "
        "(presets/vdr[_quick].expected.json): a table, exit 1 on a miss",
    )
    p.set_defaults(func=run)


def _text_encoder(name: str, model_id: Any) -> Any:
    from sparsemm.encoders.base import get_encoder

    kwargs = {}
    if model_id and Path(str(model_id)).expanduser().is_dir():
        kwargs["model"] = model_id
    return get_encoder(name, **kwargs)


def _quick_proxy(args: argparse.Namespace) -> Any:
    from sparsemm.data.encode import encode_source
    from sparsemm_experiments.data.paths import coco_json, default_data_dir

    src = coco_json(args.data or default_data_dir())
    return encode_source(
        src,
        args.out / "quick-coco",
        format="coco",
        encoder="minilm",
        limit=QUICK_COCO_ITEMS,
        progress=not args.no_progress,
    )


def _pick(given: Path | None, default: Path, skip: bool, what: str) -> Path | None:
    if skip:
        return None
    if given is not None:
        if not (given / "manifest.json").is_file():
            raise SparsemmError(f"{given} is not a collection folder ({what})")
        return given
    if (default / "manifest.json").is_file():
        return default
    log.warning("no %s collection at %s: skipping it (pass --%s)", what, default, what)
    return None


def _proxy_spec(col: Any, args: argparse.Namespace) -> dict[str, Any]:
    from sparsemm_experiments.data.patches import proxy_patches
    from sparsemm_experiments.vdr_runs import PROXY_EXAMPLES

    patches, mask = proxy_patches(col)
    spec: dict[str, Any] = {
        "collection": col,
        "text_encoder": _text_encoder(col.encoder_name, col.manifest["encoder"].get("model")),
        "patches": patches,
        "patch_mask": mask,
        "examples": PROXY_EXAMPLES,
        "leave_one_out": True,
        "info": {
            "collection": str(col.root),
            "image_side": "caption embeddings (proxy), own caption hidden in training",
        },
    }
    if args.proxy_sr is not None:
        from sparsemm.models.sr import SRModel

        spec["sr_model"] = SRModel.from_pretrained(args.proxy_sr)
        spec["info"]["sr"] = str(args.proxy_sr)
    return spec


def _collage_spec(col: Any, args: argparse.Namespace) -> dict[str, Any]:
    from sparsemm_experiments.data.patches import collage_patches
    from sparsemm_experiments.models.lit import AlignConfig, AlignedTextEncoder, LinearAligner
    from sparsemm_experiments.train.vdr import adapter_ridge_init
    from sparsemm_experiments.vdr_runs import COLLAGE_EXAMPLES

    raw = _text_encoder(
        col.text_encoder_name,
        col.manifest.get("text_encoder", col.manifest["encoder"]).get("model"),
    )
    patches = collage_patches(col, args.out / "collages" / "spatial", progress=not args.no_progress)
    if args.collages_align is not None:
        aligner = LinearAligner.from_pretrained(args.collages_align)
    else:
        from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection
        from sparsemm_experiments.train.lit import train_aligner

        image, text, pair_item, _ = sr_pairs_from_collection(col, col.split_mask("train"), None)
        aligner, _ = train_aligner(
            image,
            text,
            pair_item,
            AlignConfig(image_dim=image.shape[1], text_dim=text.shape[1], dim=512, tau=0.05),
            args.out / "collages" / "align",
            SRTrainConfig(epochs=2 if args.quick else 20, seed=args.seed),
            resume=True,
            progress=not args.no_progress,
        )
    spec: dict[str, Any] = {
        "collection": col,
        "text_encoder": AlignedTextEncoder(raw, aligner),
        "patches": patches,
        "patch_mask": None,
        "adapter_init": adapter_ridge_init(col, patches),
        "dense_items": aligner.encode_image(col.image_embeddings()),
        "dense_texts": aligner.encode_text_features(col.text_embeddings()),
        "examples": COLLAGE_EXAMPLES,
        "info": {
            "collection": str(col.root),
            "image_side": "EfficientNet-Lite0 7x7 spatial features",
            "dense": "linear alignment of EfficientNet-Lite0 and MiniLM (LiT-style)",
            "align": str(args.collages_align or args.out / "collages" / "align"),
        },
    }
    if args.collages_sr is not None:
        from sparsemm.models.sr import SRModel

        spec["sr_model"] = SRModel.from_pretrained(args.collages_sr)
        spec["info"]["sr"] = str(args.collages_sr)
    return spec


def run(args: argparse.Namespace) -> int:
    from sparsemm.data.collection import open_collection
    from sparsemm.runtime import torch_threads
    from sparsemm_experiments.vdr_runs import QUICK, VDRRunConfig, run_vdr_bench

    preset = "vdr_quick" if args.quick else "vdr"
    if args.check:
        from sparsemm_experiments.expected import start_check

        start_check(
            preset,
            {
                "--steps": args.steps is not None,
                "--batch-size": args.batch_size is not None,
                "--top-k": args.top_k is not None,
                "--methods": bool(args.methods),
                "--init": args.init is not None,
                "--no-bow-ablation": args.no_bow_ablation,
                "--no-zero-shot": args.no_zero_shot,
                "--seed": args.seed != 0,
            },
        )
    cfg = VDRRunConfig(**QUICK) if args.quick else VDRRunConfig()
    changes: dict[str, Any] = {"seed": args.seed, "ablate_bow": not args.no_bow_ablation}
    if args.no_zero_shot:
        changes["zero_shot"] = False
    if args.methods:
        from sparsemm.query.strategies import get_spec

        for m in args.methods:
            get_spec(m)
        changes["methods"] = tuple(args.methods)
    for name in ("steps", "batch_size", "top_k"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.init is not None:
        changes["init"] = str(args.init)
    cfg = dataclasses.replace(cfg, **changes)
    datasets: dict[str, dict[str, Any]] = {}
    with torch_threads(1):
        if args.quick and args.proxy is None:
            proxy = None if args.no_proxy else _quick_proxy(args)
        else:
            path = _pick(args.proxy, DEFAULT_PROXY, args.no_proxy, "proxy")
            proxy = None if path is None else open_collection(path)
        if args.quick and args.collages is None:
            collages = None  # quick runs cover the proxy unless --collages is given
        else:
            path = _pick(args.collages, DEFAULT_COLLAGES, args.no_collages, "collages")
            collages = None if path is None else open_collection(path)
        if proxy is not None:
            datasets["proxy"] = _proxy_spec(proxy, args)
        if collages is not None:
            datasets["collages"] = _collage_spec(collages, args)
    if not datasets:
        raise SparsemmError("no collection to run on; pass --proxy and/or --collages")
    metrics = run_vdr_bench(args.out, datasets, cfg, progress=not args.no_progress)
    print(f"report: {args.out / 'report.md'}  (metrics: {args.out / 'metrics.json'})")
    for name, res in metrics["datasets"].items():
        means = res["main"]["means"]["all"]
        ret = res["main"]["sparse_retrieval"] or {}
        parts = [f"{m} AP@10 {means[m]['ap@10']:.3f}" for m in ("code_a", "paper") if m in means]
        print(
            f"{name}: VDR t2i AP@1 {ret.get('t2i_AP@1', float('nan')):.3f}, "
            f"i2t AP@10 {ret.get('i2t_AP@10', float('nan')):.3f}; " + "; ".join(parts)
        )
    if args.check:
        from sparsemm_experiments.expected import report_check

        return report_check(preset, metrics)
    return 0
