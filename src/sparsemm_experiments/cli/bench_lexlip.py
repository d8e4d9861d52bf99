"""``sparsemm bench lexlip``: LexLIP's offline runs (COCO proxy, collages, large-scale pool).

Examples::

    sparsemm bench lexlip -o runs/lexlip --collection runs/demo/collection \\
        --collages runs/collages-demo/collection
    sparsemm bench lexlip -o /tmp/lexlip-quick --quick
    sparsemm bench lexlip -o runs/lexlip-quick --quick --check   # ... against expected figures

Without ``--collection`` the COCO file under ``--data`` is encoded with MiniLM (cached in
OUT/coco-collection); without ``--collages`` a collage collection is built (cached in
OUT/collages-build). Trained models are cached in OUT/<setting>/model and reused when the
settings and data match. Registered into ``sparsemm bench`` by :func:`register_bench`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

QUICK_COCO_ITEMS = 80  # COCO images read in --quick mode
QUICK_COLLAGES = (16, 12)  # train / test collages built in --quick mode
FULL_COLLAGES = (1000, 250)  # built when no --collages is given


def register_bench(benches: argparse._SubParsersAction) -> None:
    """Add ``lexlip`` to the sub-parsers of ``sparsemm bench``."""
    p = benches.add_parser(
        "lexlip",
        help="LexLIP offline runs: retrieval, exclusion and large-scale tables vs Dense and BM25",
        description="Train LexLIP on the COCO caption-proxy and on Fashion-MNIST collages "
        "(or reuse cached models), then report test retrieval, 'A but not B' exclusion "
        "queries (LexLIP lexicon codes, its Dense variant, BM25 over captions), a "
        "large-scale pool (every val2017 item plus the collages; inverted index vs dense "
        "brute force latency and size) and a validated Anserini / rank_features export.",
    )
    p.add_argument("-o", "--out", type=Path, required=True, help="report folder")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder holding coco/val2017.json (default $SPARSEMM_DATA or ../shared/data)",
    )
    p.add_argument("--collection", type=Path, help="COCO caption-proxy collection folder")
    p.add_argument("--collages", type=Path, help="collage collection folder (with images)")
    p.add_argument("--no-coco", action="store_true", help="skip the COCO setting")
    p.add_argument("--no-collages", action="store_true", help="skip the collage setting")
    p.add_argument("--pretrain-steps", type=int, default=None, help="phase-1 steps, both settings")
    p.add_argument(
        "--contrastive-steps", type=int, default=None, help="phase-2 steps, both settings"
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="METHOD",
        help="exclusion strategies (default: dense_a slq avg_emb avg_emb_0.5 code_a "
        "code_arith penalty)",
    )
    p.add_argument(
        "--with-detectors",
        action="store_true",
        help="also run the caption-word detector strategies (minutes per setting)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"CI-sized run: {QUICK_COCO_ITEMS} COCO images, {sum(QUICK_COLLAGES)} collages, "
        "a few training steps, tiny grids",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--check",
        action="store_true",
        help="then compare metrics.json with the preset's expected figures "
        "(presets/lexlip[_quick].expected.json): a table, exit 1 on a miss",
    )
    p.set_defaults(func=run)


def _coco_collection(args: argparse.Namespace) -> Any:
    from sparsemm.data.collection import open_collection
    from sparsemm.data.encode import encode_source
    from sparsemm_experiments.data.paths import coco_json, default_data_dir
    from sparsemm_experiments.lexlip_runs import packaged_minilm

    if args.collection is not None:
        return open_collection(args.collection)
    src = coco_json(args.data or default_data_dir())
    return encode_source(
        src,
        args.out / "coco-collection",
        format="coco",
        encoder=packaged_minilm(),
        limit=QUICK_COCO_ITEMS if args.quick else None,
        progress=not args.no_progress,
    )


def _collage_collection(args: argparse.Namespace) -> Any:
    from sparsemm.data.collection import open_collection
    from sparsemm_experiments.lexlip_runs import build_collage_collection

    if args.collages is not None:
        return open_collection(args.collages)
    build = args.out / "collages-build"
    if (build / "collection" / "manifest.json").is_file():
        return open_collection(build / "collection")
    n_train, n_test = QUICK_COLLAGES if args.quick else FULL_COLLAGES
    log.info("no --collages given: building %d + %d collages in %s", n_train, n_test, build)
    return build_collage_collection(
        build,
        n_train,
        n_test,
        seed=args.seed,
        progress=not args.no_progress,
        features_dir=args.out / "collages" / "features",
    )


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from sparsemm.errors import SparsemmError
    from sparsemm.runtime import torch_threads
    from sparsemm_experiments.lexlip_runs import QUICK, LexLIPRunConfig, run_lexlip_bench

    if args.no_coco and args.no_collages:
        raise SparsemmError("nothing to run: --no-coco and --no-collages together")
    preset = "lexlip_quick" if args.quick else "lexlip"
    if args.check:
        from sparsemm_experiments.expected import start_check

        start_check(
            preset,
            {
                "--pretrain-steps": args.pretrain_steps is not None,
                "--contrastive-steps": args.contrastive_steps is not None,
                "--methods": bool(args.methods),
                "--seed": args.seed != 0,
            },
        )
    cfg = QUICK if args.quick else LexLIPRunConfig()
    changes: dict[str, Any] = {"seed": args.seed}
    if args.pretrain_steps is not None:
        changes["pretrain_steps"] = changes["collage_pretrain_steps"] = args.pretrain_steps
    if args.contrastive_steps is not None:
        changes["contrastive_steps"] = args.contrastive_steps
        changes["collage_contrastive_steps"] = args.contrastive_steps
    if args.methods:
        from sparsemm.query.strategies import get_spec

        for m in args.methods:
            get_spec(m)  # unknown names fail here with the list of strategies
        changes["methods"] = tuple(args.methods)
    cfg = dataclasses.replace(cfg, **changes)
    with torch_threads(1):
        coco = None if args.no_coco else _coco_collection(args)
        collages = None if args.no_collages else _collage_collection(args)
    metrics = run_lexlip_bench(
        args.out,
        coco,
        collages,
        cfg,
        with_detectors=args.with_detectors,
        progress=not args.no_progress,
        run_info={"quick": bool(args.quick)},
    )
    print(f"report: {args.out / 'report.md'}  (metrics: {args.out / 'metrics.json'})")
    for name, res in metrics["settings"].items():
        ret = res["retrieval"]
        lex = ret.get("LexLIP (lexicon, sparse)", {})
        dense = ret.get("LexLIP-Dense ([CLS])", {})
        print(
            f"{name}: t2i R@1 LexLIP {lex.get('t2i_R@1', float('nan')):.3f}, "
            f"LexLIP-Dense {dense.get('t2i_R@1', float('nan')):.3f}; "
            f"{res['exclusion']['n_queries']} exclusion queries"
        )
    if args.check:
        from sparsemm_experiments.expected import report_check

        return report_check(preset, metrics)
    return 0
