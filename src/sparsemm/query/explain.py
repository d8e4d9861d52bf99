"""Why each hit came back: the explanations and per-term evidence a search attaches.

:func:`explainer` computes, once per query, what explaining any hit needs (the include
code, each excluded term's dimensions and words); :func:`explained_hits` builds the
:class:`~sparsemm.query.hits.Hit` of each ranked row with its matched concepts and
excluded-term checks, and the evidence of each query term: :func:`match_evidence` and
:func:`hybrid_evidence` give a term's per-item value and per-dimension weights, which
:func:`~sparsemm.query.hits.term_evidence` reads for one hit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.query.hits import Explainer, Hit, term_evidence
from sparsemm.query.parse import Query
from sparsemm.query.scorers import DetectorScorer
from sparsemm.query.strategies import HardFilter, Hybrid, Match, get_strategy

if TYPE_CHECKING:
    from sparsemm.query.handle import IndexedCollection


def explainer(h: IndexedCollection, q: Query, n_dims: int = 5) -> Explainer:
    """What explaining any hit of ``q`` needs, computed once per query: the include
    code and each excluded term's dimensions with their words: the 6 its detector
    weighs most when the model has one, else those the ``filter`` strategy drops items
    on (the active dims of the term's query code)."""
    ctx = h.text_context
    a = q.include_text
    filt: HardFilter | None = None  # built only for a term nothing else reads
    checks = []
    model = h.model.detectors
    match = h.match_strategy() if h.default_strategy == "match" else None
    for b in q.exclude:
        units = reading_dims(match, b, h.dim) if match is not None else None
        if units is not None:
            # the dims of the units the match scorer read the term as (the photo model)
            on = np.zeros(h.dim, dtype=bool)
            on[units] = True
        elif model is not None and b in model:
            # The dims the term's detector weighs most: what says "b is here".
            w = model.column(b)[0]
            on = np.zeros(len(w), dtype=bool)
            on[[j for j in np.argsort(-w, kind="stable")[:6] if w[j] > 0]] = True
        else:
            if filt is None:
                built = get_strategy("filter", ctx, dims="query")
                assert isinstance(built, HardFilter)
                filt = built
            on = filt.b_weights(a, b) > 0  # (d,) bool: the dims `filter` drops items on
        dims = [int(j) for j in np.flatnonzero(on)]
        words = sorted({w for j in dims[:3] for w in h.dim_labels[j][:2]})
        checks.append((b, dims, on, words))
    include_code = ctx.term_code(a) if a else np.zeros(h.dim, np.float32)
    if match is not None and q.include:
        dims = [u for t in q.include for u in (reading_dims(match, t, h.dim) or [])]
        if dims:  # the match scorer's own reading of the include terms
            include_code = np.zeros(h.dim, np.float32)
            include_code[dims] = 1.0
    return Explainer(include_code, checks, h.dim_labels, n_dims)


def reading_dims(match: Match, term: str, dim: int) -> list[int] | None:
    """Code dimensions a term was read as, when its units are dimensions (the photo
    model: classes and the face unit, direct ones first); None otherwise."""
    if isinstance(match.scorer, DetectorScorer):
        return None
    try:
        reading = match.reading(term)
    except SparsemmError:
        return None
    units = [
        u for c in reading.concepts for u, w in sorted(c.units, key=lambda x: -x[1]) if u < dim
    ]
    return list(dict.fromkeys(units)) or None


def match_evidence(
    strat: Match, term: str, dim: int, excluded: bool = False
) -> tuple[str, np.ndarray, np.ndarray, list[str]]:
    """(kind, (n,) P(term | item), (d,) per-dimension weight, unit names) of one term
    for the match scorer: the dims are the reading's units (the photo model), the
    detector's weights (SR), or the phrase's query code; ``dim``: the code's length."""
    reading = strat.reading(term)
    d = dim
    weight = np.zeros(d, dtype=np.float64)
    names: list[str] = []
    scorer = strat.scorer
    if reading.kind == "similarity":
        weight = np.asarray(normalize_rows(strat.ctx.term_code(term)), dtype=np.float64)
    elif isinstance(scorer, DetectorScorer):
        for c in reading.concepts:
            for u, _ in c.units[:8]:
                w, _, _ = scorer.detectors.column_at(u)
                weight = np.maximum(weight, np.asarray(w, dtype=np.float64))
    else:
        for c in reading.concepts:
            for u, w in c.units:
                if u < d:
                    weight[u] = max(weight[u], w)
    for c in reading.concepts:
        names.append(c.label)
    kind = reading.source or reading.kind
    return kind, strat.term_probability(term, excluded), weight, names


def hybrid_evidence(strat: Hybrid, term: str) -> tuple[str, np.ndarray, np.ndarray]:
    """(kind, (n,) value per item of the strategy's context, (d,) per-dimension weight)
    of one query term."""
    if strat.has_detector(term):
        return "detector", strat.present(term), strat.detector_weights(term)
    code = normalize_rows(strat.ctx.term_code(term))
    return "code similarity", strat.similarity(term), np.asarray(code, dtype=np.float64)


def explained_hits(
    h: IndexedCollection,
    q: Query,
    strat: Any,
    rows: Any,
    scores: Any,
    codes: sp.csr_matrix,
    offset: int,
    at_hits: bool,
) -> list[Hit]:
    """The hits of ranked ``rows`` (codes: theirs, sorted CSR), each with its
    explanation and the evidence of every query term by ``strat`` (the match scorer's
    probabilities, hybrid's detector values; none for other strategies). ``at_hits``: the
    strategy's context holds just the hits, in order (else every item)."""
    why, items, dim = explainer(h, q), h.collection.items, h.dim
    terms: list[tuple[str, str, str, np.ndarray, np.ndarray, list[str]]] = []
    for side, group in (("include", q.include), ("exclude", q.exclude)):
        if isinstance(strat, Match):
            terms += [(t, side, *match_evidence(strat, t, dim, side == "exclude")) for t in group]
        elif isinstance(strat, Hybrid):
            terms += [(t, side, *hybrid_evidence(strat, t), []) for t in group]
    hits = []
    for i, (r, sc) in enumerate(zip(rows, scores, strict=True)):
        item = items[int(r)]
        hit = Hit(
            rank=offset + i + 1,
            row=int(r),
            id=str(item["id"]),
            score=float(sc),
            caption=(item.get("captions") or [""])[0],
            labels=list(item.get("labels", [])),
            also=[str(a) for a in item.get("also") or []],
        )
        hit.matched, hit.excluded = why.explain(codes, i)  # codes: sorted CSR, row i
        at = i if at_hits else int(r)  # where the evidence arrays hold this item
        hit.evidence = [term_evidence(codes, i, at, why.labels, *t) for t in terms]
        hit.scored_by = {e.term: e.kind for e in hit.evidence}
        hits.append(hit)
    return hits
