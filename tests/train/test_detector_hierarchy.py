"""Detector targets that follow the concept hierarchy, hypernym detectors, and the match
calibration fitted on held-out items."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from sparsemm.models.detectors import DetectorConfig
from sparsemm.train.detectors import (
    HierarchyTargets,
    fit_calibration,
    fit_concept_detectors,
    label_terms,
)


def test_hierarchical_targets_and_hypernym_terms() -> None:
    captions = [
        ["a puppy on the grass"],
        ["a dog and a cat"],
        ["a bus in the street"],
        ["a red car"],
        ["a truck"],
        ["a kitten"],
    ] * 4
    labels = [["dog"], ["dog", "cat"], ["bus"], ["car"], ["truck"], ["cat"]] * 4
    cfg = DetectorConfig(min_mentions=3)
    hier = HierarchyTargets(captions, None)
    dog = hier.targets("dog", hier.synset("dog"), cfg)
    assert dog[[0, 1]].all() and not dog[[2, 3, 4, 5]].any()  # the puppy is a dog
    vehicle = hier.targets("vehicle", hier.synset("vehicle"), cfg)
    assert vehicle[[2, 3, 4]].all() and not vehicle[[0, 1, 5]].any()  # bus (via transport)
    names = {name for name, _, _ in hier.broader_terms(["dog", "cat", "car", "bus"], cfg, 50)}
    assert "vehicle" in names or "motor vehicle" in names
    # a label keeps its own targets: labels are complete
    labelled = HierarchyTargets(captions, labels)
    assert labelled.targets("dog", labelled.synset("dog"), cfg).tolist() == [
        bool(["dog"] == lab or "dog" in lab or "dog" in cap[0].split())
        for cap, lab in zip(captions, labels, strict=True)
    ]
    assert label_terms(["dog", "puppy", "hot dog"], [["dog"], ["hot dog"]]).tolist() == [
        True,
        False,
        True,
    ]


def test_fitted_detectors_record_their_senses_and_hypernyms() -> None:
    rng = np.random.default_rng(0)
    words = ["dog", "cat", "car", "bus"]
    captions, codes = [], []
    for i in range(120):
        w = words[i % 4]
        captions.append([f"a {w}", f"the {w} here"])
        v = np.zeros(8, np.float32)
        v[i % 4] = 1.0
        codes.append(v + rng.random(8).astype(np.float32) * 0.1)
    det = fit_concept_detectors(np.stack(codes), captions, None, DetectorConfig(min_mentions=5))
    assert det.wnids is not None and len(det.wnids) == len(det.terms)
    assert set(words) <= set(det.terms)
    extra = det.terms[len(words) :]
    assert any(t in extra for t in ("animal", "carnivore", "motor vehicle", "vehicle"))


def test_calibration_is_fitted_on_held_out_items() -> None:
    rng = np.random.default_rng(1)
    words = ["dog", "cat", "car", "bus", "tree"]
    n, d = 700, 10
    codes = np.abs(rng.normal(size=(n, d))).astype(np.float32) * 0.2
    captions = []
    for i in range(n):
        present = [w for j, w in enumerate(words) if rng.random() < 0.3]
        for w in present:
            codes[i, words.index(w)] += 1.0
        captions.append([" and ".join(f"a {w}" for w in present) or "nothing"])
    det = fit_concept_detectors(
        codes, captions, None, DetectorConfig(min_mentions=10, hierarchy=False)
    )
    term_codes = np.abs(rng.normal(size=(len(det.terms), d))).astype(np.float32)
    for j, t in enumerate(det.terms):
        if t in words:
            term_codes[j, words.index(t)] += 3.0
    caption_codes = [codes[i : i + 1] for i in range(n)]
    cal = fit_calibration(codes, captions, None, det, term_codes, caption_codes)
    assert cal is not None and cal.shape == (8,) and np.isfinite(cal).all()
    a, pa = cal[0], cal[3]
    assert a > 0 and pa > 0  # more evidence, more likely
    few = fit_calibration(codes[:200], captions[:200], None, det, term_codes, caption_codes[:200])
    assert few is None  # 40 held-out items are too few
    # the phrase curve is the fitted one flattened about its half point (prior included)
    import sparsemm.train.detectors as td

    factor = td.PHRASE_SLOPE_FACTOR
    try:
        td.PHRASE_SLOPE_FACTOR = 1.0
        steep = fit_calibration(codes, captions, None, det, term_codes, caption_codes)
    finally:
        td.PHRASE_SLOPE_FACTOR = factor
    assert steep is not None
    assert cal[3] == pytest.approx(factor * steep[3], rel=1e-5)
    assert -cal[4] / cal[3] == pytest.approx(-steep[4] / steep[3], rel=1e-5)
    np.testing.assert_allclose(np.delete(cal, [3, 4]), np.delete(steep, [3, 4]), rtol=1e-6)
