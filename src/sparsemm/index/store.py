"""The one store interface: what the served path reads from wherever the codes live.

A *store* holds items in insertion order (row ``r`` = the r-th item added, never renumbered),
each a string id and a sparse concept code ``(dim,)``. Two backends implement :class:`Store`:
:class:`~sparsemm.index.InvertedIndex` (the embedded index in a collection's ``index/``
folder, the default) and :class:`sparsemm.index.qdrant.QdrantStore` (a Qdrant collection,
extra ``qdrant``); :func:`sparsemm.index.backends.open_store` opens either by name.

The served path (:mod:`sparsemm.query.strategies.ranking`,
:class:`~sparsemm.query.searcher.Searcher`) reads only what this interface holds: the number
of items, their dimension, whether any stored value is negative, the codes of given rows,
and exact top-k search (and its cheaper approximate form with an error bound, where a
backend has one). Writing is not part of it: an :class:`~sparsemm.index.InvertedIndex` is
built and appended to on its own terms (``build``/``add``), a Qdrant collection is uploaded
to (resumably) through ``QdrantStore.create``/``upload``.

Result rule shared by every backend, so the same data gives the same results everywhere:
ties are broken by the lower row, and scores are computed with one fixed float32 arithmetic
(the inverted index's kernel; a backend that scores differently, Qdrant, fetches every
candidate within its provable rounding error of the k-th score and rescores those exactly,
:mod:`sparsemm.index.scoring`), so the hits scoring > 0 are identical, scores to the last
bit. Items scoring <= 0 share no concept with the query and are no match: a backend may
leave them out (Qdrant does) or rank them after the others (the inverted index does when
fewer than k items score above zero).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # the inverted index implements this interface: no import at run time
    import numpy as np
    import scipy.sparse as sp

    from sparsemm.index.inputs import Exclusion, QueryLike, SearchResult


class Store(ABC):
    """Items (id, sparse code) with exact top-k search by inner product (module doc)."""

    backend: ClassVar[str]  # the name open_store and ``--backend`` know it by

    @property
    @abstractmethod
    def dim(self) -> int:
        """Dimensions of the codes."""

    @property
    @abstractmethod
    def nonnegative(self) -> bool:
        """True when the store can vouch that no stored value is negative (what the served
        path's candidate bounds assume; False sends its queries to a scan)."""

    @abstractmethod
    def __len__(self) -> int:
        """Items held (rows 0 .. len - 1)."""

    @abstractmethod
    def codes(self, rows: Sequence[int] | np.ndarray) -> sp.csr_matrix:
        """Stored codes of ``rows`` as a (len(rows), dim) float32 CSR matrix with sorted
        indices, in the order given (the forward index the served path rescores from)."""

    @abstractmethod
    def search(
        self,
        query: QueryLike,
        k: int = 10,
        exclude: Exclusion | None = None,
        *,
        with_ids: bool = True,
    ) -> SearchResult:
        """Exact top ``k`` items by inner product with ``query`` (a (1, dim) sparse row, a
        dense (dim,) array or a (dims, weights) pair), after ``exclude`` (a filter drops items
        whose value on any of its dims is > its threshold; a penalty subtracts from scores).

        Every item scoring > 0 that belongs in the top k is returned, best first, ties by
        the lower row; items scoring <= 0 may follow them (module doc), so a caller wanting
        matches keeps scores > 0. ``with_ids=False``: rows and scores are all the caller
        reads, and ``ids`` may be left empty."""

    def search_quantized(self, query: QueryLike, k: int = 10) -> tuple[SearchResult, float]:
        """(hits, err): the top ``k`` rows by an approximation of the inner product that is
        within ``err`` of the exact score for every item, and err (rows and scores only).
        An item outside the hits scores at most the k-th score + err: what the served
        path's certified candidate lists need. A backend without a cheaper approximate
        search answers exactly, with err 0 (this default)."""
        return self.search(query, k), 0.0

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for local stores
        """Release connections (the store is unusable afterwards)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
