"""Store backends by name: :func:`open_store` opens a :class:`~sparsemm.index.store.Store`
chosen with ``--backend``: the embedded inverted index (``local``) or a Qdrant collection
(``qdrant``, imported only when asked for, as it needs the ``qdrant`` extra). A collection's
own index is opened directly (:meth:`InvertedIndex.open`)."""

from __future__ import annotations

from pathlib import Path

from sparsemm.errors import SparsemmError
from sparsemm.index.inverted import InvertedIndex
from sparsemm.index.store import Store

BACKENDS = ("local", "qdrant")


def open_store(
    backend: str = "local",
    *,
    path: str | Path | None = None,
    url: str | None = None,
    collection: str | None = None,
    api_key: str | None = None,
) -> Store:
    """Open an existing store: ``local``, the inverted index folder at ``path``; ``qdrant``,
    the collection named ``collection`` on the server at ``url``."""
    if backend == "local":
        if path is None:
            raise SparsemmError("the local backend needs the index folder (path)")
        return InvertedIndex.open(path)
    if backend == "qdrant":
        from sparsemm.index.qdrant import QdrantStore, connect

        if not collection:
            raise SparsemmError("the qdrant backend needs a collection name")
        return QdrantStore.open(connect(url, api_key=api_key), collection)
    raise SparsemmError(f"unknown store backend {backend!r}; choose one of {', '.join(BACKENDS)}")
