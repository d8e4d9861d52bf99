"""Search one indexed collection: :class:`Searcher`, the Python API every front end calls.

A :class:`Searcher` is an :class:`~sparsemm.query.handle.IndexedCollection` (the collection,
its index or another store holding the same codes, the model the index names) that answers
parsed queries ("A but not B", several excluded terms allowed) with the model's default
strategy (``match``: a calibrated match probability per item, served through the index by
its own :meth:`~sparsemm.query.strategies.match.Match.rank_store`) or any registered one.
Terms are checked first (:meth:`Searcher.check_terms` refuses a term that means nothing
to the model, :meth:`Searcher.unknown_words` names words no vocabulary holds), each hit is
explained (:mod:`sparsemm.query.hits`), and "more like this" puts a picture's code on the
include side (:mod:`sparsemm.query.like`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.query.hits import (
    Answer,
    ExcludedCheck,
    Explainer,
    Hit,
    MatchedConcept,
    explained_hits,
    explainer,
    stale_notes,
)
from sparsemm.query.index_engine import filter_search
from sparsemm.query.like import like_term, without_excluded_self
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.request import (
    MATCH_THRESHOLD,
    SHOWN_SLACK,
    QueryRequest,
    check_page,
    min_score_refusal,
    reaches,
)
from sparsemm.query.strategies import (
    Hybrid,
    Match,
    Strategy,
    StrategySpec,
    available_strategies,
    get_spec,
)
from sparsemm.query.strategies.ranking import ServedResult, rank_query
from sparsemm.query.term_checks import TermChecks


class Searcher(TermChecks):
    """Answer queries over one indexed collection (see the module docstring)."""

    last_served: ServedResult | None = None  # how the last search was served (index path)

    # -- search ----------------------------------------------------------------------------
    def count_matches(
        self, query: str | Query, threshold: float = MATCH_THRESHOLD, strategy: str | None = None
    ) -> int | None:
        """How many items have a match probability of at least ``threshold`` (exactly, with
        the index's bounds: :meth:`~sparsemm.query.strategies.match.Match.count_store`);
        None when the strategy's scores are not probabilities."""
        if not self.probabilistic(strategy):
            return None
        return self._count(query if isinstance(query, Query) else parse_query(query), threshold)

    def _count(self, q: Query, threshold: float) -> int:
        """:meth:`count_matches` for the match scorer: P shown at ``threshold`` or more."""
        self.check_terms(q, "match")
        threshold -= SHOWN_SLACK  # as percent() shows them (request.reaches)
        if self.served("match"):
            return self.match_strategy().count_store(
                self.store, q, threshold,
                nonnegative=self.index.nonnegative, unit_lists=self.unit_lists,
            )  # fmt: skip
        strat = self.match_strategy(self.context)
        return int((strat.probability(q.include, q.exclude) >= threshold).sum())

    def prepare(self, query: str | Query, strategy: str | None = None, **params: Any) -> None:
        """Encode (and code) ``query``'s texts into the text caches without ranking: what
        :meth:`search` would encode first, with the same errors for bad terms. A server
        calls it before taking a search lane, so the texts of many waiting requests are
        encoded in shared batches while the lanes rank other queries."""
        q = query if isinstance(query, Query) else parse_query(query)
        strategy = strategy or self.default_strategy
        if strategy not in available_strategies():
            return  # search() names it
        if strategy == "match":
            self.check_terms(q, "match")
            return
        kind = "sparse" if self.served(strategy, **params) else get_spec(strategy).kind
        if kind == "dense" and self.dense is None:
            return  # search() explains it
        self.check_terms(q, kind)

    def answer(self, request: QueryRequest) -> Answer:
        """Run one :class:`~sparsemm.query.request.QueryRequest` as every front end does:
        the hits (by the model's default scorer unless the request names another, or like
        an item or image), then what a person reading them needs: whether the scores are
        match probabilities, the hits at ``min_score`` or more and how many items in all
        reach it, how the terms were read, words no vocabulary holds, and whether the index
        path proved the hits exact."""
        q, k, offset = request.query, request.k, request.offset
        name = request.strategy or ("filter" if request.engine == "index" else None)
        spec = self.strategy_spec(name)
        served = None
        if request.engine == "index" or (
            self.store is not self.index and not self.served(spec.name)
        ):
            if self.store is not self.index and (spec.name != "filter" or offset):
                raise SparsemmError(
                    f"--backend {self.store.backend} serves the default ({self.default_strategy}"
                    ", with a model that has detectors: `sparsemm train detectors`) and "
                    "--strategy filter without --offset"
                )
            hits = self.search_index(q, k=k)
        elif request.like is not None:
            if spec.kind == "dense":
                raise SparsemmError(
                    f"strategy {spec.name!r} ranks text embeddings; a like-query is a sparse "
                    "code (use the default or another sparse strategy)"
                )
            by_id = isinstance(request.like, str) and not Path(request.like).is_file()
            # an item may be left out of its own "more like" list (_without_excluded_self):
            # then rank one more from the top, so the page holds k hits at the right ranks
            own = self.row_of(request.like) if by_id and q.exclude else None
            want, first = (offset + k + 1, 0) if own is not None else (k, offset)
            with like_term(self, request.like) as term:
                hits, served = self._ranked(Query((term,), q.exclude), spec, want, first, {})
            if own is not None:
                hits = without_excluded_self(hits, own)[offset : offset + k]
                for i, h in enumerate(hits):
                    h.rank = offset + i + 1
        else:
            hits, served = self._ranked(q, spec, k, offset, {})
        hits = [h for h in hits if math.isfinite(h.score)]
        prob = bool(getattr(spec.cls, "probabilistic", False))
        if request.min_score is not None and not prob:
            raise SparsemmError(min_score_refusal(spec.name, self.default_strategy))
        if request.min_score is not None:
            hits = [h for h in hits if reaches(h.score, request.min_score)]
        threshold = matches = None
        if prob and request.like is None and (request.count or request.min_score is not None):
            threshold = request.min_score if request.min_score is not None else MATCH_THRESHOLD
            matches = self._count(q, threshold)
        notes, unknown = self._read_terms(q, spec.name)
        notes = notes if request.like is None else []
        if (
            request.like is None
            and spec.name == "match"
            and (request.min_score is None or not hits)
        ):
            notes += [n for n in (self.empty_note(q, offset + len(hits), k, offset),) if n]
        certified = served is None or served.certified
        if served is not None and not served.certified:
            notes.append(
                f"the index path stopped at {served.candidates} candidates before proving "
                "these are the exact top results (very large collections); they are the best "
                "of those"
            )
        return Answer(
            query=q,
            strategy=spec.name,
            hits=hits,
            probabilistic=prob,
            min_score=request.min_score,
            threshold=threshold,
            matches=matches,
            certified=certified,
            notes=[*notes, *stale_notes(self.collection, hits)],
            unknown_words=unknown,
            total=len(self.collection.items),
        )

    def search(
        self,
        query: str | Query,
        k: int = 10,
        strategy: str | None = None,
        exclude: tuple[str, ...] = (),
        offset: int = 0,
        **params: Any,
    ) -> list[Hit]:
        """Top ``k`` hits (after ``offset``) for a query; several excluded terms all apply.
        ``strategy`` defaults to the model's (``match`` for SR and the concept models,
        ``code_arith`` for VDR).

        The default scorer is served through the index (:meth:`served`: candidates, then
        exact rescoring, certified equal to ranking every item); other strategies rank
        every item with :func:`sparsemm.query.strategies.ranking.rank_query`, the function
        the benchmarks use. Raises SparsemmError for bad input, including a term the model
        knows nothing about (:meth:`check_terms`). :meth:`answer` is the same search with
        what the front ends show around the hits."""
        check_page(k, offset)
        q = query if isinstance(query, Query) else parse_query(query, exclude=exclude)
        return self._ranked(q, self.strategy_spec(strategy), k, offset, params)[0]

    def _ranked(
        self, q: Query, spec: StrategySpec, k: int, offset: int, params: dict[str, Any]
    ) -> tuple[list[Hit], ServedResult | None]:
        """The hits of a checked query and strategy, with how the index path served them
        (None: ranked over every code in memory)."""
        served = self.served(spec.name, **params)
        res: ServedResult | None = None
        # the scorer, built once: over the text context when it ranks the store's items
        # (the match scorer without parameters is the handle's own), else over every item
        strat: Strategy = (
            self.match_strategy()
            if served and spec.name == "match" and not params
            else spec.build(self.text_context if served else self.context, **params)
        )
        self.check_terms(q, "match" if isinstance(strat, Match) else strat.kind)
        if served:  # match, or hybrid on codes; a remote store holds the same codes
            assert isinstance(strat, Match | Hybrid)
            res = strat.rank_store(
                self.store, q, k, offset,
                nonnegative=self.index.nonnegative, unit_lists=self.unit_lists,
            )  # fmt: skip
            rows, scores, codes = res.rows, res.scores, res.codes
            # the hits' evidence: a scorer over just the codes the ranking rescored
            strat = strat.over(codes)
        else:
            rows, scores = rank_query(self.context, q, strat, k=k, offset=offset)
            codes = self.codes[np.asarray(rows, dtype=np.int64)]
        self.last_served = res
        if isinstance(strat, Match):
            # the probability itself, not the rank key (P at 1% with ties broken)
            p = strat.probability(q.include, q.exclude)
            scores = p if served else p[np.asarray(rows, dtype=np.int64)]
        return self._explained(q, strat, rows, scores, codes, offset, served), res

    def _explained(
        self, q: Query, strat: Any, rows: Any, scores: Any, codes: Any, offset: int, at: bool
    ) -> list[Hit]:
        """The hits of ranked rows, explained (:func:`~sparsemm.query.hits.explained_hits`;
        ``at``: the strategy's context holds just these rows)."""
        why = self._explainer(q, strat if isinstance(strat, Match) else None)
        return explained_hits(q, strat, rows, scores, codes, offset, at, self.collection.items, why)

    def _explainer(self, q: Query, match: Match | None = None, n_dims: int = 5) -> Explainer:
        """What explaining hits of ``q`` needs (:func:`~sparsemm.query.hits.explainer`),
        with the match scorer's readings when it is the model's default."""
        if self.default_strategy != "match":
            match = None
        elif match is None:
            match = self.match_strategy()
        return explainer(q, self.text_context, self.dim_labels, self.model.detectors, match, n_dims)

    def explain(
        self, row: int, q: Query, n_dims: int = 5
    ) -> tuple[list[MatchedConcept], list[ExcludedCheck]]:
        """Matched concepts (top q_j x_j over the include code) and excluded-term checks."""
        return self._explainer(q, n_dims=n_dims).explain(self.item_code(row), 0)

    def search_index(
        self, query: str | Query, k: int = 10, exclude: tuple[str, ...] = (), **params: Any
    ) -> list[Hit]:
        """Strategy ``filter`` through the inverted index
        (:func:`~sparsemm.query.index_engine.filter_search`)."""
        q = query if isinstance(query, Query) else parse_query(query, exclude=exclude)
        self.check_terms(q, "sparse")
        strat, rows, scores = filter_search(self, q, k, **params)
        return self._explained(q, strat, rows, scores, self.item_codes(rows), 0, True)

    def search_like(
        self,
        like: Any,
        exclude: tuple[str, ...] = (),
        k: int = 10,
        strategy: str | None = None,
        offset: int = 0,
    ) -> list[Hit]:
        """ "More like this, but not X": rank with ``like``'s code
        (:func:`~sparsemm.query.like.like_code`) as the include side and ``exclude``
        applied, through the same scorer as a text query.

        The code stands in for an include term's query code (a pseudo-term, named
        "like: LABEL", whose cached code is the item code): the served ``match`` scores
        ``cos(code, x) prod_B (1 - P(B | x))`` (``hybrid``: ``alpha cos(code, x) - gamma
        sum_B cos(q_B, x) + beta sum_B log(1 - P(B | x) / c_B)``), through the same
        certified index path as text. Dense strategies are refused: the code is not a text
        embedding.
        """
        query = Query((), tuple(exclude)) if exclude else Query.empty()
        request = QueryRequest(query, k, offset, strategy, like)
        return self.answer(request).hits

    def explain_like(
        self, row: int, like: Any, exclude: tuple[str, ...] = (), n_dims: int = 5
    ) -> tuple[list[MatchedConcept], list[ExcludedCheck]]:
        """:meth:`explain` for a like-query: the concepts item ``row`` shares with ``like``."""
        with like_term(self, like) as term:
            return self.explain(row, Query((term,), tuple(exclude)), n_dims)
