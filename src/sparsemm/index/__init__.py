"""Sparse-code stores: the embedded inverted index (default) and the Qdrant backend.

``Store`` is the one interface the served path reads (size, dimension, codes by row, exact
top-k search); ``InvertedIndex`` (the on-disk index) and
``sparsemm.index.qdrant.QdrantStore`` (a Qdrant collection, imported lazily because it needs
the ``qdrant`` extra) implement it, and ``open_store`` opens either by name.
"""

from __future__ import annotations

from sparsemm.index.backends import BACKENDS, open_store
from sparsemm.index.inputs import Exclusion, SearchResult
from sparsemm.index.inverted import InvertedIndex
from sparsemm.index.store import Store

__all__ = [
    "BACKENDS",
    "Exclusion",
    "InvertedIndex",
    "SearchResult",
    "Store",
    "open_store",
]
