"""Store backends by name: :func:`open_store` opens the embedded inverted index
(``local``) or a Qdrant collection (``qdrant``, imported only when asked for, as it needs
the ``qdrant`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError
from sparsemm.index.store import LocalStore, Store

BACKENDS = ("local", "qdrant")


def open_store(
    backend: str = "local",
    *,
    path: str | Path | None = None,
    url: str | None = None,
    collection: str | None = None,
    api_key: str | None = None,
    **options: Any,
) -> Store:
    """Open an existing store: ``local`` at ``path``, or ``qdrant`` ``collection`` at ``url``."""
    if backend == "local":
        if path is None:
            raise SparsemmError("the local backend needs the index folder (path)")
        return LocalStore.open(path)
    if backend == "qdrant":
        from sparsemm.index.qdrant import QdrantStore, connect

        if not collection:
            raise SparsemmError("the qdrant backend needs a collection name")
        client = connect(url, api_key=api_key, **options)
        return QdrantStore.open(client, collection)
    raise SparsemmError(f"unknown store backend {backend!r}; choose one of {', '.join(BACKENDS)}")
