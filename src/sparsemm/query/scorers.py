"""Term probabilities: P(term | item) for each kind of model, read through the hierarchy.

The served scorer (:class:`~sparsemm.query.strategies.match.Match`) multiplies calibrated
per-term probabilities. Where they come from depends on the model; each scorer here reads a
term (:meth:`read`, through the model's :class:`~sparsemm.concepts.vocabulary.ConceptVocabulary`)
and gives its probability over a context's items (:meth:`probability`):

- :class:`UnitScorer`, the photo concept model: item codes hold unit probabilities (whole-
  image ImageNet class probabilities and a face detector's P(person)). A concept's evidence
  is its units' summed class probability (implied units at their weight), calibrated to a
  presence probability, OR-ed with the face unit: P = 1 - (1 - P_classes)(1 - P_face).
- :class:`DetectorScorer`, SR: each caption word with a detector is a unit with
  P(u | x) = sigmoid(a z_u(x) + g cos(code(u), x) + c): its detector's logit z_u and the
  code similarity of the word, calibrated jointly on items the detectors were not fitted
  on (:func:`sparsemm.train.detectors.fit_calibration`). A concept takes its most probable
  unit ("vehicle": car, bus, truck, ...) or, when the detectors were fitted on the
  hierarchy, the detector fitted at its own sense: the words' detectors see the same objects
  (a "man" is a "person"), so a noisy-OR of many weak detectors would add up their noise. A
  phrase that only names things ("there is a dog and a cat") is read as those things; a
  description ("a man making pizza"), or a word with no detector, is scored by its code
  similarity alone, calibrated the same way: P = sigmoid(a_p cos(code(phrase), x) + c_p).

A reading says what the term was read as (``label``), how (``source``: "classifier", "face
detector", "detector", "code similarity", "zero-shot") and any note for the user
("'woman' is searched as 'person'"). A term that names nothing the model can see raises
:class:`~sparsemm.concepts.vocabulary.UnknownTerm`, with the closest concepts it knows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from sparsemm.concepts.vocabulary import Concept, ConceptVocabulary, UnknownTerm
from sparsemm.errors import SparsemmError
from sparsemm.text import term_tokens


@dataclass(frozen=True)
class TermReading:
    """How a scorer reads one query term."""

    term: str
    kind: str  # "concepts": all of ``concepts`` present; "similarity": a stand-in phrase
    concepts: tuple[Concept, ...] = ()
    notes: tuple[str, ...] = ()
    source: str = ""  # what gives its probability (for --explain and the page)

    @property
    def label(self) -> str:
        """What the term was read as: "dog", "cup + coffee", or the phrase itself."""
        return " + ".join(c.label for c in self.concepts) if self.concepts else self.term


@dataclass(frozen=True)
class TermBound:
    """An upper bound of P(term | x) for the served path: with s_l = w_l . x over the lists
    l (x >= 0, so negative weights are left out), P(term | x) <= value(s_1, s_2, ...), a
    function non-decreasing in each s_l."""

    weights: tuple[np.ndarray, ...]  # (d,) non-negative float64 per list
    value: Callable[[Sequence[float]], float]
    # an upper bound, from the same list scores, of the cosine of the term's own code with
    # x (the match scorer's tie-break when the term is all that is included); None: 1
    cosine: Callable[[Sequence[float]], float] | None = None


class ItemContext(Protocol):
    """What a term scorer reads of the items it scores (an
    :class:`~sparsemm.query.strategies.ExclusionContext` has all of it): their codes, unit
    codes and dense embeddings, and the query texts' codes and embeddings."""

    n_items: int
    items_codes: sp.csr_matrix | None
    items_dense: np.ndarray | None

    @property
    def codes_unit(self) -> sp.csr_matrix: ...

    def term_code(self, term: str) -> np.ndarray: ...

    def term_embedding(self, term: str) -> np.ndarray: ...

    def code_scores(self, query: np.ndarray) -> np.ndarray: ...

    def codes_scores(self, queries: np.ndarray) -> np.ndarray: ...


class TermScorer(Protocol):
    """What the match scorer needs of a model."""

    vocabulary: ConceptVocabulary

    def read(self, term: str) -> TermReading: ...

    def probability(
        self, reading: TermReading, ctx: ItemContext, excluded: bool = False
    ) -> np.ndarray: ...

    def bound(self, reading: TermReading, ctx: ItemContext) -> TermBound | None: ...

    def texts(self, reading: TermReading) -> tuple[str, ...]: ...


def _noisy_or(probs: Sequence[np.ndarray], n: int) -> np.ndarray:
    """1 - prod_i (1 - p_i), computed in log space."""
    log_none = np.zeros(n)
    for p in probs:
        log_none = log_none + np.log1p(-np.clip(p, 0.0, 1.0 - 1e-12))
    return 0.0 - np.expm1(log_none)  # never -0.0 (shown as such in JSON)


# -- the photo concept model ---------------------------------------------------------------


@dataclass
class UnitScorer:
    """P(term | photo) from unit probabilities (see the module docstring). ``model`` is an
    :class:`~sparsemm.models.concepts.ImageNetConceptModel` of version 2."""

    model: Any
    vocabulary: ConceptVocabulary
    _weights: dict[tuple[tuple[int, float], ...], np.ndarray] = field(default_factory=dict)
    # largest L2 norm of a code: class probabilities (sum <= 1) plus the face unit (<= 1),
    # and the region block (each tile's probabilities sum to 1: at most one per tile)
    code_norm: float = float(np.sqrt(2.0))

    def __post_init__(self) -> None:
        cfg = self.model.config
        if getattr(cfg, "regions", False):
            self.code_norm = float(np.sqrt(2.0 + self.model.max_tile_count))

    @property
    def face(self) -> int | None:
        return self.model.n_classes if self.model.config.face_unit else None

    def read(self, term: str) -> TermReading:
        r = self.vocabulary.read(term)
        sources = []
        for c in r.concepts:
            units = {u for u, _ in c.units}
            if self.face is not None and self.face in units:
                sources.append("face detector")
            if units - {self.face}:
                sources.append("classifier")
        return TermReading(
            term, "concepts", r.concepts, tuple(r.notes), " + ".join(dict.fromkeys(sources))
        )

    def _unit_weights(self, concept: Concept) -> np.ndarray:
        w = self._weights.get(concept.units)
        if w is None:
            w = np.zeros(self.model.n_dims, dtype=np.float64)
            for u, x in concept.units:
                w[u] = x
            self._weights[concept.units] = w
        return w

    def _region_weights(self, w: np.ndarray) -> np.ndarray | None:
        """The class weights ``w`` moved to the region block (None: the model reads no
        regions, or the concept has no class units)."""
        off = self.model.region_offset
        n = self.model.n_classes
        if off is None or not w[:n].any():
            return None
        r = np.zeros_like(w)
        r[off : off + n] = w[:n]
        return r

    def evidence_weights(self, concept: Concept, excluded: bool = False) -> np.ndarray:
        """(n_dims,) what each code dimension weighs in a concept's evidence: its units, and
        with regions its classes' tile dimensions times the region weight of its side
        (:meth:`class_evidence`): the dimensions an explanation names."""
        w = self._unit_weights(concept).copy()
        r = self._region_weights(w)
        if r is not None:
            w += self._region_weight(excluded) * r
        return w

    def _region_weight(self, excluded: bool) -> float:
        """What a tile's evidence counts for beside the whole photo's, by the term's side."""
        cfg = self.model.config
        return float(cfg.exclude_region_weight if excluded else cfg.region_weight)

    def class_evidence(
        self, w: np.ndarray, codes: sp.csr_matrix, excluded: bool = False
    ) -> np.ndarray:
        """(n,) a concept's evidence from its class weights ``w``: its summed class
        probability over the whole photo, or a weight times that over its tiles when larger
        (regions show a second, small or off-centre thing): ``region_weight`` for a wanted
        term, ``exclude_region_weight`` for one to leave out."""
        e = np.asarray(codes @ w, dtype=np.float64).ravel()
        r = self._region_weights(w)
        if r is not None:
            lam = self._region_weight(excluded)
            e = np.maximum(e, lam * np.asarray(codes @ r, dtype=np.float64).ravel())
        return e

    def concept_probability(
        self, concept: Concept, codes: sp.csr_matrix, excluded: bool = False
    ) -> np.ndarray:
        """(n,) P(concept | photo) from raw unit-probability codes (n, n_dims); ``excluded``:
        judged as a term to leave out (any region that shows it)."""
        w = self._unit_weights(concept).copy()
        n = codes.shape[0]
        face_w = 0.0
        if self.face is not None:
            face_w, w[self.face] = float(w[self.face]), 0.0
        p = np.zeros(n)
        if w.any():
            p = self.model.presence(self.class_evidence(w, codes, excluded), excluded)
        if face_w:
            col = np.asarray(codes[:, self.face].toarray(), dtype=np.float64).ravel()
            p = _noisy_or([p, face_w * col], n)
        return p

    def texts(self, reading: TermReading) -> tuple[str, ...]:
        """Texts its probability embeds besides the term: none (unit probabilities)."""
        return ()

    def probability(
        self, reading: TermReading, ctx: ItemContext, excluded: bool = False
    ) -> np.ndarray:
        codes = ctx.items_codes
        assert codes is not None  # the match scorer requires codes
        out = np.ones(codes.shape[0])
        for c in reading.concepts:
            out = out * self.concept_probability(c, codes, excluded=excluded)
            if c.how == "broader":  # "a woman" read as a person: the share that are
                out = out * float(getattr(self.model.config, "broader_share", 1.0))
        return out

    def bound(self, reading: TermReading, ctx: ItemContext) -> TermBound | None:
        """P(concept) <= presence(class evidence) + P_face: presence is non-decreasing in the
        evidence, which is linear in the code (one list), and the face unit is one
        dimension (a second list). Any one concept bounds the product of a reading."""
        best: TermBound | None = None
        for c in reading.concepts:
            w = self._unit_weights(c).copy()
            lists = []
            has_face = self.face is not None and bool(w[self.face])
            if has_face:
                assert self.face is not None
                f = np.zeros_like(w)
                f[self.face], w[self.face] = w[self.face], 0.0
                lists.append(f)
            has_classes = bool(w.any())
            region = self._region_weights(w) if has_classes else None
            if has_classes:
                lists.append(w)
            if region is not None:
                lists.append(region)
            lam = float(self.model.config.region_weight)

            def value(
                s: Sequence[float],
                hf: bool = has_face,
                hc: bool = has_classes,
                hr: bool = region is not None,
                lam: float = lam,
                presence: Any = self.model.presence,
            ) -> float:
                total = min(1.0, max(0.0, s[0])) if hf else 0.0
                if hc:
                    # the class lists come last: whole photo, then (hr) its regions
                    e = s[-2] if hr else s[-1]
                    if hr:
                        e = max(e, lam * s[-1])
                    total += float(presence(np.asarray([min(1.0, max(0.0, e))]))[0])
                return min(1.0, total)

            b = TermBound(tuple(lists), value)
            best = b if best is None or len(b.weights) < len(best.weights) else best
        return best


# -- SR: caption-word detectors ------------------------------------------------------------


# A term to leave out may be read cautiously: its probability as if the calibration had
# been fitted with a miss (the thing is there, the scorer says it is not) weighing this
# many false alarms, i.e. log(weight) added to its log-odds. Measured on the COCO
# caption-proxy (benchmarks/exclude_caution.py, docs/concepts.md): a weight above 1 makes
# the verification over annotated objects more balanced (objects no caption names get a
# modest P) but lowers label-pair AP@10 (0.769 to 0.751 at 5) and the R@5 of negated
# sentences, so the served weight is 1: a left-out term's P is its calibrated P.
EXCLUDE_MISS_WEIGHT = 1.0


@dataclass(frozen=True)
class Calibration:
    """P(unit | x) = sigmoid(a z + g cos + c) for a word with a detector (``label`` = (a, g,
    c) of the terms that are labels of the training items); a phrase or a word without one:
    sigmoid(phrase_a cos + phrase_c). The defaults (for detectors saved without a
    calibration) trust the detector as it is and score phrases like the older ``hybrid``'s
    include weight."""

    a: float = 1.0
    g: float = 0.0
    c: float = 0.0
    phrase_a: float = 20.0
    phrase_c: float = -12.0
    label: tuple[float, float, float] | None = None
    fitted: bool = False
    exclude_shift: float = math.log(EXCLUDE_MISS_WEIGHT)  # a term to leave out: log-odds added

    def of(self, is_label: bool) -> tuple[float, float, float]:
        """(a, g, c) of a caption word or of a label."""
        if is_label and self.label is not None:
            return self.label
        return self.a, self.g, self.c


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -z))


# A phrase naming at most this many things ("a couch and a chair") is read as them; one
# naming more is a description ("a kitchen with a stove, a sink and a kettle"), scored by
# its code similarity: chosen on the tuning families of `sparsemm bench negation` (R@5
# 0.984 against 0.981 without the limit; docs/concepts.md).
MAX_NAMED = 2
UNIT_BLOCK = 16  # detector units whose probabilities are computed in one product


@dataclass
class DetectorScorer:
    """P(term | item) for SR codes from the model's caption-word detectors (see the module
    docstring). ``max_words``: longer terms are phrases."""

    detectors: Any  # sparsemm.models.detectors.ConceptDetectors
    vocabulary: ConceptVocabulary
    calibration: Calibration
    max_words: int = 3

    def _own(self, c: Concept) -> Concept:
        """The concept's own detector when one was fitted at its sense (on hierarchical
        targets), else the concept as read (its most probable unit is taken)."""
        own = [(u, w) for u, w in c.units if c.synset in self.vocabulary.synsets[u]]
        if own:
            return Concept(c.term, c.label, tuple(own[:1]), "exact", c.synset, c.note)
        return c

    def read(self, term: str) -> TermReading:
        union = self._read_union(term) if re.search(r"\bor\b", term) else None
        if union is not None:
            return union
        if term and len(term.split()) <= self.max_words:
            c = self.vocabulary.read_noun(term)
            # the word's own detector, looked up by its singular words when they are all of
            # it (not "a couch and a chair", which would find the pair's bigram detector)
            whole = len(term_tokens(term)) == len(term.split())
            own = self.detectors.lookup(term) if whole else None
            at_sense = c is not None and any(
                c.synset in self.vocabulary.synsets[u] for u, _ in c.units
            )
            if own is not None and (c is None or c.how == "broader" or not at_sense):
                # the word's own detector ("sports ball", a word WordNet files elsewhere)
                named = Concept(term, self.detectors.terms[own], ((own, 1.0),), "name")
                return TermReading(term, "concepts", (named,), (), "detector")
            if c is not None and c.how != "broader":
                c = self._own(c)
                return TermReading(term, "concepts", (c,), (c.note,) if c.note else (), "detector")
        names = self.vocabulary.read_names(term) if term else None
        if names is not None and len(names.concepts) <= MAX_NAMED:  # "there is a dog"
            concepts = tuple(self._own(c) for c in names.concepts)
            return TermReading(term, "concepts", concepts, tuple(names.notes), "detector")
        return TermReading(term, "similarity", (), (), "code similarity")

    def _read_union(self, term: str) -> TermReading | None:
        """'cats or dogs': one concept over the alternatives' detectors (the most probable
        one is taken, as for a category word). None when an alternative is not one thing
        with a detector ("a man riding a bike or walking a dog"): the term is then read as
        any other, a description scored by its code similarity."""
        alternatives = [a for a in re.split(r"\s*\bor\b\s*", term) if a.strip()]
        parts: list[Concept] = []
        notes: list[str] = []  # each alternative's, its left-out words' too
        for alt in alternatives:
            r = self.read(re.sub(r"^(either|a|an|the)\s+", "", alt))
            if r.kind != "concepts" or len(r.concepts) != 1:
                return None
            parts.append(r.concepts[0])
            notes += r.notes
        if len(parts) < 2:
            return None
        units: dict[int, float] = {}
        for c in parts:
            for u, w in c.units:
                units[u] = max(units.get(u, 0.0), w)
        label = " or ".join(dict.fromkeys(c.label for c in parts))
        union = Concept(term, label, tuple(sorted(units.items())), "union", None, "", tuple(parts))
        return TermReading(term, "concepts", (union,), tuple(dict.fromkeys(notes)), "detector")

    def texts(self, reading: TermReading) -> tuple[str, ...]:
        """Texts its probability codes besides the term: the words of the detectors it reads
        (their code similarity is calibrated in), so a search codes them in one batch."""
        if self.detectors.term_codes is not None:
            return ()
        out = []
        for c in reading.concepts:
            for u, _ in c.units:
                if self.calibration.of(bool(self.detectors.label_terms[u]))[1]:
                    out.append(str(self.detectors.terms[u]))
        return tuple(out)

    def term_code(self, unit: int, ctx: ItemContext) -> np.ndarray:
        """The query code of a unit's word: as the calibration read it (stored with the
        detectors), or coded by the context's text encoder for detectors without them."""
        if self.detectors.term_codes is not None:
            return np.asarray(self.detectors.term_codes[:, unit])
        return np.asarray(ctx.term_code(self.detectors.terms[unit]))

    def unit_probability(self, unit: int, ctx: ItemContext, excluded: bool = False) -> np.ndarray:
        """(n,) P(unit's term | item); ``excluded``: the cautious reading of a term to leave
        out (:meth:`probability`)."""
        return self.units_probability([unit], ctx, excluded)[:, 0]

    def units_probability(
        self, units: Sequence[int], ctx: ItemContext, excluded: bool = False
    ) -> np.ndarray:
        """(n, len(units)) P(each unit's term | item), one product of the item codes with
        the units' detector weights (and with their term codes, when calibrated in)."""
        cols = np.asarray(units, dtype=np.int64)
        params = np.array(
            [self.calibration.of(bool(self.detectors.label_terms[u])) for u in cols]
        ).reshape(len(cols), 3)
        a, g, c = params[:, 0], params[:, 1], params[:, 2]
        w = self.detectors.weights[:, cols] * self.detectors.config.scale
        logits = np.asarray(ctx.codes_unit @ w, dtype=np.float64) + self.detectors.bias[cols]
        z = a * logits
        coded = np.flatnonzero(g)
        if len(coded):
            q = np.stack([self.term_code(int(cols[j]), ctx) for j in coded], axis=1)
            z[:, coded] += g[coded] * ctx.codes_scores(q)
        return _sigmoid(self._caution(z + c, excluded))

    def _caution(self, z: np.ndarray, excluded: bool) -> np.ndarray:
        return z + self.calibration.exclude_shift if excluded else z

    def probability(
        self, reading: TermReading, ctx: ItemContext, excluded: bool = False
    ) -> np.ndarray:
        """P(term | item); ``excluded``: as a term to leave out, the cautious reading
        (``calibration.exclude_shift`` added to every log-odds, as if misses weighed
        :data:`EXCLUDE_MISS_WEIGHT` times a false alarm): an item that may show the thing
        counts as showing it."""
        n = ctx.n_items
        cal = self.calibration
        if reading.kind == "similarity":
            sim = ctx.code_scores(ctx.term_code(reading.term))
            return _sigmoid(self._caution(cal.phrase_a * sim + cal.phrase_c, excluded))
        out = np.ones(n)
        for c in reading.concepts:
            best = np.zeros(n)
            # units a block at a time: a broad concept ("objects") over a whole collection
            for lo in range(0, len(c.units), UNIT_BLOCK):
                block = c.units[lo : lo + UNIT_BLOCK]
                weights = np.array([w for _, w in block], dtype=np.float64)
                p = self.units_probability([u for u, _ in block], ctx, excluded) * weights
                best = np.maximum(best, p.max(axis=1))
            out = out * best
        return out

    def bound(self, reading: TermReading, ctx: ItemContext) -> TermBound | None:
        """P <= sum_u sigmoid(a (w_u+ . x + b_u) + g cos_u + c) <= sum_u sigmoid(...) with
        cos_u = q_u . x folded into the list (q_u the unit query code): one list per unit
        over w_u' = a w_u + g q_u, positive part."""
        cal = self.calibration
        if reading.kind == "similarity":
            q = np.asarray(ctx.term_code(reading.term), dtype=np.float64)
            q = q / max(float(np.linalg.norm(q)), 1e-12)
            pc = cal.phrase_c

            def phrase(s: Sequence[float]) -> float:
                return float(_sigmoid(np.asarray(s[0] + pc)))

            pa = cal.phrase_a

            def cosine(s: Sequence[float]) -> float:  # s = pa q+ . x >= pa cos(q, x)
                return min(1.0, max(0.0, s[0] / pa)) if pa > 0 else 1.0

            return TermBound((np.maximum(pa * q, 0.0),), phrase, cosine)
        best: TermBound | None = None
        for c in reading.concepts:
            lists, shift = [], []
            for u, _ in c.units:
                a, g, cc = cal.of(bool(self.detectors.label_terms[u]))
                w, b, _ = self.detectors.column_at(u)
                v = a * np.asarray(w, dtype=np.float64)
                if g:
                    q = np.asarray(self.term_code(u, ctx), dtype=np.float64)
                    v = v + g * q / max(float(np.linalg.norm(q)), 1e-12)
                lists.append(np.maximum(v, 0.0))
                shift.append(a * b + cc)

            def value(s: Sequence[float], sh: tuple[float, ...] = tuple(shift)) -> float:
                z = np.asarray(s, dtype=np.float64) + np.asarray(sh)
                return min(1.0, float(_sigmoid(z).max()))

            tb = TermBound(tuple(lists), value)
            best = tb if best is None or len(tb.weights) < len(best.weights) else best
        return best


_DETECTOR_SCORERS: dict[int, tuple[Any, DetectorScorer]] = {}


def detector_scorer(detectors: Any, max_words: int = 3) -> DetectorScorer:
    """The term scorer of an SR model's detectors (built once per detectors object): its
    terms placed at the WordNet senses they were fitted at (detectors fitted without the
    hierarchy: :func:`~sparsemm.concepts.vocabulary.unit_synset`) and its stored
    calibration (the defaults of :class:`Calibration` when it has none)."""
    from sparsemm.concepts.vocabulary import unit_synset

    hit = _DETECTOR_SCORERS.get(id(detectors))
    if hit is not None and hit[0] is detectors:
        return hit[1]
    from sparsemm.concepts.wordnet import wordnet

    wn = wordnet()
    wnids = getattr(detectors, "wnids", None) or [None] * len(detectors.terms)
    synsets = [
        wn.by_wnid(w) if w else (None if getattr(detectors, "wnids", None) else unit_synset(t))
        for t, w in zip(detectors.terms, wnids, strict=True)
    ]
    vocab = ConceptVocabulary(list(detectors.terms), synsets)
    cal = Calibration()
    if getattr(detectors, "calibration", None) is not None:
        a, g, c, pa, pc, al, gl, cl = (float(v) for v in detectors.calibration)
        cal = Calibration(a, g, c, pa, pc, (al, gl, cl), fitted=True)
    scorer = DetectorScorer(detectors, vocab, cal, max_words)
    if len(_DETECTOR_SCORERS) > 8:
        _DETECTOR_SCORERS.clear()
    _DETECTOR_SCORERS[id(detectors)] = (detectors, scorer)
    return scorer


def unit_codes_scorer(scorer: Any) -> bool:
    """Whether the scorer's items have unit-length codes (SR's), where a cosine is the
    inner product with the unit query code."""
    return isinstance(scorer, DetectorScorer)


def no_concept(term: str, side: str) -> SparsemmError:
    """The refusal of a query term that means nothing to the model; ``side``: "search for"
    or "exclude"."""
    return SparsemmError(
        f"{term!r} matches no concept of this collection's model, so it cannot {side} "
        "anything; check the spelling or try another word"
    )


def refuse_self_exclusion(
    readings: Sequence[tuple[str, str, TermReading]], vocabulary: ConceptVocabulary
) -> None:
    """SparsemmError when an excluded term is at or above an included one to the model
    ("dog but not animal", "kitten but not cat"): nothing could match, so the query is
    refused with one line saying why instead of answering with what it excluded.
    ``readings``: (side, term, reading), side "search for" or "exclude"."""
    inc = [(t, r) for side, t, r in readings if side != "exclude" and r.kind == "concepts"]
    exc = [(t, r) for side, t, r in readings if side == "exclude" and r.concepts]
    for term, r in inc:
        for bad, b in exc:
            if not vocabulary.implies(r.concepts, b.concepts):
                continue
            if all(c.how == "implied" for c in r.concepts):  # "flag", from a flagpole
                units = [u for c in r.concepts for u, _ in c.units]
                shown = f"things {bad!r} covers"
                if len(units) == 1:
                    shown = repr(vocabulary.names[units[0]])
                raise SparsemmError(
                    f"this model reads {term!r} only from {shown}, so '{term} but not "
                    f"{bad}' would find nothing; search {term!r} alone"
                )
            if r.label == b.label:  # "kitten", read as a cat
                raise SparsemmError(
                    f"this model cannot tell {term!r} from {bad!r} (both are read as "
                    f"{b.label!r}), so '{term} but not {bad}' would find nothing"
                )
            raise SparsemmError(
                f"every {term!r} is also {bad!r} to this model, so excluding {bad!r} leaves "
                f"nothing to find; did you mean '{bad} but not {term}'?"
            )


def unknown(term: str, vocabulary: ConceptVocabulary) -> UnknownTerm:
    """The refusal of a term no scorer can read."""
    return vocabulary.unknown(term)


# -- CLIP-like encoders: zero-shot -------------------------------------------------------------


@dataclass
class ZeroShotScorer:
    """P(term | image) = sigmoid(scale cos(image, text(term)) + bias) from a
    :class:`~sparsemm.models.clip_concepts.ClipConceptModel`: the maximum over the term
    itself and the vocabulary concepts below it in the hierarchy. Images are the context's
    dense embeddings, or their SpLiCE reconstructions from the codes when it has none."""

    model: Any
    vocabulary: ConceptVocabulary

    def read(self, term: str) -> TermReading:
        if re.search(r"\bor\b", term):  # "cats or dogs": the best of the alternatives
            try:
                union = self.vocabulary.read_union(term)
            except SparsemmError:
                return TermReading(term, "zero-shot", (), (), "zero-shot")
            parts = tuple(c for c in union.parts if c.how not in ("broader", "implied"))
            return TermReading(term, "zero-shot", (replace(union, parts=parts),), (), "zero-shot")
        c = self.vocabulary.read_noun(term) if len(term.split()) <= 3 else None
        concepts = (c,) if c is not None and c.how not in ("broader", "implied") else ()
        return TermReading(term, "zero-shot", concepts, (), "zero-shot")

    def texts(self, reading: TermReading) -> tuple[str, ...]:
        """Texts its probability embeds besides the term: none (concept embeddings are
        stored in the model)."""
        return ()

    def _images(self, ctx: ItemContext) -> np.ndarray:
        if ctx.items_dense is not None:
            return np.asarray(ctx.items_dense, dtype=np.float64)
        return np.asarray(self.model.decomposer().recompose(ctx.items_codes), dtype=np.float64)

    def probability(
        self, reading: TermReading, ctx: ItemContext, excluded: bool = False
    ) -> np.ndarray:
        x = self._images(ctx)
        p = self.model.probability(x @ np.asarray(ctx.term_embedding(reading.term), np.float64))
        emb = self.model.concept_emb.numpy()
        limit = int(self.model.config.max_expansion)
        for c in (p for r in reading.concepts for p in (r.parts if r.how == "union" else (r,))):
            units = [u for u, w in sorted(c.units, key=lambda uw: -uw[1]) if w >= 1.0][:limit]
            if units:
                p = np.maximum(
                    p, self.model.probability(x @ emb[units].T.astype(np.float64)).max(1)
                )
        return p

    def bound(self, reading: TermReading, ctx: ItemContext) -> TermBound | None:
        return None  # zero-shot scores read dense embeddings: ranked by a scan
