"""CBE: content-based exclusion for "A but not B" (a dense exclusion strategy).

Yoshikawa & Tajima, "Content-Based Exclusion Queries in Keyword-Based Image Retrieval",
ICMR 2024. Only the abstract is public: keyword retrieval over images' text has low recall
because the text is incomplete, so excluding the images whose text mentions the negative
term B leaves many B images in; instead, images are excluded "based on the content-based
similarity to images retrieved by the negative terms". The paper's exact scoring is not
public, so this module implements the following rule (our reading, stated exactly):

1. Positive score: ``s_A(x) = cos(emb(A), x)`` over the items' dense embeddings (the
   benchmark's items have no text at query time, so A is matched by content too).
2. The images B retrieves, ``N_B``:
   ``source="keyword"`` - the reference items (a captioned collection, e.g. the training
   split) some caption of which mentions B (keyword retrieval, with the caption matching
   rules of :class:`~sparsemm.query.strategies.CaptionIndex`); when fewer than
   ``min_positives`` items match, the ``n_examples`` reference items closest to emb(B).
   ``source="dense"`` - the ``n_examples`` evaluation items closest to emb(B).
   ``source="auto"`` - ``keyword`` when the context has a reference set with dense
   embeddings, else ``dense``.
3. Content similarity of an item to B's images: ``sim_B(x)`` = mean of the ``neighbours``
   largest cosines between x and the members of ``N_B`` (``neighbours=1``: nearest B image).
4. Score: ``s_A(x) - w * sim_B(x)``; with ``threshold`` set, items with
   ``sim_B(x) >= threshold`` are dropped outright (hard exclusion).

Registered as ``cbe`` when imported; the ``sparsemm.strategies`` entry points import it with
:mod:`sparsemm.query.strategies`, so ``sparsemm search --strategy cbe`` and the benchmarks
find it by name.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.query.strategies.base import Strategy, top_rows
from sparsemm.query.strategies.context import ExclusionContext
from sparsemm.query.strategies.registry import register_strategy

logger = logging.getLogger(__name__)

SOURCES = ("auto", "keyword", "dense")


def top_mean(sims: np.ndarray, n: int) -> np.ndarray:
    """(rows,) mean of the ``n`` largest values of each row of ``sims`` (rows, cols)."""
    n = max(1, min(int(n), sims.shape[1]))
    if n == sims.shape[1]:
        return np.asarray(sims.mean(axis=1), dtype=np.float64)
    part = np.partition(sims, sims.shape[1] - n, axis=1)[:, -n:]
    return np.asarray(part.mean(axis=1), dtype=np.float64)


class ContentBasedExclusion(Strategy):
    """CBE: ``cos(emb(A), x) - w * sim(x, images B retrieves)`` (rule: module docstring)."""

    requires = ("dense", "text_encoder")
    kind = "dense"
    params: ClassVar[dict[str, Any]] = {
        "source": "auto",  # where B's images come from: keyword | dense | auto
        "n_examples": 25,  # dense source (and keyword fallback): B's top items
        "neighbours": 5,  # sim_B = mean of this many largest cosines to B's images
        "w": 1.0,  # weight of the content-similarity penalty
        "threshold": None,  # drop items with sim_B >= threshold (None: soft only)
        "exclude_a": False,  # leave out of N_B the images A retrieves (B's images without A)
        "min_positives": 5,  # fewer caption mentions than this: fall back to dense
        "head_ratio": 0.1,  # multi-word terms: CaptionIndex head-noun back-off
    }

    def __init__(self, ctx: ExclusionContext, **params: Any) -> None:
        super().__init__(ctx, **params)
        src = self.p["source"]
        if src not in SOURCES:
            raise SparsemmError(f"CBE source must be one of {', '.join(SOURCES)}, not {src!r}")
        has_ref = ctx.reference is not None and ctx.reference.dense is not None
        if src == "auto":
            src = "keyword" if has_ref else "dense"
        if src == "keyword" and not has_ref:
            raise SparsemmError(
                "CBE with source='keyword' needs a captioned reference set with dense "
                "embeddings (the benchmark's tune split); use source='dense' without one"
            )
        self.source = src
        if int(self.p["n_examples"]) < 1 or int(self.p["neighbours"]) < 1:
            raise SparsemmError("CBE n_examples and neighbours must be positive integers")

    def _neg_key(self, term: str, a: str | None) -> tuple[Any, ...]:
        p = self.p
        src = (self.source, p["n_examples"], p["min_positives"], p["head_ratio"])
        return ("cbe_neg", *src, term, a if p["exclude_a"] else None)

    def retrieved(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        """(pool embeddings, bool mask of the pool rows ``term`` retrieves), cached.

        The pool is the evaluation items (dense source) or the reference items (keyword).
        """
        p = self.p
        key = ("cbe_hits", self.source, p["n_examples"], p["min_positives"], p["head_ratio"], term)
        if self.source == "dense":
            assert self.ctx.items_dense is not None
            pool = self.ctx.items_dense
        else:
            ref = self.ctx.reference
            assert ref is not None and ref.dense is not None
            pool_key = ("cbe_ref_unit", id(ref))
            if pool_key not in self.ctx.cache:
                self.ctx.cache[pool_key] = normalize_rows(ref.dense)
            pool = self.ctx.cache[pool_key]
        if key not in self.ctx.cache:
            n = int(self.p["n_examples"])
            hit = np.zeros(len(pool), dtype=bool)
            if self.source == "keyword":
                ref = self.ctx.reference
                assert ref is not None
                hit = ref.mentions(term, int(self.p["min_positives"]), self.p["head_ratio"])
            if hit.sum() < int(self.p["min_positives"]):
                if self.source == "keyword":
                    logger.debug("CBE: %r has %d caption mentions; dense fallback", term, hit.sum())
                hit = np.zeros(len(pool), dtype=bool)
                hit[top_rows(pool @ self.ctx.term_embedding(term), n)] = True
            self.ctx.cache[key] = hit
        return pool, self.ctx.cache[key]

    def negatives(self, b: str, a: str | None = None) -> np.ndarray:
        """(n_B, k) unit dense embeddings of the images ``b`` retrieves (cached); with
        ``exclude_a``, minus the images ``a`` retrieves (kept whole if that empties it)."""
        key = self._neg_key(b, a)
        if key not in self.ctx.cache:
            pool, hit = self.retrieved(b)
            if self.p["exclude_a"] and a is not None:
                _, hit_a = self.retrieved(a)
                if (hit & ~hit_a).any():
                    hit = hit & ~hit_a
            self.ctx.cache[key] = np.ascontiguousarray(pool[hit], dtype=np.float32)
        out: np.ndarray = self.ctx.cache[key]
        return out

    def content_similarity(self, b: str, a: str | None = None) -> np.ndarray:
        """(n_items,) sim_B: mean of the ``neighbours`` largest cosines to B's images."""
        key = (*self._neg_key(b, a), "sim", self.p["neighbours"])
        if key not in self.ctx.cache:
            assert self.ctx.items_dense is not None
            neg = self.negatives(b, a)
            if not len(neg):
                sim = np.zeros(self.ctx.n_items)
            else:
                sim = top_mean(self.ctx.items_dense @ neg.T, int(self.p["neighbours"]))
            self.ctx.cache[key] = sim
        out: np.ndarray = self.ctx.cache[key]
        return out

    def scores(self, a: str, b: str) -> np.ndarray:
        assert self.ctx.items_dense is not None
        s = np.asarray(self.ctx.items_dense @ self.ctx.term_embedding(a), dtype=np.float64)
        sim = self.content_similarity(b, a)
        s = s - float(self.p["w"]) * sim
        if self.p["threshold"] is not None:
            s = np.where(sim >= float(self.p["threshold"]), -np.inf, s)
        return s


CBE_DESCRIPTION = (
    "dense: CBE (Yoshikawa & Tajima 2024) cos(emb(A), x) - w * mean of the top-n cosines "
    "of x to the images B retrieves (reference items whose captions mention B, or B's "
    "top dense hits), optional hard drop above a threshold"
)

register_strategy(
    "cbe",
    ContentBasedExclusion,
    CBE_DESCRIPTION,
    grid={
        "source": ["keyword", "dense"],
        "neighbours": [5, 25],
        "w": [0.1, 0.2, 0.3, 0.5],
    },
)
