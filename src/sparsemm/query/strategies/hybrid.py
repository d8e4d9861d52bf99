"""Detector strategies: caption-word detectors on codes or embeddings (``detector``,
``dense_detector``) and ``hybrid``, served through the index by :meth:`Hybrid.rank_store`.

How ``hybrid`` bounds an item it has not read. The score of an item with unit code x::

    s(x) = A(x) + delta sum_{t in T} log sigma(z_t(x))
           + beta sum_j log(1 - P(B_j | x) / c_j)
    A(x) = v_A . x,  v_A = alpha q_I - gamma sum_j q_{B_j}  (q: unit query codes)
    z_t(x) = w_t . x + b_t                                  (detector logits of T)

Every log term is <= 0 and log sigma(z) <= min(0, z), so with P(x) = A(x) + delta
sum_t z_t(x) (linear in x), s(x) <= min(A(x), P(x)). The index returns the top ``n``
items by ``A+`` and (when an include term has a detector) by ``P+``: the inner
products with the positive parts of v_A and v_P, so the negative weights (the
excluded terms' codes in A, a detector's negative weights in P) need not be read. An
item outside both lists scores at most ``min(a_n + r_A, p_n + r_P)``: the lists' n-th
scores plus their residuals (P's with its bias; each with its search's err).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.lru import LRUCache
from sparsemm.models.detectors import ConceptDetectors
from sparsemm.query.strategies.base import Strategy, log_sigmoid, top_rows
from sparsemm.query.strategies.context import (
    ExclusionContext,
    normalize_csr,
)
from sparsemm.query.strategies.ranking import (
    MARGIN,
    SCAN_SHARE,
    Pool,
    ProxyList,
    ServedResult,
    check_pool,
    cut,
    pool_sizes,
    scan_rank,
)
from sparsemm.query.strategies.registry import register_strategy
from sparsemm.train.detectors import fit_detectors

if TYPE_CHECKING:
    from sparsemm.index.store import Store
    from sparsemm.query.parse import Query
    from sparsemm.query.unit_lists import UnitLists

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------- detectors


class Detector(Strategy):
    """Per-term detectors: log P(A|x) + beta log(1 - P(B|x)) + alpha cos(A, x) - gamma cos(B, x).

    A term's detector is a logistic regression fitted on the reference set's representations
    with target "some caption of the item mentions the term" (captions only, no labels; see
    :class:`CaptionIndex`). A term mentioned by fewer than ``min_positives`` reference items
    gets its ``min_positives`` most similar reference items (by the query's similarity) as
    pseudo-positives instead, so every term has a usable detector. ``features="codes"`` fits
    on unit-normalised sparse codes (times ``scale``), so each weight is a concept
    dimension's evidence for the term; ``"dense"`` on the dense embeddings (dense reference).
    The similarity terms (``alpha``, ``gamma``) use the same representation: cosine of the
    query code (codes) or of the query embedding (dense).
    """

    requires: ClassVar[tuple[str, ...]] = ("reference",)
    params: ClassVar[dict[str, Any]] = {
        "features": "codes",
        "l2": 1e-3,
        "beta": 1.0,
        "alpha": 0.0,
        "gamma": 0.0,
        "mention_rate": 1.0,
        "rate": "global",
        "scale": 10.0,
        "min_positives": 10,
        "head_ratio": 0.1,
    }

    @classmethod
    def kind_of(cls, defaults: Mapping[str, Any]) -> str:
        """Sparse on codes (``features="codes"``, the default), dense on embeddings."""
        return "sparse" if defaults.get("features", "codes") == "codes" else "dense"

    def __init__(self, ctx: ExclusionContext, **params: Any) -> None:
        super().__init__(ctx, **params)
        feats = self.p["features"]
        if feats not in ("codes", "dense"):
            raise SparsemmError(f"detector features must be 'codes' or 'dense', not {feats!r}")
        ref = ctx.reference
        assert ref is not None
        if feats == "codes":
            ctx.require("codes", "text_encoder", "query_coder")
            if ref.codes is None:
                raise SparsemmError("the reference set has no sparse codes for the detector")
        else:
            ctx.require("dense", "text_encoder")
            if ref.dense is None:
                raise SparsemmError("the reference set has no dense embeddings for the detector")

    @property
    def kind(self) -> str:  # type: ignore[override]
        return "sparse" if self.p["features"] == "codes" else "dense"

    def _features(self, which: str) -> Any:
        """Scaled unit-normalised features of the reference set or the evaluation items."""
        ref = self.ctx.reference
        assert ref is not None
        if self.p["features"] == "codes":
            if which == "ref":
                assert ref.codes is not None
                return normalize_csr(ref.codes) * self.p["scale"]
            return self.ctx.codes_unit * self.p["scale"]
        if which == "ref":
            assert ref.dense is not None
            return normalize_rows(ref.dense) * self.p["scale"]
        assert self.ctx.items_dense is not None
        return self.ctx.items_dense * self.p["scale"]

    def _query(self, term: str) -> np.ndarray:
        """The term's unit query vector in the feature space (code or embedding)."""
        if self.p["features"] == "codes":
            return normalize_rows(self.ctx.term_code(term))
        return self.ctx.term_embedding(term)

    def similarity(self, term: str) -> np.ndarray:
        """(n_items,) cosine of the term's query with the evaluation items (cached)."""
        key = ("similarity", self.p["features"], term)
        if key not in self.ctx.cache:
            if self.p["features"] == "codes":
                sim = self.ctx.code_scores(self.ctx.term_code(term))
            else:
                assert self.ctx.items_dense is not None
                sim = self.ctx.items_dense @ self.ctx.term_embedding(term)
            self.ctx.cache[key] = np.asarray(sim, dtype=np.float64)
        out: np.ndarray = self.ctx.cache[key]
        return out

    def _key(self) -> tuple[Any, ...]:
        p = self.p
        return ("detector", p["features"], p["l2"], p["scale"], p["min_positives"], p["head_ratio"])

    def targets(self, term: str, x_ref: Any) -> np.ndarray:
        """(m,) {0, 1} training targets of ``term`` over the reference items."""
        ref = self.ctx.reference
        assert ref is not None
        need = int(self.p["min_positives"])
        y = ref.mentions(term, need, self.p["head_ratio"])
        if y.sum() < need:
            sim = np.asarray(x_ref @ self._query(term), dtype=np.float64).ravel()
            y = np.zeros(len(y), dtype=bool)
            y[top_rows(sim, need)] = True
            logger.debug("term %r: too few caption mentions, using %d pseudo-positives", term, need)
        return y

    def fit(self, terms: Iterable[str]) -> None:
        """Fit (and cache) the detectors of every term not fitted yet, in one batch.

        Stores per term (weights, bias, c_hat) with c_hat the Elkan-Noto estimate of the
        term's mention rate: the mean fitted P(mention | x) over the mentioned reference
        items (Elkan & Noto 2008, "Learning classifiers from only positive and unlabeled
        data", KDD).
        """
        store: dict[str, tuple[np.ndarray, float, float]] = self.ctx.cache.setdefault(
            self._key(), LRUCache(self.ctx.cache_size)
        )
        todo = [t for t in dict.fromkeys(terms) if t not in store]
        if not todo:
            return
        x = self._features("ref")
        xd = x.toarray() if sp.issparse(x) else x
        y = np.stack([self.targets(t, x) for t in todo], axis=1)
        w, b = fit_detectors(xd, y, l2=self.p["l2"])
        prob = 1.0 / (1.0 + np.exp(-(xd @ w + b)))  # (m, T)
        for j, t in enumerate(todo):
            c_hat = float(prob[y[:, j], j].mean()) if y[:, j].any() else 1.0
            store[t] = (w[:, j], float(b[j]), c_hat)
        logger.debug("fitted %d term detectors (%s)", len(todo), self.p["features"])

    def prepare(self, terms: Iterable[str]) -> None:
        terms = list(terms)
        super().prepare(terms)
        self.fit(terms)

    def logits(self, term: str) -> np.ndarray:
        """(n_items,) detector logits of ``term`` for the evaluation items."""
        self.fit([term])
        key = (*self._key(), "logits", term)
        if key not in self.ctx.cache:
            w, b, _ = self.ctx.cache[self._key()][term]
            z = self._features("items") @ w
            self.ctx.cache[key] = np.asarray(z, dtype=np.float64).ravel() + b
        out: np.ndarray = self.ctx.cache[key]
        return out

    def weights(self, term: str) -> tuple[np.ndarray, float]:
        """The term detector's (d,) weights over code dims (or dense dims) and bias."""
        self.fit([term])
        w, b, _ = self.ctx.cache[self._key()][term]
        return w, b

    def log_absent(self, term: str) -> np.ndarray:
        """(n_items,) log P(term absent | x) = log(1 - P(mention | x) / c).

        Captions mention only some of the objects present (positive-unlabelled targets): if
        a present term is mentioned with probability c independently of x, then
        P(present | x) = P(mention | x) / c. ``rate="global"``: c = ``mention_rate`` for
        every term (1 trusts mentions as presence); ``rate="pu"``: c = ``mention_rate`` x
        the term's Elkan-Noto estimate (see :meth:`fit`).
        """
        c = self.mention_rate(term)
        key = (*self._key(), "log_absent", term, c, self.detector_source)
        if key not in self.ctx.cache:
            if c >= 1.0:
                val = log_sigmoid(-self.logits(term))
            else:
                present = np.exp(log_sigmoid(self.logits(term))) / max(c, 1e-3)
                val = np.log(np.clip(1.0 - present, 1e-6, 1.0))
            self.ctx.cache[key] = val
        out: np.ndarray = self.ctx.cache[key]
        return out

    @property
    def detector_source(self) -> str:
        """Where this strategy's detectors come from: "fit" (query time, reference set)."""
        return "fit"

    def mention_rate(self, term: str) -> float:
        """c of P(present | x) = P(mention | x) / c: ``mention_rate``, times the term's
        Elkan-Noto estimate with ``rate="pu"``."""
        c = float(self.p["mention_rate"])
        if self.p["rate"] == "pu":
            self.fit([term])
            c *= self.ctx.cache[self._key()][term][2]
        elif self.p["rate"] != "global":
            raise SparsemmError(f"detector rate must be 'global' or 'pu', not {self.p['rate']!r}")
        return c

    def scores(self, a: str, b: str) -> np.ndarray:
        s = log_sigmoid(self.logits(a)) + self.p["beta"] * self.log_absent(b)
        if self.p["alpha"]:
            s = s + self.p["alpha"] * self.similarity(a)
        if self.p["gamma"]:
            s = s - self.p["gamma"] * self.similarity(b)
        return s


class Hybrid(Detector):
    """The default scorer: one model of a whole query, for label pairs and sentences alike.

    For include terms I (read as one text) and excluded terms B_1..B_m::

        alpha cos(code(I), x) + delta sum_{t in I, t has a detector} log P(t | x)
            + beta sum_{j: B_j has a detector} log(1 - P(B_j | x) / c_j)
            - gamma sum_j cos(code(B_j), x)

    (``alpha_phrase`` replaces alpha when no include term has a detector: a sentence's
    phrase.) A term *has a detector* when it is label-like (at most ``max_words`` words)
    and at least ``min_positives`` reference items' captions (or labels) mention it; its
    detector is the :class:`Detector`'s (caption-mention logistic regression, positive-unlabelled
    correction c_j). A sentence's include ("man making pizza in a kitchen") has no detector
    and is scored by its code's similarity alone; an excluded word without one (or any
    term, on a collection without captions) falls back to code arithmetic. With nothing
    included, items are ranked by absence. Summing over excluded terms is log P(none of
    them present) for independent detectors.
    """

    requires = ("codes", "text_encoder", "query_coder")
    params: ClassVar[dict[str, Any]] = {
        **Detector.params,
        # alpha, beta, gamma, delta: chosen by `sparsemm bench negation --tune` on the COCO
        # caption-proxy train split (label-pair AP@10 + sentence R@5 under both violation
        # bars; docs/negation.md).
        "alpha": 5.0,
        "beta": 1.0,
        "delta": 2.0,
        "gamma": 3.0,
        # Weight of cos(code(I), x) when no include term has a detector (a sentence's
        # phrase, or a word the reference captions never mention): its similarity is then
        # all the include evidence there is (None: alpha).
        "alpha_phrase": 20.0,
        "max_words": 3,
        # Leave out items whose exclusion evidence is decisive: P(B present | x) >= drop
        # for a term with a detector; for one without, similarity to B at least that to the
        # include. 0 turns it off (a purely soft ranking).
        "drop": 0.0,
    }

    def __init__(self, ctx: ExclusionContext, **params: Any) -> None:
        # Detectors are optional here: without a captioned reference set every term falls
        # back to code similarity (a collection without captions).
        Strategy.__init__(self, ctx, **params)
        if self.p["features"] not in ("codes", "dense"):
            raise SparsemmError(
                f"hybrid features must be 'codes' or 'dense', not {self.p['features']!r}"
            )
        if self.p["features"] == "dense":
            ctx.require("dense")

    @property
    def kind(self) -> str:  # type: ignore[override]
        return "sparse" if self.p["features"] == "codes" else "dense"

    @property
    def model_detectors(self) -> ConceptDetectors | None:
        """The model's own detectors, used instead of query-time fits when present."""
        return self.ctx.detectors if self.p["features"] == "codes" else None

    @property
    def detector_source(self) -> str:
        return "fit" if self.model_detectors is None else "model"

    def has_detector(self, term: str) -> bool:
        """True when ``term`` is label-like and has a detector: in the model's vocabulary
        when the model has detectors, else mentioned by enough reference captions."""
        model = self.model_detectors
        if model is not None:
            return bool(term) and len(term.split()) <= int(self.p["max_words"]) and term in model
        ref = self.ctx.reference
        if ref is None or (ref.codes is None and self.p["features"] == "codes"):
            return False
        if not term or len(term.split()) > int(self.p["max_words"]):
            return False
        key = ("has_detector", term, int(self.p["min_positives"]), self.p["head_ratio"])
        if key not in self.ctx.cache:
            hits = ref.mentions(term, int(self.p["min_positives"]), self.p["head_ratio"])
            self.ctx.cache[key] = bool(hits.sum() >= int(self.p["min_positives"]))
        return bool(self.ctx.cache[key])

    def prepare(self, terms: Iterable[str]) -> None:
        terms = list(terms)
        Strategy.prepare(self, terms)
        if self.model_detectors is None:
            self.fit([t for t in terms if self.has_detector(t)])

    def logits(self, term: str) -> np.ndarray:
        model = self.model_detectors
        if model is None:
            return super().logits(term)
        key = ("model_logits", term)
        if key not in self.ctx.cache:
            self.ctx.cache[key] = model.logits(self.ctx.codes_unit, term)
        out: np.ndarray = self.ctx.cache[key]
        return out

    def mention_rate(self, term: str) -> float:
        model = self.model_detectors
        if model is None:
            return super().mention_rate(term)
        c = float(self.p["mention_rate"])
        if self.p["rate"] == "pu":
            c *= model.column(term)[2]
        return c

    def scores(self, a: str, b: str) -> np.ndarray:
        return self.score_query([a] if a else [], [b] if b else [])

    def present(self, term: str) -> np.ndarray:
        """(n_items,) P(term present | x) = P(mention | x) / c (clipped to [0, 1])."""
        c = self.mention_rate(term)
        prob = np.exp(log_sigmoid(self.logits(term)))
        return np.clip(prob / max(c, 1e-3), 0.0, 1.0)

    def include_alpha(self, include: Sequence[str]) -> tuple[float, list[str]]:
        """(weight of the include similarity, the include terms that have a detector):
        ``alpha``, or ``alpha_phrase`` when none has one (a sentence's phrase)."""
        detected = [t for t in include if self.has_detector(t)]
        p = self.p
        alpha = p["alpha"] if detected or p["alpha_phrase"] is None else p["alpha_phrase"]
        return float(alpha), detected

    def detector_weights(self, term: str) -> np.ndarray:
        """(d,) float64 per-dimension weights of ``term``'s detector over unit codes (its
        logit is their inner product with the item's unit code, plus a bias)."""
        model = self.model_detectors
        w = model.column(term)[0] if model is not None else self.weights(term)[0] * self.p["scale"]
        return np.asarray(w, dtype=np.float64)

    def score_query(self, include: Sequence[str], exclude: Sequence[str]) -> np.ndarray:
        p = self.p
        s = np.zeros(self.ctx.n_items)
        sim_i = None
        if include:
            sim_i = self.similarity(" and ".join(include))
            alpha, detected = self.include_alpha(include)
            s = s + alpha * sim_i
            if p["delta"]:
                for t in detected:
                    s = s + p["delta"] * log_sigmoid(self.logits(t))
        drop = np.zeros(self.ctx.n_items, dtype=bool)
        for b in exclude:
            detector = self.has_detector(b)
            if p["beta"] and detector:
                s = s + p["beta"] * self.log_absent(b)
            sim_b = self.similarity(b) if p["gamma"] or (p["drop"] and not detector) else None
            if p["gamma"]:
                assert sim_b is not None
                s = s - p["gamma"] * sim_b
            if p["drop"] and sim_i is not None:
                if detector:
                    drop |= self.present(b) >= p["drop"]
                else:
                    assert sim_b is not None
                    drop |= (sim_b >= sim_i) & (sim_b > 0)
        return np.where(drop, -np.inf, s)

    def evidence(
        self, term: str, excluded: bool = False
    ) -> tuple[str, np.ndarray, np.ndarray, list[str]]:
        """(kind, (n,) value per item, (d,) per-dimension weight, []) of one query term, as
        :meth:`Match.evidence <sparsemm.query.strategies.match.Match.evidence>` gives them:
        "detector", P(term present | item) from its detector, or "code similarity" (no
        detector for the word), the cosine of its query code with the item's code."""
        if self.has_detector(term):
            return "detector", self.present(term), self.detector_weights(term), []
        code = normalize_rows(self.ctx.term_code(term))
        return "code similarity", self.similarity(term), np.asarray(code, dtype=np.float64), []

    # -- served: a store's items, ranked without reading every code -------------------------
    def rank_store(
        self,
        source: Store,
        query: Query,
        k: int = 10,
        offset: int = 0,
        *,
        candidates: int = 256,
        max_candidates: int = 65536,
        proxy_dims: int = 256,
        fetch: int | None = None,
        nonnegative: bool | None = None,
        unit_lists: UnitLists | None = None,
    ) -> ServedResult:
        """Top ``k`` items after ``offset`` of ``query``, as ranking every item would rank them,
        from the items of ``source`` (:mod:`~sparsemm.query.strategies.ranking`; the bound is
        the module docstring's). This strategy's context supplies the encoders, text caches
        and model detectors; its own items are not read. ``candidates``: the first pool per
        list, grown fourfold up to ``max_candidates`` until the result is certified;
        ``fetch``: rows each index search returns (None: the largest pool size within 0.2%
        of the items and :data:`~sparsemm.query.strategies.ranking.FETCH_MAX`);
        ``nonnegative``: whether the source's codes have no negative value (None: ask the
        source; a source that cannot vouch is scanned, as are queries :func:`_bounded`
        refuses). A result the largest pool does not prove comes back with
        ``certified=False``; ``unit_lists`` are the match scorer's and not read here."""
        check_pool(k, offset, candidates, max_candidates)
        want = offset + k
        if nonnegative is None:
            nonnegative = source.nonnegative
        if not (nonnegative and _bounded(self, query)):
            return scan_rank(source, self.ctx, query, self, k, offset)
        va, vp, bias = _proxy_vectors(self, query)
        lists = [ProxyList(*cut(va, proxy_dims), 0.0)]
        if vp is not None:
            lists.append(ProxyList(*cut(vp, proxy_dims), bias))
        norms = float(np.linalg.norm(va)) + (float(np.linalg.norm(vp)) if vp is not None else 0.0)
        margin = MARGIN * (1.0 + norms)
        n = max(candidates, want)
        fetch, cap = pool_sizes(len(source), n, fetch, max_candidates)
        rounds = 0
        pool = Pool(source.dim, want)  # rows rescored so far (every round's lists)
        while True:
            rounds += 1
            # The lists are searched one at a time: when the first (A) already certifies the
            # result, the second index search is skipped (on the collages A alone certifies 88
            # of 90 label pairs at 100k items: the detector logits make P's bound loose).
            bound = np.inf
            bound_exact = np.inf  # the same without the quantised searches' err
            grow = min(n * 4, max_candidates)
            last = n >= max_candidates or n >= len(source)  # the pool cannot grow
            for i, plist in enumerate(lists):
                if i and not plist.searches and not last and lists[0].asked >= grow:
                    # The first list's pool can still grow within the rows it fetched, which
                    # costs rescoring only; this list's first search costs a scan of its
                    # posting lists. So the pool grows first (1M COCO label pairs: A at 1,024
                    # rows mostly certifies what A at 256 did not).
                    break
                rows, list_bound = plist.top(source, n, fetch, cap)
                bound = min(bound, list_bound)
                bound_exact = min(bound_exact, list_bound - plist.used_err)
                pool.add(source, self, query, rows)
                kth = pool.kth
                certified = bool(bound == -np.inf or kth > bound + margin)
                if certified:
                    break
            err_lists = [p for p in lists if p.used_err > 0 and p.quantized]
            if (
                not certified
                and err_lists
                and kth > bound_exact + margin
                and (last or any(grow > p.asked for p in err_lists))
            ):
                # The err alone stood in the way, and a larger pool would need a new search (or
                # there is none): the same pool from exact searches costs less (no larger
                # search, 4x fewer rows to rescore). A quantised n-th score is within err of
                # the exact one, so this is a guess; a result still not certified grows its
                # pool as usual. A larger pool within the rows already fetched is only
                # rescoring, so that one grows.
                for plist in err_lists:
                    plist.exact(source)
                rounds -= 1
                continue
            if certified or n >= max_candidates or n >= len(source):
                searches = sum(p.searches for p in lists)
                return pool.served(certified, rounds, "two-stage", searches, offset)
            n = min(n * 4, max_candidates)
            if n * SCAN_SHARE >= len(source):
                # rescoring a quarter of the items costs about what reading them all does, and
                # the scan is exact by construction (no certificate needed)
                return scan_rank(source, self.ctx, query, self, k, offset)


_DETECTOR_GRID: dict[str, Sequence[Any]] = {
    "beta": [1.0, 2.0, 4.0],
    "alpha": [0.0, 5.0],
    "gamma": [0.0, 3.0, 6.0, 10.0],
    "rate": ["pu"],
    "mention_rate": [1.0, 0.7, 0.5],
    "head_ratio": [0.0, 0.1],
}


def _bounded(strat: Strategy, query: Query) -> bool:
    """True when :meth:`Hybrid.rank_store` can certify ``query`` from index candidates."""
    if not isinstance(strat, Hybrid) or strat.p["features"] != "codes" or not query.include:
        return False
    # Query-time detector fits read every reference item; the model's own are linear.
    return strat.model_detectors is not None or strat.ctx.reference is None


def _unit(v: np.ndarray) -> np.ndarray:
    return np.asarray(normalize_rows(np.asarray(v, dtype=np.float32)), dtype=np.float64)


def _proxy_vectors(strat: Hybrid, query: Query) -> tuple[np.ndarray, np.ndarray | None, float]:
    """(v_A (d,), v_P (d,) or None, bias of P): the two linear upper bounds of the module
    docstring. v_P is None when no include term has a detector (then s <= A alone)."""
    ctx, p = strat.ctx, strat.p
    alpha, detected = strat.include_alpha(query.include)
    va = alpha * _unit(ctx.term_code(query.include_text))
    if p["gamma"]:
        for b in query.exclude:
            va = va - p["gamma"] * _unit(ctx.term_code(b))
    if not (p["delta"] and detected):
        return va, None, 0.0
    # Only a model's detectors are linear in the code (see :func:`_bounded`): a context
    # without them and without a reference set has no detected terms.
    model = strat.model_detectors
    assert model is not None
    vp = va.copy()
    bias = 0.0
    for t in detected:
        w_t, b_t, _ = model.column(t)
        vp = vp + p["delta"] * np.asarray(w_t, dtype=np.float64)
        bias += p["delta"] * b_t
    return va, vp, float(bias)


register_strategy(
    "dense_detector",
    Detector,
    "dense: caption-word detectors on dense embeddings, log P(A) + beta log(1 - P(B)) + ...",
    grid={"l2": [1e-3, 1e-2], **_DETECTOR_GRID},
    features="dense",
)
register_strategy(
    "hybrid",
    Hybrid,
    "sparse (the default before match): alpha cos(code(include), x) + detectors where a "
    "term has one; excluded terms by detector absence, else code arithmetic",
)
register_strategy(
    "detector",
    Detector,
    "sparse: caption-word detectors on sparse codes, log P(A) + beta log(1 - P(B)) + ...",
    grid={"l2": [1e-2, 3e-2], **_DETECTOR_GRID},
    features="codes",
    # Defaults = the values tuned on the COCO caption-proxy train split (docs/results.md), so that
    # `sparsemm search --strategy detector` uses them; the benchmark re-tunes over the grid.
    l2=1e-2,
    beta=2.0,
    alpha=5.0,
    gamma=10.0,
    rate="pu",
    mention_rate=1.0,
    head_ratio=0.1,
)
