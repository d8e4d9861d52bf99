"""Dense strategies: the include term alone, the single-line query and embedding arithmetic."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from sparsemm.query.strategies.base import Strategy
from sparsemm.query.strategies.context import SLQ_TEMPLATE
from sparsemm.query.strategies.registry import register_strategy

logger = logging.getLogger(__name__)


class DenseA(Strategy):
    """cos(emb(A), x): the include term alone, B ignored."""

    requires = ("dense", "text_encoder")

    def scores(self, a: str, b: str) -> np.ndarray:
        assert self.ctx.items_dense is not None
        return np.asarray(self.ctx.items_dense @ self.ctx.term_embedding(a), dtype=np.float64)


class SingleLineQuery(Strategy):
    """SLQ: cos(emb("a photo of a A without a B"), x) - negation left to the encoder."""

    requires = ("dense", "text_encoder")
    params: ClassVar[dict[str, Any]] = {"template": SLQ_TEMPLATE}

    def prepare(self, terms: Iterable[str]) -> None:  # SLQ texts are per pair
        pass

    def rank_many(self, pairs: Sequence[tuple[str, str]], k: int) -> np.ndarray:
        self.ctx.embed([self.p["template"].format(a=a, b=b) for a, b in pairs])
        return super().rank_many(pairs, k)

    def scores(self, a: str, b: str) -> np.ndarray:
        assert self.ctx.items_dense is not None
        q = self.ctx.embed([self.p["template"].format(a=a, b=b)])[0]
        return np.asarray(self.ctx.items_dense @ q, dtype=np.float64)


class AvgEmb(Strategy):
    """Embedding arithmetic: cos(emb(A) - w emb(B), x)."""

    requires = ("dense", "text_encoder")
    params: ClassVar[dict[str, Any]] = {"w": 1.0}

    def scores(self, a: str, b: str) -> np.ndarray:
        assert self.ctx.items_dense is not None
        q = self.ctx.term_embedding(a) - self.p["w"] * self.ctx.term_embedding(b)
        return np.asarray(self.ctx.items_dense @ q, dtype=np.float64)


register_strategy("dense_a", DenseA, "dense: cos(emb(A), x), B ignored (reference)")
register_strategy("slq", SingleLineQuery, 'dense: "a photo of a A without a B" (SLQ)')
register_strategy("avg_emb", AvgEmb, "dense: cos(emb(A) - emb(B), x) (Avg Emb)", w=1.0)
register_strategy("avg_emb_0.5", AvgEmb, "dense: cos(emb(A) - 0.5 emb(B), x)", w=0.5)
