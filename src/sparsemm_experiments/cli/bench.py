"""``sparsemm bench exclusion``: the exclusion-query benchmark (every strategy, one report).

Examples::

    sparsemm bench exclusion --data ../shared/data --collection runs/demo/collection \\
        --sr runs/demo/sr --spine runs/demo/spine -o runs/bench-exclusion
    sparsemm bench exclusion --data ../shared/data -o runs/bench-quick --quick

Without ``--collection`` the COCO file under ``--data`` is encoded (cached in OUT/collection);
without ``--sr`` an SR model is trained on the tune split (cached in OUT/sr).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from sparsemm.cli.plugins import BENCH_GROUP, registrars
from sparsemm.errors import SparsemmError

log = logging.getLogger(__name__)

QUICK_ITEMS = 250  # images read from the COCO file in --quick mode
QUICK_EVAL_ITEMS = 120  # evaluation / tune items per split in --quick mode
QUICK_GRID = 2  # grid points per strategy in --quick mode


def _default_data_dir() -> Path:
    return Path(os.environ.get("SPARSEMM_DATA", "../shared/data"))


def _strategy_name(name: str) -> str:
    """A --methods value: a registered strategy (the registry is imported only when the
    option is given, so building the parser stays fast)."""
    from sparsemm.query.strategies import STRATEGIES
    from sparsemm_experiments.baselines import cbe, strategies  # noqa: F401  (register them)

    if name not in STRATEGIES:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}"
        )
    return name


def register(sub: Any) -> None:
    """Add the ``bench`` verb (sub-command ``exclusion``) to the ``sparsemm`` parser."""
    p = sub.add_parser("bench", help="run a quality benchmark and write a report")
    kinds = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    ex = kinds.add_parser(
        "exclusion",
        help="exclusion queries 'A but not B' from item labels: every strategy, one report",
        description="Build 'A but not B' queries from the evaluation split's labels, tune every "
        "strategy's parameters on the tune split, score MRR/NDCG/AP@1,3,10, violation@10 and "
        "inclusion@10 on the evaluation split (subsets all and hard, paired t-tests against "
        "the dense baselines), plus image-text retrieval AP@1/5/10 of dense vs sparse codes.",
    )
    ex.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder holding coco/val2017.json (default $SPARSEMM_DATA or ../shared/data); "
        "encoded when --collection is not given",
    )
    ex.add_argument("--collection", type=Path, help="collection folder (sparsemm encode)")
    ex.add_argument("--sr", type=Path, help="trained SR model folder (sparsemm train sr)")
    ex.add_argument(
        "--spine", type=Path, help="SPINE folder or its vectors/ folder (query bias masks)"
    )
    ex.add_argument(
        "--methods",
        nargs="+",
        type=_strategy_name,
        metavar="METHOD",
        help="strategies to run (default all; sparsemm search --list-strategies names them)",
    )
    ex.add_argument("--split", default="test", help="evaluation split (default test)")
    ex.add_argument(
        "--tune-split",
        default="train",
        help="split the parameters are tuned on (default train; 'none': registry defaults)",
    )
    ex.add_argument(
        "--query-mask",
        choices=("topk", "topk_or_bias"),
        default="topk",
        help="SR mask for query texts: top-k, or top-k OR the query's SPINE bias (--spine)",
    )
    ex.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="SR top-k for item and query codes (default: the model's top_k)",
    )
    ex.add_argument("-o", "--out", type=Path, required=True, help="report folder")
    ex.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: first {QUICK_ITEMS} COCO images when encoding, "
        f"{QUICK_EVAL_ITEMS} items per split, {QUICK_GRID} grid points per strategy, "
        "a 2-epoch SR when none is given",
    )
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument(
        "--captions-only",
        action="store_true",
        help="detectors learn from the reference captions only (default: the reference "
        "items' labels count as mentions too)",
    )
    ex.add_argument("--no-progress", action="store_true")
    ex.set_defaults(func=run_exclusion)
    _register_negation(kinds)
    for register_bench in registrars(BENCH_GROUP):  # paper, vdr, lexlip (sparsemm_experiments)
        register_bench(kinds)


def _load_vectors(path: Path) -> Any:
    from sparsemm.words.spine import SparseWordVectors

    for cand in (path / "vectors", path):
        if (cand / "manifest.json").is_file():
            return SparseWordVectors.load(cand)
    raise SparsemmError(f"{path} holds no SPINE vectors; pass the SPINE folder or its vectors/")


def _train_sr(col: Any, split: str, vectors: Any, out: Path, quick: bool, seed: int) -> Any:
    from sparsemm.models.sr import SRConfig
    from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection, train_sr

    if vectors is not None and quick:
        vectors = None  # the quick run skips the bias (SPINE dims need not match)
    mask = col.split_mask(split)
    image, text, pair_item, bias = sr_pairs_from_collection(col, mask, vectors)
    latent = vectors.dim if vectors is not None else (128 if quick else 1000)
    cfg = SRConfig(
        text_dim=text.shape[1],
        image_dim=image.shape[1],
        latent_dim=latent,
        top_k=16 if quick else 64,
    )
    tc = SRTrainConfig(epochs=2 if quick else 20, seed=seed)
    log.info("no --sr given: training SR on the %s split into %s", split, out)
    model, _ = train_sr(image, text, pair_item, bias, cfg, out, tc, resume=True, progress=False)
    from sparsemm_experiments.train.detectors import ensure_model_detectors

    try:  # what `sparsemm train sr` saves with a model, and the served default reads
        ensure_model_detectors(model, out, col, split)
    except SparsemmError as exc:
        log.warning("no concept detectors for the trained SR model: %s", exc)
    return model


def _register_negation(kinds: Any) -> None:
    ng = kinds.add_parser(
        "negation",
        help="sentences with negation ('a kitchen, but there is no chair in sight'): "
        "parse exact match, R@1/5/10 and neg-violation@5 of every strategy",
        description="Join evaluation captions with the negation of an object their image does "
        "not carry, in 34 phrasing families (20 for tuning, 14 held out); score the parser "
        "(exact match), dense on the raw sentence, dense on the caption without its negation, "
        "the parsed query through every strategy and the served default.",
    )
    ng.add_argument("--data", type=Path, default=None, help="folder holding coco/val2017.json")
    ng.add_argument("--collection", type=Path, help="collection folder (sparsemm encode)")
    ng.add_argument("--sr", type=Path, help="trained SR model folder (sparsemm train sr)")
    ng.add_argument(
        "--methods", nargs="+", type=_strategy_name, metavar="METHOD",
        help="strategies to run on the parsed queries (default all)",
    )  # fmt: skip
    ng.add_argument("--split", default="test", help="evaluation split (default test)")
    ng.add_argument(
        "--tune-split", default="train",
        help="split of the detectors' reference captions and of --tune (default train)",
    )  # fmt: skip
    ng.add_argument(
        "--tune", action="store_true",
        help="also grid-search the served scorer on the tune split of both benchmarks",
    )  # fmt: skip
    ng.add_argument("--per-item", type=int, default=2, help="sentences per evaluation image")
    ng.add_argument("--top-k", type=int, default=None, help="SR top-k (default: the model's)")
    ng.add_argument("-o", "--out", type=Path, required=True, help="report folder")
    ng.add_argument("--quick", action="store_true", help="smoke run (as bench exclusion)")
    ng.add_argument("--seed", type=int, default=0)
    ng.add_argument(
        "--captions-only",
        action="store_true",
        help="detectors learn from the reference captions only (default: labels count too)",
    )
    ng.add_argument("--no-progress", action="store_true")
    ng.set_defaults(func=run_negation)


def _collection_model(
    args: argparse.Namespace, tune: str | None, vectors: Any = None
) -> tuple[Any, Any, Any]:
    """(collection, text encoder, SR model) of a bench run: given or built (cached in OUT);
    a model trained here uses the SPINE ``vectors`` for its bias when given."""
    from sparsemm.data.collection import open_collection
    from sparsemm.data.encode import encode_source
    from sparsemm.encoders.base import get_encoder
    from sparsemm.models.sr import SRModel
    from sparsemm_experiments.data.paths import coco_json

    out: Path = args.out
    if args.collection is not None:
        col = open_collection(args.collection)
        model_id = col.manifest.get("encoder", {}).get("model")
        kwargs = {}
        if model_id and Path(str(model_id)).expanduser().is_dir():
            kwargs["model"] = model_id
        encoder = get_encoder(col.encoder_name, **kwargs)
    else:
        src = coco_json(args.data or _default_data_dir())
        encoder = get_encoder("minilm")
        col = encode_source(
            src,
            out / "collection",
            format="coco",
            encoder=encoder,
            limit=QUICK_ITEMS if args.quick else None,
            progress=not args.no_progress,
        )
    if args.sr is not None:
        model = SRModel.from_pretrained(args.sr)
    else:
        model = _train_sr(col, tune or "train", vectors, out / "sr", args.quick, args.seed)
    return col, encoder, model


def _model_detectors(args: argparse.Namespace) -> Any:
    """The SR model's own concept detectors when it has them (what search serves with)."""
    from sparsemm.models.detectors import ConceptDetectors, has_detectors

    model_dir = args.sr if args.sr is not None else args.out / "sr"
    return ConceptDetectors.for_model(model_dir) if has_detectors(model_dir) else None


def run_negation(args: argparse.Namespace) -> int:
    from sparsemm.query.strategies import sr_query_coder
    from sparsemm_experiments.eval.negation import SERVED, NegationConfig, run_negation_bench

    out: Path = args.out
    tune = None if str(args.tune_split).lower() == "none" else args.tune_split
    if args.per_item < 1:
        raise SparsemmError(f"--per-item must be at least 1, got {args.per_item}")
    col, encoder, model = _collection_model(args, tune)
    cfg = NegationConfig(
        split=args.split,
        tune_split=tune,
        methods=tuple(args.methods or ()),
        per_item=args.per_item,
        limit_items=QUICK_EVAL_ITEMS if args.quick else None,
        tune=bool(args.tune),
        max_grid=QUICK_GRID if args.quick else None,
        seed=args.seed,
        label_targets=not args.captions_only,
    )
    info = {
        "sr": str(args.sr) if args.sr is not None else str(out / "sr"),
        "top_k": args.top_k or model.config.inference_top_k or model.config.top_k,
        "quick": bool(args.quick),
    }
    top_k = info["top_k"]
    content = run_negation_bench(
        col,
        out,
        encoder,
        item_coder=lambda x: model.encode(x, "image", top_k=top_k),
        query_coder=sr_query_coder(model, top_k=top_k),
        config=cfg,
        run_info=info,
        detectors=_model_detectors(args),
    )
    print(f"report: {out / 'report.md'}  (metrics: {out / 'metrics.json'})")
    for sub in ("tune families", "held-out families"):
        means = content["subsets"][sub]["means"]
        row = means.get(SERVED) or next(iter(means.values()))
        print(
            f"{sub}: {content['subsets'][sub]['n_queries']} sentences; served default R@5 "
            f"{row['recall@5']:.3f}, neg-violation@5 {row['violation@5']:.3f}; parse exact "
            f"match {content['parse']['exact_match'].get(sub, float('nan')):.3f}"
        )
    return 0


def run_exclusion(args: argparse.Namespace) -> int:
    from sparsemm.query.strategies import sr_query_coder
    from sparsemm_experiments.eval.bench import BenchConfig, run_exclusion_bench

    out: Path = args.out
    tune = None if str(args.tune_split).lower() == "none" else args.tune_split
    vectors = _load_vectors(args.spine) if args.spine is not None else None
    col, encoder, model = _collection_model(args, tune, vectors)
    if vectors is not None and vectors.dim != model.config.latent_dim:
        log.warning(
            "SPINE vectors have %d dims but the SR model %d; ignoring --spine",
            vectors.dim,
            model.config.latent_dim,
        )
        vectors = None
    if args.query_mask == "topk_or_bias" and vectors is None:
        raise SparsemmError("--query-mask topk_or_bias needs --spine with the SR model's dims")

    cfg = BenchConfig(
        split=args.split,
        tune_split=tune,
        methods=tuple(args.methods or ()),
        limit_items=QUICK_EVAL_ITEMS if args.quick else None,
        max_grid=QUICK_GRID if args.quick else None,
        seed=args.seed,
        label_targets=not args.captions_only,
    )
    info = {
        "sr": str(args.sr) if args.sr is not None else str(out / "sr"),
        "sr_config": {k: v for k, v in vars(model.config).items()},
        "spine": str(args.spine) if args.spine is not None else None,
        "query_mask": args.query_mask,
        "top_k": args.top_k or model.config.top_k,
        "quick": bool(args.quick),
        "sparse_model_name": f"SR (top-{args.top_k or model.config.top_k} of "
        f"{model.config.latent_dim})",
    }
    content = run_exclusion_bench(
        col,
        out,
        encoder,
        item_coder=lambda x: model.encode(x, "image", top_k=args.top_k),
        query_coder=sr_query_coder(model, vectors, mask=args.query_mask, top_k=args.top_k),
        word_vectors=vectors,
        config=cfg,
        run_info=info,
        detectors=_model_detectors(args),
    )
    means = content["subsets"]["all"]["means"]
    best = max(means, key=lambda m: means[m]["ap@10"])
    print(f"report: {out / 'report.md'}  (metrics: {out / 'metrics.json'})")
    print(
        f"{content['subsets']['all']['n_queries']} queries; best AP@10 (all): {best} "
        f"{means[best]['ap@10']:.3f}, violation@10 {means[best]['violation@10']:.3f}"
    )
    return 0
