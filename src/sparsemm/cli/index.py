"""``sparsemm index``: encode a collection with a sparse model into its inverted index."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

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
    return str(args.collection_name or Path(args.collection).resolve().name)


def run(args: argparse.Namespace) -> int:
    from sparsemm.errors import SparsemmError
    from sparsemm.query.indexing import build_index

    if args.top_k is not None and args.top_k < 1:
        raise SparsemmError(
            f"--top-k must be a positive number of non-zeros per code, got {args.top_k}; "
            "leave it out for the model's own k"
        )
    client = None
    if args.backend == "qdrant":  # before the local index is rebuilt: fail fast
        from sparsemm.index.qdrant import connect

        client = connect(args.url, api_key=args.api_key)
    index = build_index(
        args.collection,
        args.model,
        spine_dir=args.spine,
        top_k=args.top_k,
        dense_model=args.dense_model,
        progress=not args.no_progress,
    )
    print(
        f"indexed {len(index)} items ({index.nnz / max(len(index), 1):.1f} non-zeros each, "
        f"{index.dim} dims) -> {args.collection / 'index'}"
    )
    if args.backend == "qdrant":
        upload_qdrant(index, args, client=client)
    return 0


def upload_qdrant(index: Any, args: argparse.Namespace, client: Any = None) -> None:
    """Upload an index's items to Qdrant: create the collection (or, if it exists and
    --overwrite is not given, resume into it)."""
    import numpy as np

    from sparsemm.errors import SparsemmError
    from sparsemm.index.qdrant import QdrantConfig, QdrantStore, connect
    from sparsemm.query.strategies import HardFilter

    name = collection_name(args)
    client = client if client is not None else connect(args.url, api_key=args.api_key)
    thresholds = args.filter_threshold or [0.0, float(HardFilter.params["threshold"])]
    cfg = QdrantConfig(
        thresholds=tuple(thresholds), shard_number=args.shards, replication_factor=args.replicas
    )
    if args.overwrite or not client.collection_exists(name):
        store = QdrantStore.create(client, name, index.dim, cfg, overwrite=True)
    else:
        store = QdrantStore.open(client, name)
        if store.dim != index.dim:
            raise SparsemmError(
                f"Qdrant collection {name!r} holds codes of {store.dim} dims, the index "
                f"{index.dim}; pass --overwrite to recreate it"
            )
        if set(store.config.thresholds) != set(cfg.thresholds):
            raise SparsemmError(
                f"Qdrant collection {name!r} has filter thresholds {list(store.config.thresholds)}"
                f", not {sorted(set(cfg.thresholds))}; pass --overwrite to recreate it"
            )
    codes = index.codes(np.arange(len(index)))
    added = store.upload(
        codes, list(index.ids), batch_size=args.batch_size, progress=not args.no_progress
    )
    print(f"qdrant: {len(store)} items in collection {name!r} ({added} uploaded now)")
