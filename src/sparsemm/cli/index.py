"""``sparsemm index``: encode a collection with a sparse model into its inverted index."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# sparsemm.index.backends.BACKENDS, written out so that building the parser does not import
# the index (numba, scipy); tests/cli/test_cli_cold_start.py checks that they agree.
BACKENDS = ("local", "qdrant")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index",
        help="encode a collection's items with a sparse model (SR or VDR) into an inverted index",
        description="Writes COLLECTION/index: posting lists of the items' sparse codes "
        "(memory-mapped, atomic writes) and a label per concept dimension. With --backend "
        "qdrant the codes are also uploaded to a Qdrant collection (batched, resumable).",
    )
    p.add_argument("collection", type=Path, help="collection folder (sparsemm encode)")
    p.add_argument(
        "--model", type=Path, required=True, help="SR or VDR model folder (sparsemm train sr|vdr)"
    )
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
    add_backend_args(p, writing=True)
    p.set_defaults(func=run)


def add_backend_args(p: argparse.ArgumentParser, writing: bool = False) -> None:
    """The store options shared by `sparsemm index` and `sparsemm search`."""
    g = p.add_argument_group("store backend")
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="where the items are searched: the embedded index (default) or Qdrant",
    )
    g.add_argument(
        "--url",
        default=os.environ.get("SPARSEMM_QDRANT_URL"),
        help="Qdrant server/cluster URL, e.g. http://localhost:6333 (default $SPARSEMM_QDRANT_URL)",
    )
    g.add_argument(
        "--collection-name",
        default=None,
        help="Qdrant collection (default: the collection folder's name)",
    )
    g.add_argument(
        "--api-key",
        default=os.environ.get("QDRANT_API_KEY"),
        help="Qdrant API key (default $QDRANT_API_KEY)",
    )
    if not writing:
        return
    g.add_argument("--batch-size", type=int, default=1024, help="points per upload request")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="recreate the Qdrant collection (default: resume an interrupted upload)",
    )
    g.add_argument(
        "--filter-threshold",
        type=float,
        action="append",
        default=None,
        metavar="T",
        help="threshold whose active dims are stored for filter exclusions (repeatable; "
        "default: 0 and the filter strategy's threshold)",
    )
    g.add_argument("--shards", type=int, default=None, help="Qdrant shard_number")
    g.add_argument("--replicas", type=int, default=None, help="Qdrant replication_factor")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def collection_name(args: argparse.Namespace) -> str:
    from sparsemm.pipeline.index import qdrant_name

    return qdrant_name(args.collection, args.collection_name)


def run(args: argparse.Namespace) -> int:
    from sparsemm.pipeline.index import index

    report = index(
        args.collection,
        args.model,
        spine=args.spine,
        top_k=args.top_k,
        dense_model=args.dense_model,
        backend=args.backend,
        url=args.url,
        collection_name=args.collection_name,
        api_key=args.api_key,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        filter_thresholds=args.filter_threshold,
        shards=args.shards,
        replicas=args.replicas,
        progress=not args.no_progress,
    )
    print(
        f"indexed {report.items} items ({report.nonzeros_per_item:.1f} non-zeros each, "
        f"{report.dims} dims) -> {report.index_dir}"
    )
    if report.qdrant_collection is not None:
        print(
            f"qdrant: {report.qdrant_items} items in collection {report.qdrant_collection!r} "
            f"({report.uploaded} uploaded now)"
        )
    return 0
