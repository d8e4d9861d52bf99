"""BM25 over item captions (bm25s), as an item ranking for the retrieval benchmarks.

A text-only baseline: every item is a document made of its captions, scored with BM25
(Robertson & Zaragoza 2009; Lucene's variant as implemented by ``bm25s``, Lù 2024). It
needs captions for the items it searches, which real image collections do not have, so it
is a reference point for how far plain words get, not a competitor on uncaptioned images.

Tokens: :func:`sparsemm.query.strategies.term_tokens` (lower-case, letters only, English
function words dropped, crude singular), the same rule the exclusion benchmark uses to decide
whether a caption mentions a term.

Exclusion ("A but not B"), the rule used here (:meth:`CaptionBM25.rank_exclusion`): rank the
items by BM25(A), keeping only items that match A at all (score > 0); an item some of whose
captions mention B (:class:`sparsemm.query.strategies.CaptionIndex`: phrase match, head-noun
fall-back for rare multi-word terms) is *demoted* below every item that does not mention B,
keeping BM25(A) order within each group. With ``rule="remove"`` those items are dropped
instead (the top k then holds fewer items when few items match A without B).

Caption-to-item retrieval with a caption as the query (:func:`caption_retrieval`): a query
caption is also one of the captions of its own item, which BM25 matches exactly, so the
standard text-to-image protocol is meaningless for it. The leave-one-out rule: documents are
single captions, the query caption itself is removed from the results, and items are ranked
by their best remaining caption.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError, require_extra
from sparsemm.text import CaptionIndex, term_tokens

logger = logging.getLogger(__name__)

RULES = ("demote", "remove")


@dataclass(frozen=True)
class BM25Config:
    k1: float = 1.5  # term-frequency saturation (bm25s / Lucene default)
    b: float = 0.75  # document-length normalisation
    method: str = "lucene"  # bm25s scoring variant

    def __post_init__(self) -> None:
        if self.k1 < 0 or not 0.0 <= self.b <= 1.0:
            raise SparsemmError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got {self.k1}, {self.b}")


def _bm25(config: BM25Config, docs: list[list[str]]) -> Any:
    try:
        import bm25s
    except ImportError:
        require_extra("bm25s", "offline")
    # An empty document would make bm25s drop it from its vocabulary bookkeeping; a
    # placeholder token that no query can produce keeps row i = document i.
    docs = [d if d else ["\x00empty"] for d in docs]
    model = bm25s.BM25(k1=config.k1, b=config.b, method=config.method)
    model.index(docs, show_progress=False)
    return model


class CaptionBM25:
    """BM25 ranking of items whose document is the concatenation of their captions.

    ``fit(captions)`` with ``captions[i]`` the captions of item i; rows returned by the
    ranking methods index that list.
    """

    def __init__(self, config: BM25Config | None = None) -> None:
        self.config = config or BM25Config()

    def fit(self, captions: Sequence[Sequence[str]]) -> CaptionBM25:
        if not len(captions):
            raise SparsemmError("BM25 needs at least one item with captions")
        docs = [[t for c in caps for t in term_tokens(c)] for caps in captions]
        self.n_items_ = len(docs)
        self.model_ = _bm25(self.config, docs)
        self.index_ = CaptionIndex(captions)
        return self

    def _check(self) -> None:
        if not hasattr(self, "model_"):
            raise SparsemmError("call fit(captions) before searching")

    def scores(self, text: str) -> np.ndarray:
        """(n_items,) float64 BM25 scores of ``text`` (0 for items sharing no token)."""
        self._check()
        toks = term_tokens(text)
        if not toks:
            return np.zeros(self.n_items_)
        return np.asarray(self.model_.get_scores(toks), dtype=np.float64)

    def rank(self, text: str, k: int) -> np.ndarray:
        """Rows of the top-k items with a positive score, best first (ties: lower row)."""
        if k < 1:
            raise SparsemmError(f"k must be a positive integer, got {k}")
        s = self.scores(text)
        order = np.argsort(-s, kind="stable")
        return order[s[order] > 0][:k].astype(np.int64)

    def mentions(self, term: str) -> np.ndarray:
        """(n_items,) bool: some caption of the item mentions ``term``."""
        self._check()
        return self.index_.mentions(term)

    def rank_exclusion(self, a: str, b: str, k: int, rule: str = "demote") -> np.ndarray:
        """Rows for "a but not b" (see the module docstring for the rule)."""
        if rule not in RULES:
            raise SparsemmError(f"rule must be one of {RULES}, not {rule!r}")
        if k < 1:
            raise SparsemmError(f"k must be a positive integer, got {k}")
        s = self.scores(a)
        has_b = self.mentions(b)
        order = np.argsort(-s, kind="stable")
        order = order[s[order] > 0]
        clean = order[~has_b[order]]
        if rule == "remove":
            return clean[:k].astype(np.int64)
        return np.concatenate([clean, order[has_b[order]]])[:k].astype(np.int64)

    def rank_many(
        self, pairs: Sequence[tuple[str, str]], k: int, rule: str = "demote"
    ) -> np.ndarray:
        """(q, k) int64 rankings for many (a, b) pairs; -1 pads short rankings."""
        out = np.full((len(pairs), k), -1, dtype=np.int64)
        for i, (a, b) in enumerate(pairs):
            rows = self.rank_exclusion(a, b, k, rule)
            out[i, : len(rows)] = rows
        return out

    def search_many(self, texts: Sequence[str], k: int) -> np.ndarray:
        """(q, k) int64 plain rankings; -1 pads."""
        out = np.full((len(texts), k), -1, dtype=np.int64)
        for i, t in enumerate(texts):
            rows = self.rank(t, k)
            out[i, : len(rows)] = rows
        return out


def caption_retrieval(
    captions: Sequence[str],
    caption_item: np.ndarray,
    query_rows: np.ndarray,
    k: int = 10,
    config: BM25Config | None = None,
) -> np.ndarray:
    """Leave-one-out caption-to-item rankings (see the module docstring).

    ``captions`` (m,) with ``caption_item`` (m,) their item; ``query_rows`` (q,) captions
    used as queries. Returns (q, k) int64 item ids (values of ``caption_item``), best
    first, -1 padded.
    """
    caption_item = np.asarray(caption_item, dtype=np.int64)
    if len(caption_item) != len(captions):
        raise SparsemmError("caption_item needs one entry per caption")
    model = _bm25(config or BM25Config(), [term_tokens(c) for c in captions])
    out = np.full((len(query_rows), k), -1, dtype=np.int64)
    for i, r in enumerate(np.asarray(query_rows, dtype=np.int64)):
        toks = term_tokens(captions[r])
        if not toks:
            continue
        s = np.asarray(model.get_scores(toks), dtype=np.float64)
        s[r] = 0.0
        order = np.argsort(-s, kind="stable")
        order = order[s[order] > 0]
        items = caption_item[order]
        _, first = np.unique(items, return_index=True)
        ranked = items[np.sort(first)][:k]
        out[i, : len(ranked)] = ranked
    return out
