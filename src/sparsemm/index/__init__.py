"""Sparse-code stores: the embedded inverted index (default) and the Qdrant backend.

``InvertedIndex`` is the on-disk index itself; ``Store`` is the backend-neutral interface
(``LocalStore`` over an InvertedIndex folder, ``sparsemm.index.qdrant.QdrantStore`` over a
Qdrant collection, imported lazily because it needs the ``qdrant`` extra).
"""

from __future__ import annotations

from sparsemm.index.backends import BACKENDS, open_store
from sparsemm.index.inverted import Exclusion, InvertedIndex, SearchResult
from sparsemm.index.store import LocalStore, Store, fuse_rrf

__all__ = [
    "BACKENDS",
    "Exclusion",
    "InvertedIndex",
    "LocalStore",
    "SearchResult",
    "Store",
    "fuse_rrf",
    "open_store",
]
