"""Sparse-code stores: the embedded inverted index (default) and, later, a Qdrant backend."""

from __future__ import annotations

from sparsemm.index.inverted import Exclusion, InvertedIndex, SearchResult

__all__ = ["Exclusion", "InvertedIndex", "SearchResult"]
