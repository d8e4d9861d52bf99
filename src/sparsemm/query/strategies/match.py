"""``match``, the served default: one calibrated match probability per item, for every model.

For a query with include terms I and excluded terms B::

    P(match | x) = prod_{t in I} P(t | x) * prod_{b in B} (1 - P(b | x))

with P(term | x) from the model's own term scorer (:mod:`sparsemm.query.scorers`: the
photo model's class and face probabilities, SR's calibrated detectors, CLIP's zero-shot
probabilities), each term read through the concept hierarchy ("vehicle" covers car, bus,
...). The terms are treated as independent given the item. An exclusion-only query ("no
people") is P = prod (1 - P(b | x)).

Scores are probabilities, comparable across queries: a page can say "92% match", keep only
items above a threshold and count them. The ranking is by the match probability at a
resolution of ``resolution`` (1%: what is shown). Within a step, ties are broken by the
code similarity of the include text times prod (1 - P(b | x)): an item that may show a
left-out thing comes after one that does not. With something included, an item with
P(match) = 0 (the photo model saw none of it) is not a match and is left out. A "more like
this" picture stands in for the included terms with its code similarity (the share of its
concepts an item has).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.query.scorers import TermReading, TermScorer, detector_scorer
from sparsemm.query.strategies.base import Strategy
from sparsemm.query.strategies.context import ExclusionContext
from sparsemm.query.strategies.registry import register_strategy

LIKE_PREFIX = "like: "  # the pseudo-term of a "more like this" picture (Searcher.like_term)


class Match(Strategy):
    """P(match | x) from calibrated term probabilities (see the module docstring)."""

    kind = "sparse"
    requires: ClassVar[tuple[str, ...]] = ("codes",)
    probabilistic: ClassVar[bool] = True  # scores are P(match), in [0, 1]
    overlap_rule: ClassVar[bool] = False  # rank_query need not drop disjoint items
    needs_concepts: ClassVar[bool] = True  # a model's term scorer or detectors
    params: ClassVar[dict[str, Any]] = {"resolution": 0.01}

    def __init__(self, ctx: ExclusionContext, **params: Any) -> None:
        super().__init__(ctx, **params)
        res = float(self.p["resolution"])
        if not 0.0 < res <= 1.0:
            raise SparsemmError(f"match resolution must be in (0, 1], got {res}")
        scorer = ctx.concepts
        if scorer is None and ctx.detectors is not None:
            scorer = detector_scorer(ctx.detectors)
        if scorer is None:
            raise SparsemmError(
                "the match scorer needs a model with concepts (the photo concept model, CLIP) "
                "or concept detectors (SR: `sparsemm train detectors MODEL COLLECTION`)"
            )
        self.scorer: TermScorer = scorer

    # -- terms -----------------------------------------------------------------------------
    def reading(self, term: str) -> TermReading:
        """How the model reads ``term`` (cached); UnknownTerm when it cannot. A "more like
        this" picture's pseudo-term (``like: ...``, its code pinned in the context) is read
        as the picture itself: its probability is the code similarity."""
        if term.startswith(LIKE_PREFIX):
            return TermReading(term, "like", (), (), "picture similarity")
        key = (id(self.scorer), term)
        hit = self.ctx.readings.get(key)
        if hit is None or hit[0] is not self.scorer:
            hit = (self.scorer, self.scorer.read(term))
            self.ctx.readings[key] = hit
        out: TermReading = hit[1]
        return out

    def term_probability(self, term: str, excluded: bool = False) -> np.ndarray:
        """(n_items,) P(term | item) (cached per term); ``excluded``: as a term to leave
        out, which a model may judge from more conservative evidence (the photo model: any
        region of the photo that shows it)."""
        key = ("match_p", term, excluded)
        hit = self.ctx.cache.get(key)
        if hit is None:
            reading = self.reading(term)
            if reading.kind == "like":  # how much of the picture's code the item shares
                hit = np.clip(self.similarity(term), 0.0, 1.0)
            else:
                hit = np.clip(
                    self.scorer.probability(reading, self.ctx, excluded=excluded), 0.0, 1.0
                )
            if not term.startswith(LIKE_PREFIX):  # a pinned code changes between queries
                self.ctx.cache[key] = hit
        out: np.ndarray = hit
        return out

    def prepare(self, terms: Any) -> None:
        terms = list(terms)
        self.ctx.prefetch(terms, codes=self.ctx.query_coder is not None)
        for t in terms:
            self.reading(t)

    # -- scores ----------------------------------------------------------------------------
    def probability(self, include: Sequence[str], exclude: Sequence[str]) -> np.ndarray:
        """(n_items,) P(match | item)."""
        p = np.ones(self.ctx.n_items)
        for t in include:
            p = p * self.term_probability(t)
        for b in exclude:
            p = p * (1.0 - self.term_probability(b, excluded=True))
        return p

    @staticmethod
    def tie_text(include: Sequence[str]) -> str:
        """The text whose code similarity breaks ties."""
        return " and ".join(include)

    def tie(self, include: Sequence[str], exclude: Sequence[str] = ()) -> np.ndarray:
        """(n_items,) in [0, 1]: the include text's code similarity times the probability
        that none of the excluded terms is there, prod (1 - P(b | x)): the product P(match)
        is, with the similarity standing in for the included terms. Within one percent
        step, an item that may show a left-out thing ranks below one that does not. At
        most the similarity, which bounds it on the served path. 0 when nothing is
        included or the model has no query coder."""
        if not include or self.ctx.query_coder is None:
            return np.zeros(self.ctx.n_items)
        out = np.clip(self.similarity(self.tie_text(include)), 0.0, 1.0)
        for b in exclude:
            out = out * (1.0 - self.term_probability(b, excluded=True))
        return out

    def rank_key(self, p: np.ndarray, tie: np.ndarray) -> np.ndarray:
        """P at the ranking resolution, ties broken by ``tie`` (never by more than half a
        step): floor(P / r) r + r tie / 2."""
        r = float(self.p["resolution"])
        # a hair above the floor so that 0.29 / 0.01 = 28.999... stays in its own step
        return np.floor(p / r + 1e-9) * r + 0.5 * r * tie

    def score_query(self, include: Sequence[str], exclude: Sequence[str]) -> np.ndarray:
        p = self.probability(include, exclude)
        key = self.rank_key(p, self.tie(include, exclude))
        if include:
            key = np.where(p > 0.0, key, -np.inf)
        return key

    def scores(self, a: str, b: str) -> np.ndarray:
        return self.score_query([a] if a else [], [b] if b else [])

    def key_bound(self, p_bound: float, tie_bound: float = 1.0) -> float:
        """The largest rank key an item with P(match) <= p_bound can have."""
        r = float(self.p["resolution"])
        return math.floor(min(1.0, p_bound) / r + 1e-9) * r + 0.5 * r * min(1.0, tie_bound)


register_strategy(
    "match",
    Match,
    "sparse (default): P(match) = prod P(included | x) * prod (1 - P(excluded | x)), from "
    "calibrated term probabilities read through the concept hierarchy",
)
