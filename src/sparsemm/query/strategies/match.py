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
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.query.scorers import (
    DetectorScorer,
    TermBound,
    TermReading,
    TermScorer,
    detector_scorer,
    no_concept,
    refuse_self_exclusion,
    unit_codes_scorer,
)
from sparsemm.query.strategies.base import Strategy
from sparsemm.query.strategies.context import CHECK_BATCH, ExclusionContext
from sparsemm.query.strategies.ranking import (
    MARGIN,
    SCAN_ROWS,
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
from sparsemm.text import tokenize

if TYPE_CHECKING:
    from sparsemm.index.store import Store
    from sparsemm.query.parse import Query
    from sparsemm.query.unit_lists import UnitLists

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

    def check_query(self, include: Sequence[str], exclude: Sequence[str]) -> None:
        """Raise SparsemmError for a term this scorer (over the text context) cannot read: no
        letter or digit, nothing the model can see (UnknownTerm, with the closest concepts
        it knows), a phrase whose code is empty, or an excluded term that covers an included
        one. Every text the search will embed or code is encoded here in batches (the terms,
        the include text for ties, the words of the detectors a term is read through), and
        the readings are cached for the search that follows."""
        ctx = self.ctx
        readings = []
        for side, terms in (("search for", include), ("exclude", exclude)):
            for term in terms:
                if not any(ch.isalnum() for ch in term):
                    raise no_concept(term, side)
                readings.append((side, term, self.reading(term)))
        texts = [*include, *exclude]
        if include:
            texts.append(self.tie_text(include))
        for _, _, reading in readings:
            texts.extend(self.scorer.texts(reading))
        ctx.prefetch(texts, codes=ctx.query_coder is not None, batch=CHECK_BATCH)
        for side, term, reading in readings:
            if reading.kind == "similarity" and not np.any(ctx.term_code(term)):
                raise no_concept(term, side)
        refuse_self_exclusion(readings, self.scorer.vocabulary)

    def read_notes(self, terms: Sequence[str]) -> tuple[list[str], set[str]]:
        """(what the model says about how it read ``terms``, "'woman' is searched as
        'person': ...", and the words of terms read as concepts: through the hierarchy, not
        as subword pieces). Terms it cannot read are skipped."""
        notes: list[str] = []
        read: set[str] = set()
        for t in terms:
            try:
                reading = self.reading(t)
            except SparsemmError:
                continue
            notes += [n for n in reading.notes if n not in notes]
            if reading.kind == "concepts":
                read.update(tokenize(t))
        return notes, read

    def reading_dims(self, term: str, excluded: bool = False) -> list[int] | None:
        """Code dimensions ``term`` was read as, when this scorer's units are dimensions (the
        photo model: classes and the face unit, direct ones first); ``excluded``: also the
        dimensions of the parts of a photo (tiles) its evidence as a term to leave out reads.
        None for a DetectorScorer's units (detectors) or a term it cannot read."""
        if isinstance(self.scorer, DetectorScorer):
            return None
        try:
            reading = self.reading(term)
        except SparsemmError:
            return None
        dim = self.ctx.dim
        units = [
            u for c in reading.concepts for u, w in sorted(c.units, key=lambda x: -x[1]) if u < dim
        ]
        weights = getattr(self.scorer, "evidence_weights", None)
        if excluded and weights is not None:
            for c in reading.concepts:
                units += np.flatnonzero(weights(c, excluded=True)[:dim]).tolist()
        return list(dict.fromkeys(units)) or None

    def evidence(
        self, term: str, excluded: bool = False
    ) -> tuple[str, np.ndarray, np.ndarray, list[str]]:
        """(kind, (n,) P(term | item), (d,) per-dimension weight, names of the concepts it
        was read as) of one term: the dims are the reading's units (the photo model), the
        detector's weights (SR), or the phrase's query code."""
        reading = self.reading(term)
        dim = self.ctx.dim
        weight = np.zeros(dim, dtype=np.float64)
        scorer = self.scorer
        if reading.kind == "similarity":
            weight = np.asarray(normalize_rows(self.ctx.term_code(term)), dtype=np.float64)
        elif isinstance(scorer, DetectorScorer):
            for c in reading.concepts:
                for u, _ in c.units[:8]:
                    w, _, _ = scorer.detectors.column_at(u)
                    weight = np.maximum(weight, np.asarray(w, dtype=np.float64))
        else:  # units, and the tiles' dimensions of their classes (the photo model)
            weights = getattr(scorer, "evidence_weights", None)
            for c in reading.concepts:
                if weights is not None:
                    weight = np.maximum(weight, weights(c, excluded)[:dim])
                    continue
                for u, w in c.units:
                    if u < dim:
                        weight[u] = max(weight[u], w)
        names = [c.label for c in reading.concepts]
        kind = reading.source or reading.kind
        return kind, self.term_probability(term, excluded), weight, names

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

    # -- served: a store's items, ranked or counted without reading every code ---------------
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
        """Top ``k`` items after ``offset`` by the match scorer (their rank keys as scores), as
        ranking every item would give them (:mod:`~sparsemm.query.strategies.ranking`). This
        scorer's context supplies the encoders, text caches and term scorer; its own items are
        not read.

        With ``unit_lists`` (:class:`~sparsemm.query.unit_lists.UnitLists` of the model's
        detectors over this index) an include term read through detectors is bounded by its
        units' lists first, which are exact: see :func:`_served_units`. When those do not
        certify the result, every row is scanned; when the query has no such term, the code
        lists below are used.

        The match probability is at most that of any one include term, and the term scorer
        bounds a term's probability by a non-decreasing function of a few inner products of
        the code with non-negative weights (:class:`~sparsemm.query.scorers.TermBound`: one
        per detector of a concept, or the photo model's class and face units). So the include
        term with the fewest such lists is searched: each list's top ``n`` rows come from the
        index, every row in any list is rescored exactly, and an item in none of them has a
        match probability of at most value(n-th score + residual + err of each list), hence a
        rank key of at most :meth:`~sparsemm.query.strategies.match.Match.key_bound` of it.
        When the k-th rescored key beats that the result is certified; else the pool grows
        fourfold, as for ``hybrid`` (:meth:`Hybrid.rank_store
        <sparsemm.query.strategies.hybrid.Hybrid.rank_store>`), up to a scan of the row store. A
        result that the largest pool (``max_candidates``) does not prove is ranked by the scan
        too, so a served match is always exact ("A but not B" where nearly every A has B, whose
        top k sit deep below the lists' bounds). Exclusion-only queries, negative codes and
        terms without a bound are scanned.
        """
        check_pool(k, offset, candidates, max_candidates)
        units = _listed_units(self, query) if unit_lists is not None else None
        if units is not None:
            res = _served_units(source, query, self, units, unit_lists, k, offset, candidates,
                                proxy_dims, fetch, max_candidates)  # fmt: skip
            # the unit lists bound P exactly and the code lists only looser: a pool of these
            # that proves what those did not would be near a scan's cost anyway
            return res if res is not None else scan_rank(source, self.ctx, query, self, k, offset)
        if nonnegative is None:
            nonnegative = source.nonnegative
        bound = _match_bound(self, query) if nonnegative and query.include else None
        if bound is None:
            return scan_rank(source, self.ctx, query, self, k, offset)
        return _served_codes(
            source, self, query, bound, k, offset, candidates, max_candidates, proxy_dims, fetch
        )

    def count_store(
        self,
        source: Store,
        query: Query,
        threshold: float,
        *,
        candidates: int = 1024,
        proxy_dims: int = 256,
        nonnegative: bool | None = None,
        unit_lists: UnitLists | None = None,
    ) -> int:
        """How many items have P(match) >= ``threshold``, exactly: an item outside the lists of
        the most selective include term (as :meth:`rank_store` reads them: unit lists first,
        when given) has at most the bound's probability, so the lists grow until that bound is
        below the threshold and the items in them are counted; queries without such a bound
        (and pools past a quarter of the items) are counted by a scan of the row store."""
        if not 0.0 < threshold <= 1.0:
            raise SparsemmError(f"the match threshold must be in (0, 1], got {threshold}")
        if nonnegative is None:
            nonnegative = source.nonnegative

        def p_of(rows: np.ndarray) -> np.ndarray:
            sub = self.over(source.codes(rows))
            assert isinstance(sub, Match)
            return sub.probability(query.include, query.exclude)

        units = _listed_units(self, query) if unit_lists is not None else None
        if units is not None and unit_lists is not None:
            n = min(candidates, unit_lists.length)
            while True:
                listed: list[np.ndarray] = []
                bound_u = -np.inf
                for u, weight in units:
                    unit_rows, b = unit_lists.top(u, n)
                    listed.append(unit_rows)
                    bound_u = max(bound_u, weight * b) if b > -np.inf else bound_u
                if bound_u < threshold:
                    pool = np.unique(np.concatenate(listed))
                    return int((p_of(pool) >= threshold).sum()) if len(pool) else 0
                if n >= unit_lists.length:
                    break
                n = min(n * 4, unit_lists.length)

        bound = _match_bound(self, query) if nonnegative and query.include else None
        total = len(source)
        n = min(candidates, total)
        while bound is not None and n * SCAN_SHARE < total:
            norm = float(getattr(self.scorer, "code_norm", 1.0))
            tops: list[np.ndarray] = []
            bounds: list[float] = []
            for w in bound.weights:
                dims, vals, residual = cut(np.asarray(w, dtype=np.float64), proxy_dims)
                plist = ProxyList(dims, vals, residual * norm, 0.0)
                plist.quantized = False
                rows, list_bound = plist.top(source, n, n, n)
                tops.append(rows)
                bounds.append(max(0.0, list_bound))
            if bound.value(bounds) < threshold:
                rows = np.unique(np.concatenate(tops)) if tops else np.zeros(0, np.int64)
                return int((p_of(rows) >= threshold).sum()) if len(rows) else 0
            n *= 4
        count = 0
        for lo in range(0, total, SCAN_ROWS):
            count += int(
                (p_of(np.arange(lo, min(lo + SCAN_ROWS, total), dtype=np.int64)) >= threshold).sum()
            )
        return count


def _served_codes(
    source: Store,
    strat: Any,
    query: Query,
    bound: Any,
    k: int,
    offset: int,
    candidates: int,
    max_candidates: int,
    proxy_dims: int,
    fetch: int | None,
) -> ServedResult:
    """:meth:`Match.rank_store` from the code lists of one include term's probability ``bound``
    (a :class:`~sparsemm.query.scorers.TermBound`): pools grown fourfold until the k-th
    rescored key beats the key bound of an item outside them, else a scan."""
    want = offset + k
    # the tie-break is at most the include text's code similarity (times prod (1 - P(b))):
    # when that text is the bounded term itself, its lists bound the tie too
    cosine = bound.cosine if len(query.include) == 1 else None

    def key_of(list_bounds: list[float]) -> float:
        s = [max(0.0, b) for b in list_bounds]
        return strat.key_bound(bound.value(s), cosine(s) if cosine is not None else 1.0)

    norm = float(getattr(strat.scorer, "code_norm", 1.0))
    lists = []
    for w in bound.weights:
        dims, vals, residual = cut(np.asarray(w, dtype=np.float64), proxy_dims)
        lists.append(ProxyList(dims, vals, residual * norm, 0.0))
    n = max(candidates, want)
    fetch, cap = pool_sizes(len(source), n, fetch, max_candidates)
    margin = 1e-7
    rounds = 0
    pool = Pool(source.dim, want)
    while True:
        rounds += 1
        per_list = []
        exact_per_list = []
        every = False  # some list returned every item: nothing lies outside
        for plist in lists:
            rows, list_bound = plist.top(source, n, fetch, cap)
            if list_bound == -np.inf:
                every = True
            per_list.append(list_bound)
            exact_per_list.append(list_bound - plist.used_err)
            pool.add(source, strat, query, rows)
        kth = pool.kth
        if every:
            key_bound = -np.inf
        else:
            key_bound = key_of(per_list)
        certified = bool(key_bound == -np.inf or kth > key_bound + margin)
        last = n >= max_candidates or n >= len(source)
        if not certified and not every:
            exact_bound = key_of(exact_per_list)
            err_lists = [p for p in lists if p.used_err > 0 and p.quantized]
            grow = min(n * 4, max_candidates)
            if (
                err_lists
                and kth > exact_bound + margin
                and (last or any(grow > p.asked for p in err_lists))
            ):
                for plist in err_lists:  # only the quantised searches' err stood in the way
                    plist.exact(source)
                rounds -= 1
                continue
        if not certified and n >= len(source):
            # every row was asked for and some were not returned (a store leaves out rows
            # with no positive score), yet they may still score: a scan is exact
            return scan_rank(source, strat.ctx, query, strat, k, offset)
        if not certified and last:
            # the largest pool did not prove the top k: the scan is exact (a served match
            # is never returned unproven)
            return scan_rank(source, strat.ctx, query, strat, k, offset)
        if certified:
            searches = sum(p.searches for p in lists)
            return pool.served(certified, rounds, "two-stage", searches, offset)
        n = min(n * 4, max_candidates)
        if n * SCAN_SHARE >= len(source):
            return scan_rank(source, strat.ctx, query, strat, k, offset)


def _listed_units(strat: Any, query: Query) -> list[tuple[int, float]] | None:
    """The (unit, weight) pairs of the include concept read through the fewest detector
    units (P(match) <= P(concept) = max_u weight_u P(u | x)); None when no include term is
    read through an SR model's detectors."""
    if not isinstance(strat.scorer, DetectorScorer):
        return None
    best: list[tuple[int, float]] | None = None
    for t in query.include:
        reading = strat.reading(t)
        if reading.kind != "concepts":
            continue
        for c in reading.concepts:
            units = [(int(u), float(w)) for u, w in c.units]
            if units and (best is None or len(units) < len(best)):
                best = units
    return best


def _served_units(
    source: Store,
    query: Query,
    strat: Any,
    units: list[tuple[int, float]],
    lists: Any,
    k: int,
    offset: int,
    candidates: int,
    proxy_dims: int = 256,
    fetch: int | None = None,
    max_candidates: int = 65536,
) -> ServedResult | None:
    """The top ``k`` after ``offset`` from the unit lists of one include concept: the first
    ``n`` rows of each unit's list are rescored exactly; an item outside all of them has
    P(match) <= max_u weight_u ub_u(n), so when the k-th rescored key beats that key bound
    the result is exact.

    The rank key is P at 1% plus half a step times the tie-break (the include text's code
    similarity times prod (1 - P(b)), at most that similarity), and the top k of a common
    concept all sit in the top step (P >= 0.99 for thousands of items): no list short enough
    to rescore ends below that step, so the tie is bounded too. Once P's bound alone would
    certify the result with a tie of 0, the index is searched for the include text's code
    (the positive part of the unit query code, cut to ``proxy_dims`` dims as for
    ``hybrid``): an item outside its first ``m`` rows has a code similarity of at most its
    m-th score plus the cut's residual, the quantised search's err and a float32 margin, and
    an item outside both the unit lists and that list has a key of at most key_bound(P
    bound, tie bound). Each pool grows fourfold while it is what stands in the way: the unit
    lists' up to their length, the tie list's within the rows its search fetched, then by
    one larger search. None when neither can prove the top k (the caller scans)."""
    want = offset + k
    n = max(candidates, want)
    m = n  # the tie list's pool
    tie: ProxyList | None = None
    pool = Pool(source.dim, want)
    rounds = 0
    fetch, cap = pool_sizes(len(source), n, fetch, max_candidates)
    ctx = strat.ctx
    no_tie = ctx.query_coder is None  # the tie-break is 0 for every item
    while True:
        rounds += 1
        bound = -np.inf
        found = []
        for u, w in units:
            rows, b = lists.top(u, n)
            if b > -np.inf:
                bound = max(bound, w * b)
            found.append(rows)
        # one exact rescore of the round's new rows (a broad concept has tens of units)
        pool.add(source, strat, query, np.concatenate(found))
        tie_bound = 0.0 if no_tie else 1.0
        if tie is not None:
            rows, tb = tie.top(source, m, fetch, cap)
            pool.add(source, strat, query, rows)
            tie_bound = -np.inf if tb == -np.inf else min(1.0, max(0.0, tb))
        kth = pool.kth
        if bound == -np.inf or tie_bound == -np.inf:  # every item was rescored
            certified = True
        else:
            certified = kth > strat.key_bound(bound, tie_bound) + 1e-7
        if certified:
            searches = tie.searches if tie is not None else 0
            return pool.served(True, rounds, "unit lists", searches, offset)
        if len(pool) > cap:
            return None  # rescored past the largest pool and still unproven: the caller scans
        tie_blocks = kth > strat.key_bound(bound, 0.0) + 1e-7  # P's bound would do
        if n < lists.length and not tie_blocks:
            n = min(n * 4, lists.length)
            continue
        if tie is None and not no_tie:
            # the tie is in the way, or the lists ran out in the top step: the tie list
            # bounds the tie-break and brings the items that lead that step
            q = np.asarray(ctx.term_code(strat.tie_text(query.include)), dtype=np.float64)
            nrm = float(np.linalg.norm(q))
            if nrm > 0.0:
                dims, vals, residual = cut(q / nrm, proxy_dims)
                tie = ProxyList(dims, vals, residual, MARGIN)
                continue
        if tie is not None and tie_blocks and m < cap:
            if (
                tie.used_err > 0
                and tie.quantized
                and kth > strat.key_bound(bound, tie_bound - tie.used_err) + 1e-7
            ):
                tie.exact(source)  # only the quantised search's err stood in the way
            else:
                m = min(m * 4, cap)
            continue
        # P's bound stays above the k-th key past the lists (nearly every A has B), or
        # the tie list reached its largest pool
        return None


def _match_bound(strat: Any, query: Query) -> Any:
    """The include term whose probability bound reads the fewest lists (None: none has a
    bound, or nothing is included). A "more like this" picture is bounded by its code
    similarity, linear in unit codes (SR); the photo model's codes are not unit-length."""
    ctx, best = strat.ctx, None
    for t in query.include:
        reading = strat.reading(t)
        if reading.kind == "like":
            if not unit_codes_scorer(strat.scorer):
                continue
            q = np.asarray(ctx.term_code(t), dtype=np.float64)
            q = np.maximum(q / max(float(np.linalg.norm(q)), 1e-12), 0.0)
            b = TermBound((q,), lambda s: min(1.0, max(0.0, s[0])))
        else:
            b = strat.scorer.bound(reading, ctx)
        if b is not None and b.weights and (best is None or len(b.weights) < len(best.weights)):
            best = b
    return best


register_strategy(
    "match",
    Match,
    "sparse (default): P(match) = prod P(included | x) * prod (1 - P(excluded | x)), from "
    "calibrated term probabilities read through the concept hierarchy",
)
