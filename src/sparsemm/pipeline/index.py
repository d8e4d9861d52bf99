"""A collection coded by a model into its index, and into Qdrant: what ``sparsemm index``
runs (:func:`index`, returning an :class:`IndexReport`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsemm.data.collection import collection_root
from sparsemm.errors import SparsemmError


@dataclass
class IndexReport:
    """What :func:`index` wrote."""

    index_dir: Path
    items: int
    dims: int
    nonzeros_per_item: float
    qdrant_collection: str | None = None  # the Qdrant collection uploaded to, if any
    qdrant_items: int = 0  # items it holds
    uploaded: int = 0  # items uploaded by this run (the rest were there: resumed)


def qdrant_name(collection: str | Path, name: str | None = None) -> str:
    """The Qdrant collection of a collection folder: ``name``, else the folder's name."""
    return str(name or collection_root(collection).resolve().name)


def index(
    collection: str | Path,
    model: str | Path,
    *,
    spine: str | Path | None = None,
    top_k: int | None = None,
    dense_model: str | Path | None = None,
    backend: str = "local",
    url: str | None = None,
    collection_name: str | None = None,
    api_key: str | None = None,
    batch_size: int = 1024,
    overwrite: bool = False,
    filter_thresholds: Sequence[float] | None = None,
    shards: int | None = None,
    replicas: int | None = None,
    progress: bool = True,
) -> IndexReport:
    """Build ``collection``'s index with ``model`` (:func:`sparsemm.query.indexing.build_index`);
    with ``backend="qdrant"`` also upload the codes to the Qdrant collection
    ``collection_name`` at ``url`` (created, or resumed into unless ``overwrite``)."""
    from sparsemm.query.indexing import build_index

    collection = collection_root(collection)  # a photo folder names the collection `up` made
    if top_k is not None and top_k < 1:
        raise SparsemmError(
            f"--top-k must be a positive number of non-zeros per code, got {top_k}; "
            "leave it out for the model's own k"
        )
    client = None
    if backend == "qdrant":  # before the local index is rebuilt: fail fast
        from sparsemm.index.qdrant import connect

        client = connect(url, api_key=api_key)
    built = build_index(
        collection,
        model,
        spine_dir=spine,
        top_k=top_k,
        dense_model=dense_model,
        progress=progress,
    )
    report = IndexReport(
        index_dir=Path(collection) / "index",
        items=len(built),
        dims=built.dim,
        nonzeros_per_item=built.nnz / max(len(built), 1),
    )
    if client is not None:
        name = qdrant_name(collection, collection_name)
        report.qdrant_collection = name
        report.qdrant_items, report.uploaded = upload_qdrant(
            built,
            client,
            name,
            batch_size=batch_size,
            overwrite=overwrite,
            filter_thresholds=filter_thresholds,
            shards=shards,
            replicas=replicas,
            progress=progress,
        )
    return report


def upload_qdrant(
    built: Any,
    client: Any,
    name: str,
    *,
    batch_size: int = 1024,
    overwrite: bool = False,
    filter_thresholds: Sequence[float] | None = None,
    shards: int | None = None,
    replicas: int | None = None,
    progress: bool = True,
) -> tuple[int, int]:
    """Upload an index's items to the Qdrant collection ``name``: create it (or, if it
    exists and ``overwrite`` is not set, resume into it). Returns (items it holds, items
    uploaded now)."""
    import numpy as np

    from sparsemm.index.qdrant import QdrantConfig, QdrantStore
    from sparsemm.query.strategies import HardFilter

    thresholds = filter_thresholds or [0.0, float(HardFilter.params["threshold"])]
    cfg = QdrantConfig(
        thresholds=tuple(thresholds), shard_number=shards, replication_factor=replicas
    )
    if overwrite or not client.collection_exists(name):
        store = QdrantStore.create(client, name, built.dim, cfg, overwrite=True)
    else:
        store = QdrantStore.open(client, name)
        if store.dim != built.dim:
            raise SparsemmError(
                f"Qdrant collection {name!r} holds codes of {store.dim} dims, the index "
                f"{built.dim}; pass --overwrite to recreate it"
            )
        if set(store.config.thresholds) != set(cfg.thresholds):
            raise SparsemmError(
                f"Qdrant collection {name!r} has filter thresholds {list(store.config.thresholds)}"
                f", not {sorted(set(cfg.thresholds))}; pass --overwrite to recreate it"
            )
    codes = built.codes(np.arange(len(built)))
    added = store.upload(codes, list(built.ids), batch_size=batch_size, progress=progress)
    return len(store), added
