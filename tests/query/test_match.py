"""The match scorer: probabilities that compose, the rank key, the index path certified equal
to ranking every item, and the exact match count; for the photo model's unit codes and for
SR's calibrated detectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("torch")

from fakes import HashTexts, sr_codes, sr_context, sr_detectors
from sparsemm.index import InvertedIndex
from sparsemm.models.concepts import ImageNetConceptModel
from sparsemm.models.detectors import ConceptDetectors
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.scorers import UnitScorer, detector_scorer
from sparsemm.query.strategies import ExclusionContext, get_strategy
from sparsemm.query.strategies.match import Match
from sparsemm.query.strategies.ranking import rank_query

# classes of a tiny photo model (ImageNet WordNet ids)
CLASSES = {
    "golden retriever, golden": "n02099601",
    "tabby, tabby cat": "n02123045",
    "cheetah, chetah": "n02130308",
    "minivan": "n03770679",
    "school bus": "n04146614",
    "canoe": "n02951358",
}


def photo_model() -> ImageNetConceptModel:
    rng = np.random.default_rng(0)
    return ImageNetConceptModel.build(
        list(CLASSES),
        rng.normal(size=(len(CLASSES), 8)).astype(np.float32),
        np.zeros(len(CLASSES), np.float32),
        HashTexts(),
        version=2,
        face_unit=True,
        class_wnids=list(CLASSES.values()),
        presence_scale=0.7,
        presence_bias=1.0,
    )


def photo_codes(n: int, seed: int = 0) -> sp.csr_matrix:
    """Random unit-probability codes: a softmax over the classes cut to its top 3, and a
    face probability on a third of the photos."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(n, len(CLASSES)))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    keep = np.argsort(-probs, axis=1)[:, 3:]
    np.put_along_axis(probs, keep, 0.0, axis=1)
    face = np.where(rng.random(n) < 0.33, rng.uniform(0.5, 1.0, n), 0.0)
    return sp.csr_matrix(np.concatenate([probs, face[:, None]], axis=1).astype(np.float32))


def photo_context(codes: sp.csr_matrix, model: ImageNetConceptModel) -> ExclusionContext:
    def coder(emb, texts):
        return sp.csr_matrix(model.encode_text(np.asarray(emb)).toarray()[:, : codes.shape[1]])

    return ExclusionContext(
        items_codes=codes,
        text_encoder=HashTexts(),
        query_coder=lambda e, t: sp.hstack([coder(e, t), sp.csr_matrix((len(t), 1))]).tocsr(),
        concepts=UnitScorer(model, model.vocabulary()),
    )


def test_photo_probabilities_compose() -> None:
    model = photo_model()
    codes = photo_codes(200)
    ctx = photo_context(codes, model)
    match = get_strategy("match", ctx)
    assert isinstance(match, Match)
    x = codes.toarray()
    dog = model.presence(x[:, 0])
    vehicle = model.presence(x[:, 3] + x[:, 4] + x[:, 5])
    face = x[:, 6]
    np.testing.assert_allclose(match.term_probability("dog"), dog, atol=1e-12)
    np.testing.assert_allclose(match.term_probability("vehicles"), vehicle, atol=1e-12)
    np.testing.assert_allclose(match.term_probability("people"), face, atol=1e-12)
    p = match.probability(["vehicle"], ["bus", "person"])
    bus = model.presence(x[:, 4])
    np.testing.assert_allclose(p, vehicle * (1 - bus) * (1 - face), atol=1e-12)
    only = match.probability([], ["dog"])  # exclusion-only: the absence itself
    np.testing.assert_allclose(only, 1 - dog, atol=1e-12)
    # the rank key: P at 1% with ties broken, never more than half a step
    key = match.score_query(["vehicle"], [])
    assert np.all(
        (key[np.isfinite(key)] - np.floor(vehicle[np.isfinite(key)] / 0.01 + 1e-9) * 0.01)
        <= 0.005 + 1e-12
    )
    assert np.isneginf(key[vehicle == 0]).all()  # nothing of it seen: not a match
    assert np.isfinite(match.score_query([], ["dog"])).all()


def test_photo_index_path_equals_ranking_every_item(tmp_path: Path) -> None:
    model = photo_model()
    codes = photo_codes(5000, seed=1)
    index = InvertedIndex.build(tmp_path / "ix", codes, [str(i) for i in range(5000)])
    full = photo_context(codes, model)
    text = photo_context(sp.csr_matrix((0, codes.shape[1]), dtype=np.float32), model)
    for q in ("a vehicle but no bus", "people but no dog", "dog", "cheetah -person", "no dog"):
        query = parse_query(q)
        for k in (1, 10, 40):
            want_rows, want_scores = rank_query(full, query, "match", k=k)
            got = get_strategy("match", text).rank_store(
                index, query, k=k, candidates=16, nonnegative=True
            )
            assert got.certified
            np.testing.assert_array_equal(got.rows, want_rows, err_msg=q)
            np.testing.assert_allclose(got.scores, want_scores, atol=1e-9)
        m = get_strategy("match", full)
        for thr in (0.25, 0.5, 0.9):
            brute = int((m.probability(query.include, query.exclude) >= thr).sum())
            assert (
                get_strategy("match", text).count_store(
                    index, query, thr, candidates=16, nonnegative=True
                )
                == brute
            )


# -- SR detectors --------------------------------------------------------------------------


def test_detector_readings_follow_the_hierarchy() -> None:
    det = sr_detectors(12)
    scorer = detector_scorer(det)
    dog = scorer.read("dogs")
    assert dog.kind == "concepts" and [u for u, _ in dog.concepts[0].units] == [0]  # its own
    animal = scorer.read("an animal")  # no detector of its own: its most probable unit
    assert {det.terms[u] for u, _ in animal.concepts[0].units} == {"dog", "cat", "puppy"}
    both = scorer.read("there is a dog and a car")  # a list of things, not a description
    assert [c.label for c in both.concepts] == ["dog", "car"]
    phrase = scorer.read("a man making pizza in a kitchen")
    assert phrase.kind == "similarity" and phrase.source == "code similarity"
    assert scorer.calibration.label == pytest.approx((0.8, 3.0, -1.0))


def test_detector_index_path_equals_ranking_every_item(tmp_path: Path) -> None:
    d = 12
    det = sr_detectors(d)
    codes = sr_codes(4000, d, seed=2)
    index = InvertedIndex.build(tmp_path / "ix", codes, [str(i) for i in range(4000)])
    full = sr_context(codes, det)
    text = sr_context(sp.csr_matrix((0, d), dtype=np.float32), det)
    for q in (
        "dog but not cat",
        "an animal but no car",
        "vehicles, no bus",
        "a man with a hat",
        "dogs or cars but not a bus",
    ):
        query = parse_query(q)
        want_rows, want_scores = rank_query(full, query, "match", k=10)
        got = get_strategy("match", text).rank_store(
            index, query, k=10, candidates=16, nonnegative=True
        )
        np.testing.assert_array_equal(got.rows, want_rows, err_msg=q)
        np.testing.assert_allclose(got.scores, want_scores, atol=1e-9)
        m = get_strategy("match", full)
        brute = int((m.probability(query.include, query.exclude) >= 0.5).sum())
        assert (
            get_strategy("match", text).count_store(
                index, query, 0.5, candidates=16, nonnegative=True
            )
            == brute
        )
    # a like-query (a pinned code) is bounded by its code similarity on unit codes
    like = "like: item 3"
    for ctx in (full, text):
        ctx.pin_query_code(like, codes[3].toarray()[0])
    query = Query((like,), ("cat",))
    want_rows, _ = rank_query(full, query, "match", k=5)
    got = get_strategy("match", text).rank_store(index, query, k=5, candidates=16, nonnegative=True)
    np.testing.assert_array_equal(got.rows, want_rows)


def test_a_term_to_leave_out_can_be_read_cautiously() -> None:
    """SR: with a miss weight w, a term to leave out has log(w) added to its log-odds
    (words, category words and phrases alike), so an item that may show it counts as
    showing it, and "x but no y" ranks with that reading; the served weight
    (EXCLUDE_MISS_WEIGHT) leaves a wanted term's probability as it is."""
    import dataclasses
    import math

    from sparsemm.query.scorers import EXCLUDE_MISS_WEIGHT

    d = 12
    det = sr_detectors(d)
    ctx = sr_context(sr_codes(300, d, seed=4), det)
    scorer = detector_scorer(det)
    served = scorer.calibration
    assert served.exclude_shift == pytest.approx(math.log(EXCLUDE_MISS_WEIGHT))
    w = 3.0
    scorer.calibration = dataclasses.replace(served, exclude_shift=math.log(w))
    try:
        for term in ("cat", "an animal", "a man making pizza in a kitchen"):
            reading = scorer.read(term)
            wanted = scorer.probability(reading, ctx)
            left_out = scorer.probability(reading, ctx, excluded=True)
            if reading.kind == "similarity" or len(reading.concepts[0].units) == 1:
                odds_in, odds_out = wanted / (1 - wanted), left_out / (1 - left_out)
                np.testing.assert_allclose(odds_out, w * odds_in, rtol=1e-6, err_msg=term)
            assert (left_out >= wanted - 1e-12).all() and (left_out > wanted).any(), term
        m = get_strategy("match", ctx)
        want = m.term_probability("dog") * (1 - m.term_probability("cat", excluded=True))
        np.testing.assert_allclose(m.probability(["dog"], ["cat"]), want)
        assert (m.term_probability("cat", excluded=True) > m.term_probability("cat")).any()
    finally:
        scorer.calibration = served
    fresh = sr_context(sr_codes(300, d, seed=4), det)
    p_in = scorer.probability(scorer.read("cat"), fresh)
    p_out = scorer.probability(scorer.read("cat"), fresh, excluded=True)
    odds = EXCLUDE_MISS_WEIGHT * p_in / (1 - p_in)
    np.testing.assert_allclose(p_out, odds / (1 + odds), rtol=1e-6)


def test_within_a_percent_an_item_that_may_show_a_left_out_thing_comes_after() -> None:
    """SR: items whose P(match) falls in the same 1% step are ordered by the include text's
    code similarity times prod (1 - P(b)), not by the similarity alone: of two items in a
    step, the one more likely to show the left-out thing comes after one a little less
    similar to the wanted text. With nothing left out the tie is the similarity."""
    d = 12
    det = sr_detectors(d)
    ctx = sr_context(sr_codes(3000, d, seed=5), det)
    m = get_strategy("match", ctx)
    assert isinstance(m, Match)
    include, exclude = ["dog"], ["cat"]
    p = m.probability(include, exclude)
    sim = np.clip(m.similarity("dog"), 0.0, 1.0)
    p_cat = m.term_probability("cat", excluded=True)
    np.testing.assert_allclose(m.tie(include), sim)
    np.testing.assert_allclose(m.tie(include, exclude), sim * (1.0 - p_cat))
    key = m.score_query(include, exclude)
    step = np.floor(p / 0.01 + 1e-9)
    flipped = 0
    for s in np.unique(step[p > 0]):
        rows = np.flatnonzero(step == s)
        order = rows[np.argsort(-key[rows], kind="stable")]
        want = rows[np.argsort(-(sim * (1.0 - p_cat))[rows], kind="stable")]
        np.testing.assert_array_equal(order, want)
        # pairs the similarity alone would order the other way
        a, b = order[:-1], order[1:]
        flipped += int((sim[a] < sim[b]).sum())
    assert flipped > 0  # the left-out thing's probability decided some ties


def test_detectors_round_trip_their_senses_and_calibration(tmp_path: Path) -> None:
    det = sr_detectors(6)
    det.save(tmp_path)
    back = ConceptDetectors.load(tmp_path)
    assert back.wnids == det.wnids
    np.testing.assert_array_equal(back.calibration, det.calibration)
    np.testing.assert_array_equal(back.label_terms, det.label_terms)
    assert back.term_codes is None


def test_stored_term_codes_stand_in_for_coding_the_words(tmp_path: Path) -> None:
    """Detectors that keep their words' query codes (as the calibration read them) score
    with those: the same probabilities as coding the words, and a search codes none of
    them; they round-trip with the detectors."""
    d = 12
    det = sr_detectors(d)
    codes = sr_codes(200, d, seed=3)
    ctx = sr_context(codes, det)
    scorer = detector_scorer(det)
    reading = scorer.read("an animal but no car".split(" but")[0])
    assert scorer.texts(reading)  # without stored codes the words are coded at query time
    want = scorer.probability(reading, ctx)
    det.term_codes = np.stack([ctx.term_code(t) for t in det.terms], axis=1)
    stored = detector_scorer(det)
    assert stored.texts(reading) == ()
    fresh = sr_context(codes, det)
    np.testing.assert_allclose(stored.probability(reading, fresh), want, atol=1e-6)
    assert not any(det.terms[u] in str(k) for k in fresh._code for u in range(len(det)))
    det.save(tmp_path)
    np.testing.assert_array_equal(ConceptDetectors.load(tmp_path).term_codes, det.term_codes)


# -- "or" ------------------------------------------------------------------------------------


def test_or_is_one_term_whose_evidence_is_the_alternatives_together(tmp_path: Path) -> None:
    """Photo model: P(cat or dog) is the presence of their summed class evidence (the same
    calibration as any category word); SR: the most probable of their detectors. The index
    path serves it exactly; "a dog or a car" reads the same."""
    model = photo_model()
    codes = photo_codes(3000, seed=3)
    x = codes.toarray()
    match = get_strategy("match", photo_context(codes, model))
    want = model.presence(x[:, 0] + x[:, 1])  # golden retriever + tabby
    for q in ("cats or dogs", "dog or cat", "either a dog or a cat"):
        term = parse_query(q).include[0]
        np.testing.assert_allclose(match.term_probability(term), want, atol=1e-12, err_msg=q)
    index = InvertedIndex.build(tmp_path / "ix", codes, [str(i) for i in range(3000)])
    text = photo_context(sp.csr_matrix((0, codes.shape[1]), dtype=np.float32), model)
    query = parse_query("a cat or a dog but not a bus")
    want_rows, want_scores = rank_query(photo_context(codes, model), query, "match", k=10)
    got = get_strategy("match", text).rank_store(
        index, query, k=10, candidates=16, nonnegative=True
    )
    np.testing.assert_array_equal(got.rows, want_rows)
    np.testing.assert_allclose(got.scores, want_scores, atol=1e-9)

    det = sr_detectors(12)
    scorer = detector_scorer(det)
    sr_codes_ = sr_codes(500, 12, seed=4)
    ctx = sr_context(sr_codes_, det)
    union = scorer.read("dogs or cars")
    assert union.label == "dog or car" and len(union.concepts) == 1
    dog, car = (scorer.probability(scorer.read(t), ctx) for t in ("dog", "car"))
    np.testing.assert_allclose(scorer.probability(union, ctx), np.maximum(dog, car), atol=1e-12)
    # a description with "or" in it is scored as a description, by its code similarity
    assert scorer.read("a man riding a bike or walking a dog").kind == "similarity"


def test_a_shown_percent_reaches_itself_as_a_min_score() -> None:
    """A hit shown at 100% (P = 1 - 6e-13) reaches --min-score 100% (before, it was
    dropped and "0 of 43 items match at 100%" printed under it); 0.29 computed with float
    noise is 29% both ways; a P of none is 0, never -0 (it printed as -0.0 in the JSON)."""
    from sparsemm.query.request import percent, reaches
    from sparsemm.query.scorers import _noisy_or

    for p in (1.0 - 6e-13, 0.29 - 1e-12, 0.5, 0.0100000001, 0.999, 0.3 * 3 / 3):
        shown = percent(p)
        assert shown != "<1%" and reaches(p, int(shown[:-1]) / 100), p
        assert not reaches(p, (int(shown[:-1]) + 1) / 100), p
    assert percent(1.0 - 6e-13) == "100%" and percent(0.29 - 1e-12) == "29%"
    none = _noisy_or([np.zeros(3), np.zeros(3)], 3)
    assert (none == 0).all() and not np.signbit(none).any()
