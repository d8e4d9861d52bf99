"""What a search returns, and why: hits, the concepts behind each, the evidence per term.

A :class:`Hit` is one ranked item with its score and three readings of why it came back:
``matched`` (the include code's largest contributions q_j x_j on the item's code),
``excluded`` (per excluded term, the dimensions checked and the item's mass on them) and
``evidence`` (per query term, the served scorer's own value for the item: P(term | item)
with ``match``, with its source). :func:`explained_hits` builds the hits of ranked rows:
:func:`explainer` computes, once per query, what explaining any of them needs (an
:class:`Explainer`: the include code, each excluded term's dimensions and words), and the
strategy's own ``evidence`` (``Match.evidence``, ``Hybrid.evidence``) gives a term's
per-item values and per-dimension weights, which :func:`term_evidence` reads for one hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.models.detectors import ConceptDetectors
from sparsemm.query.parse import Query
from sparsemm.query.request import evidence_text
from sparsemm.query.strategies import ExclusionContext, HardFilter, Hybrid, Match, get_strategy

if TYPE_CHECKING:
    from sparsemm.data.collection import Collection


@dataclass
class MatchedConcept:
    """A code dimension behind a hit: its contribution to the include score, its words."""

    dim: int
    weight: float  # contribution q_j * x_j to the include score
    words: list[str]


@dataclass
class ExcludedCheck:
    term: str
    # the term's concept dimensions: the 6 its detector weighs most (a model with
    # detectors), else the active dims of its query code (those `filter` drops items on)
    dims: list[int]
    item_mass: float  # the item's summed value on those dims
    words: list[str] = field(default_factory=list)


@dataclass
class TermEvidence:
    """How strongly an item carries one query term, by the served scorer's own evidence.

    With ``match`` (the default), ``value`` is P(term | item), and ``kind`` names its
    source: "classifier", "face detector", "detector", "code similarity" or "zero-shot"
    (:mod:`sparsemm.query.scorers`); ``read_as`` lists the concepts the term was read as
    ("vehicle": car, bus, ...). With ``hybrid``, "detector": ``value`` is P(term present |
    item) from the term's detector; "code similarity" (no detector for the word): the cosine
    of the term's query code with the item's code. ``dims``: the concept dimensions behind
    the value (largest contributions weight_j x_j for this item), with their words.
    """

    term: str
    side: str  # "include" | "exclude"
    kind: str  # the value's source: "detector", "code similarity", "classifier", ...
    value: float
    dims: list[int] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    read_as: list[str] = field(default_factory=list)  # the concepts the term was read as

    @property
    def text(self) -> str:
        """e.g. ``dog 93%``, or ``cat 0% (left out)`` for an excluded term: the chance the
        item shows it either way (P(cat), not P(not cat)); :func:`evidence_text`."""
        return evidence_text(self.term, self.side, self.kind, self.value)


@dataclass
class Hit:
    rank: int
    row: int
    id: str
    score: float
    caption: str
    labels: list[str]
    matched: list[MatchedConcept] = field(default_factory=list)
    excluded: list[ExcludedCheck] = field(default_factory=list)
    # How the served scorer judged each query term: "detector" (the model's, or one fitted
    # on the collection's captions) or "code similarity" (no detector for that word).
    scored_by: dict[str, str] = field(default_factory=dict)
    evidence: list[TermEvidence] = field(default_factory=list)
    # the item's other paths: files with the same bytes, or links to it (a photo folder)
    also: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> dict[str, Any]:
        """The hit as a front end shows it: :meth:`to_dict` without the collection row."""
        out = asdict(self)
        del out["row"]
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Hit:
        """A hit from :meth:`to_json` (or a server's hit, which carries more keys; its
        row is -1 when the JSON has none)."""
        return cls(
            rank=int(d["rank"]),
            row=int(d.get("row", -1)),
            id=str(d["id"]),
            score=float(d["score"]),
            caption=str(d.get("caption") or ""),
            labels=list(d.get("labels") or []),
            matched=[MatchedConcept(int(c["dim"]), float(c["weight"]), list(c["words"]))
                     for c in d.get("matched") or []],
            excluded=[
                ExcludedCheck(str(e["term"]), list(e["dims"]), float(e["item_mass"]),
                              list(e.get("words") or []))
                for e in d.get("excluded") or []
            ],
            scored_by=dict(d.get("scored_by") or {}),
            evidence=[
                TermEvidence(str(e["term"]), str(e["side"]), str(e["kind"]), float(e["value"]),
                             list(e.get("dims") or []), list(e.get("words") or []),
                             list(e.get("read_as") or []))
                for e in d.get("evidence") or []
            ],
            also=list(d.get("also") or []),
        )  # fmt: skip


@dataclass
class Explainer:
    """What explaining the hits of one query needs (built by ``Searcher.explainer``)."""

    include_code: np.ndarray  # (d,) query code of the include terms
    checks: list[tuple[str, list[int], np.ndarray, list[str]]]  # term, dims, (d,) bool, words
    labels: list[list[str]]  # each code dimension's words (IndexedCollection.dim_labels)
    n_dims: int = 5

    def explain(
        self, codes: sp.csr_matrix, row: int
    ) -> tuple[list[MatchedConcept], list[ExcludedCheck]]:
        """Matched concepts and excluded-term checks of item ``row`` (codes: sorted CSR)."""
        lo, hi = codes.indptr[row], codes.indptr[row + 1]
        dims, vals = codes.indices[lo:hi], codes.data[lo:hi]  # the row's non-zeros
        contrib = self.include_code[dims] * vals
        order = np.argsort(-contrib, kind="stable")[: self.n_dims]
        matched = [
            MatchedConcept(int(dims[i]), float(contrib[i]), self.labels[int(dims[i])])
            for i in order
            if contrib[i] > 0
        ]
        excluded = []
        for term, bdims, on, words in self.checks:
            # the term's dims this row carries most first, named by theirs (else its own)
            mine = on[dims]
            order = np.argsort(-vals[mine], kind="stable")
            top = [int(j) for j in dims[mine][order]]
            if top:
                words = list(dict.fromkeys(w for j in top[:3] for w in self.labels[j][:1]))
            first = set(top)
            ordered = top + [j for j in bdims if j not in first]
            excluded.append(ExcludedCheck(term, ordered, float(vals[mine].sum()), list(words)))
        return matched, excluded


def term_evidence(
    codes: sp.csr_matrix,
    i: int,
    at: int,
    labels: list[list[str]],
    term: str,
    side: str,
    kind: str,
    values: np.ndarray,
    weight: np.ndarray,
    read_as: list[str] | None = None,
) -> TermEvidence:
    """Evidence of one term for the item whose code is row ``i`` of ``codes`` (sorted CSR)
    and whose value is ``values[at]``: the three dimensions that carry most of the term's
    weight on the item, with their first words."""
    lo, hi = codes.indptr[i], codes.indptr[i + 1]
    dims, vals = codes.indices[lo:hi], codes.data[lo:hi]
    contrib = weight[dims] * vals
    top = [int(dims[j]) for j in np.argsort(-contrib, kind="stable")[:3] if contrib[j] > 0]
    words = [w for j in top for w in labels[j][:1]]
    return TermEvidence(term, side, kind, float(values[at]), top, words, list(read_as or []))


@dataclass
class Answer:
    """What one search returns to a front end (:meth:`Searcher.answer`): the parsed query,
    the strategy that ranked it and its hits, with what a reader of them needs."""

    query: Query
    strategy: str
    hits: list[Hit]
    probabilistic: bool  # the scores are match probabilities ("92% match")
    min_score: float | None = None  # hits below it were dropped
    threshold: float | None = None  # what ``matches`` counted at
    matches: int | None = None  # items in the whole collection at ``threshold`` or more
    certified: bool = True  # the index path proved these are the exact top hits
    notes: list[str] = field(default_factory=list)  # how the terms were read, caveats
    unknown_words: list[str] = field(default_factory=list)  # in no vocabulary we hold
    total: int | None = None  # items in the collection (all of them are ranked)

    def to_json(self) -> dict[str, Any]:
        """The answer as JSON-ready values: what ``search --json`` prints (with each hit's
        image added) and what :meth:`from_json` reads back."""
        q = self.query
        return {
            "query": {"include": list(q.include), "exclude": list(q.exclude), "text": q.text},
            "strategy": self.strategy,
            "probabilistic": self.probabilistic,
            "min_score": self.min_score,
            "threshold": self.threshold,
            "matches": self.matches,
            "total": self.total,
            "certified": self.certified,
            "notes": list(self.notes),
            "unknown_words": list(self.unknown_words),
            "hits": [h.to_json() for h in self.hits],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Answer:
        """An answer from :meth:`to_json`, or from the web API's search answer (a running
        ``sparsemm serve``: the same keys and more)."""
        q = d["query"]
        include, exclude = tuple(q.get("include") or ()), tuple(q.get("exclude") or ())
        return cls(  # nothing on either side: "more like" an item or a picture, as it is
            query=Query(include, exclude) if include or exclude else Query.empty(),
            strategy=str(d["strategy"]),
            hits=[Hit.from_json(h) for h in d.get("hits") or []],
            probabilistic=bool(d.get("probabilistic")),
            min_score=d.get("min_score"),
            threshold=d.get("threshold"),
            matches=d.get("matches"),
            certified=bool(d.get("certified", True)),
            notes=list(d.get("notes") or []),
            unknown_words=list(d.get("unknown_words") or []),
            total=d.get("total"),
        )


def stale_notes(collection: Collection, hits: Sequence[Hit]) -> list[str]:
    """A note when photos among ``hits`` are gone from their folder or were replaced since
    `sparsemm up` read them (:meth:`Collection.stale`): a search answers from the index, so
    it still shows them until `up` runs again; [] when none is."""
    stale = collection.stale([h.row for h in hits])
    parts = []
    for how in ("gone", "changed"):
        ids = [h.id for h in hits if stale.get(h.row) == how]
        if not ids:
            continue
        named = ", ".join(repr(i) for i in ids[:3]) + (f" and {len(ids) - 3} more" * (len(ids) > 3))
        one = len(ids) == 1
        if how == "gone":
            parts.append(f"{named} {'is' if one else 'are'} no longer in the folder")
        else:
            parts.append(f"{named} changed since `up` read {'it' if one else 'them'}")
    if not parts:
        return []
    up = collection.up_args() or "PHOTOS"
    return [f"{'; '.join(parts)}: run `sparsemm up {up}` to bring the index up to date"]


def explainer(
    q: Query,
    ctx: ExclusionContext,
    labels: list[list[str]],
    detectors: ConceptDetectors | None,
    match: Match | None = None,
    n_dims: int = 5,
) -> Explainer:
    """What explaining any hit of ``q`` needs, computed once per query: the include
    code and each excluded term's dimensions with their words: the 6 its detector
    weighs most when the model has ``detectors``, else those the ``filter`` strategy drops
    items on (the active dims of the term's query code over the text context ``ctx``).
    ``labels``: each code dimension's words; ``match``: the match scorer whose readings
    name the dimensions of a model whose units are dimensions (the photo model), if any."""
    a = q.include_text
    dim = ctx.dim
    filt: HardFilter | None = None  # built only for a term nothing else reads
    checks = []
    for b in q.exclude:
        units = match.reading_dims(b, excluded=True) if match is not None else None
        if units is not None:
            # the dims of the units the match scorer read the term as (the photo model)
            on = np.zeros(dim, dtype=bool)
            on[units] = True
        elif detectors is not None and b in detectors:
            # The dims the term's detector weighs most: what says "b is here".
            w = detectors.column(b)[0]
            on = np.zeros(len(w), dtype=bool)
            on[[j for j in np.argsort(-w, kind="stable")[:6] if w[j] > 0]] = True
        else:
            if filt is None:
                built = get_strategy("filter", ctx, dims="query")
                assert isinstance(built, HardFilter)
                filt = built
            on = filt.b_weights(a, b) > 0  # (d,) bool: the dims `filter` drops items on
        dims = [int(j) for j in np.flatnonzero(on)]
        words = sorted({w for j in dims[:3] for w in labels[j][:2]})
        checks.append((b, dims, on, words))
    include_code = ctx.term_code(a) if a else np.zeros(dim, np.float32)
    if match is not None and q.include:
        dims = [u for t in q.include for u in (match.reading_dims(t) or [])]
        if dims:  # the match scorer's own reading of the include terms
            include_code = np.zeros(dim, np.float32)
            include_code[dims] = 1.0
    return Explainer(include_code, checks, labels, n_dims)


def explained_hits(
    q: Query,
    strat: Any,
    rows: Any,
    scores: Any,
    codes: sp.csr_matrix,
    offset: int,
    at_hits: bool,
    items: list[dict[str, Any]],
    why: Explainer,
) -> list[Hit]:
    """The hits of ranked ``rows`` (codes: theirs, sorted CSR), each with its
    explanation and the evidence of every query term by ``strat`` (the match scorer's
    probabilities, hybrid's detector values; none for other strategies). ``at_hits``: the
    strategy's context holds just the hits, in order (else every item); ``items``: the
    collection's items (ids, captions, labels); ``why``: the query's :func:`explainer`."""
    terms: list[tuple[str, str, str, np.ndarray, np.ndarray, list[str]]] = []
    if isinstance(strat, (Match, Hybrid)):  # the strategies with evidence of their own
        for side, group in (("include", q.include), ("exclude", q.exclude)):
            for t in group:
                terms.append((t, side, *strat.evidence(t, side == "exclude")))
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
