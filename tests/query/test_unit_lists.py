"""Unit lists: per detector, the items most likely to show it, computed when the index is
built; the served match path certifies from them, equal to ranking every item; stale or
damaged lists are never used."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("torch")

from fakes import (
    KeywordEncoder,
    identity_sr,
    keyword_collection,
    sr_codes,
    sr_context,
    sr_detectors,
)
from sparsemm.cli.main import main
from sparsemm.encoders.base import register_encoder
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.query.parse import parse_query
from sparsemm.query.scorers import detector_scorer
from sparsemm.query.searcher import Searcher
from sparsemm.query.strategies import get_strategy
from sparsemm.query.strategies.ranking import rank_query
from sparsemm.query.unit_lists import (
    MARGIN,
    UnitLists,
    _round_up16,
    build_unit_lists,
    list_length,
)

D = 12


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


N = 3000


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("units")
    det = sr_detectors(D)
    codes = sr_codes(N, D, seed=5)
    index = InvertedIndex.build(tmp / "ix", codes, [str(i) for i in range(N)])
    full = sr_context(codes, det)
    text = sr_context(sp.csr_matrix((0, D), dtype=np.float32), det)
    lists = build_unit_lists(detector_scorer(det), text, codes, index, length=600)
    return det, codes, index, full, text, lists, tmp


def test_lists_bound_every_items_probability(setup) -> None:
    det, _codes, _index, full, _text, lists, _ = setup
    scorer = detector_scorer(det)
    assert lists.rows.shape == (len(det), 600) and lists.count == N
    for u in range(len(det)):
        p = scorer.unit_probability(u, full)
        listed = lists.rows[u].astype(np.int64)
        # the list holds the most probable items, best first, each under its bound
        assert np.all(np.diff(p[listed]) <= 1e-6)
        assert np.all(p[listed] <= _sigmoid(lists.ub[u].astype(np.float64)))
        others = np.setdiff1d(np.arange(N), listed)
        assert p[others].max() <= _sigmoid(float(lists.theta[u]))
        assert p[others].max() <= p[listed].min() + 1e-6
        # an item after the first n of the list is under the bound top() gives for n
        for n in (1, 10, 600):
            rows, bound = lists.top(u, n)
            rest = np.setdiff1d(np.arange(N), rows)
            assert p[rest].max() <= bound


def test_served_match_from_unit_lists_equals_ranking_every_item(setup) -> None:
    _det, _codes, index, full, text, lists, _ = setup
    m = get_strategy("match", full)
    modes = set()
    for q in (
        "dog but not cat",
        "cats",
        "a car",
        "an animal but no car",
        "vehicles, no bus",
        "a person without a hat",
        "there is a dog and a car",
    ):
        query = parse_query(q)
        for k, offset in ((10, 0), (5, 7)):
            want_rows, want_scores = rank_query(full, query, "match", k=k, offset=offset)
            got = get_strategy("match", text).rank_store(
                index, query, k=k, offset=offset, candidates=8, unit_lists=lists
            )
            np.testing.assert_array_equal(got.rows, want_rows, err_msg=q)
            np.testing.assert_allclose(got.scores, want_scores, atol=1e-9)
            modes.add(got.mode)
        brute = int((m.probability(query.include, query.exclude) >= 0.5).sum())
        assert (
            get_strategy("match", text).count_store(
                index, query, 0.5, candidates=8, unit_lists=lists
            )
            == brute
        )
    assert "unit lists" in modes  # the lists certified some queries on their own


def test_list_bounds_are_within_a_step_of_each_items_probability(setup) -> None:
    """The bounds are logits: a listed item's bound is within 1e-3 of its probability, so
    one at P = 0.995 stays in the 0.99 step (a byte of probability read it as 1.0)."""
    det, _codes, _index, full, _text, lists, _ = setup
    scorer = detector_scorer(det)
    for u in range(len(det)):
        p = scorer.unit_probability(u, full)[lists.rows[u].astype(np.int64)]
        gap = _sigmoid(lists.ub[u].astype(np.float64)) - p
        assert gap.min() >= 0.0 and gap.max() <= 1e-3
    # the same on a sharp detector's probabilities near 1
    z = np.linspace(4.0, 12.0, 2001).astype(np.float32)
    ub = _round_up16(z + np.float32(MARGIN))
    assert np.all(ub.astype(np.float64) >= z)
    p, bound = _sigmoid(z), _sigmoid(ub.astype(np.float64))
    assert np.all(bound >= p) and np.all(bound - p <= 1e-4)
    near_one = p < 0.999
    assert np.all(np.floor(bound[near_one] / 0.01 + 1e-9) <= 99)


def _sharp(det):
    """The fixture's detectors made sharp: many items have P(unit) >= 0.99."""
    from sparsemm.models.detectors import ConceptDetectors

    return ConceptDetectors(
        list(det.terms),
        det.weights * 8.0,
        det.bias + 6.0,
        det.rate,
        calibration=det.calibration,
        wnids=det.wnids,
        label_terms=det.label_terms,
    )


def test_a_common_concept_is_certified_by_its_tie_break_list(setup, tmp_path) -> None:
    """More items than a list holds sit in the top 1% step, so no list ends below it; the
    include text's code list bounds the tie-break that orders that step, which certifies
    the top k from the lists (no scan), equal to ranking every item."""
    det0, codes, index, _full, _text, _lists, _ = setup
    det = _sharp(det0)
    full = sr_context(codes, det)
    text = sr_context(sp.csr_matrix((0, D), dtype=np.float32), det)
    lists = build_unit_lists(detector_scorer(det), text, codes, index, length=40)
    scorer = detector_scorer(det)
    searched = 0
    for q in ("dog but not cat", "a car", "cats", "vehicles"):
        query = parse_query(q)
        c = scorer.read(query.include[0]).concepts[0]
        # the premise: the concept's list ends in the top step
        assert max(lists.top(u, 40)[1] for u, _ in c.units) >= 0.99, q
        for k, offset in ((10, 0), (5, 7)):
            want_rows, want_scores = rank_query(full, query, "match", k=k, offset=offset)
            got = get_strategy("match", text).rank_store(
                index, query, k=k, offset=offset, unit_lists=lists
            )
            np.testing.assert_array_equal(got.rows, want_rows, err_msg=q)
            np.testing.assert_allclose(got.scores, want_scores, atol=1e-9)
            assert got.mode == "unit lists" and got.certified, q
            assert got.candidates < N // 2, q
            searched += got.searches
    assert searched  # the tie list was searched


def test_a_served_match_is_never_returned_unproven(setup) -> None:
    """A pool capped before it proves the top k gives way to the exact scan."""
    det0, codes, index, _full, _text, _lists, _ = setup
    det = _sharp(det0)
    full = sr_context(codes, det)
    text = sr_context(sp.csr_matrix((0, D), dtype=np.float32), det)
    for q in ("dog but not cat", "a car", "a person without a bus", "vehicles"):
        query = parse_query(q)
        want_rows, _ = rank_query(full, query, "match", k=10)
        got = get_strategy("match", text).rank_store(
            index, query, k=10, candidates=16, max_candidates=16
        )
        assert got.certified, q
        np.testing.assert_array_equal(got.rows, want_rows, err_msg=q)


def test_a_served_match_reads_each_term_once(setup, monkeypatch) -> None:
    """The rescoring rounds' contexts share the readings: the scorer reads each term of a
    query once, however many rounds the pool takes (and not again for the next search)."""
    det0, codes, index, _full, _text, _lists, _ = setup
    det = _sharp(det0)
    text = sr_context(sp.csr_matrix((0, D), dtype=np.float32), det)
    lists = build_unit_lists(detector_scorer(det), text, codes, index, length=40)
    scorer = detector_scorer(det)
    read = []
    real = type(scorer).read

    def counted(self, term):
        read.append(term)
        return real(self, term)

    monkeypatch.setattr(type(scorer), "read", counted)
    query = parse_query("dog but not cat")
    got = get_strategy("match", text).rank_store(index, query, k=10, unit_lists=lists)
    assert got.rounds > 1
    assert sorted(read) == ["cat", "dog"]
    get_strategy("match", text).rank_store(index, query, k=10, unit_lists=lists)
    assert sorted(read) == ["cat", "dog"]


def test_units_probabilities_in_one_product_are_each_units_calibrated_detector(setup) -> None:
    """P(u | x) = sigmoid(a (w_u . x/|x| + b_u) + g cos(q_u, x) + c), (a, g, c) of a label or
    of a caption word, for many units in one product."""
    det, _codes, _index, full, _text, _lists, _ = setup
    scorer = detector_scorer(det)
    units = list(range(len(det)))
    got = scorer.units_probability(units, full)
    x = np.asarray(full.codes_unit.todense(), dtype=np.float64)
    cal = det.calibration.astype(np.float64)
    for u in units:
        a, g, c = cal[5:8] if det.label_terms[u] else cal[0:3]
        w = det.weights[:, u].astype(np.float64) * det.config.scale
        q = np.asarray(scorer.term_code(u, full), dtype=np.float64)
        cos = x @ (q / np.linalg.norm(q))
        want = _sigmoid(a * (x @ w + det.bias[u]) + g * cos + c)
        np.testing.assert_allclose(got[:, u], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(scorer.unit_probability(u, full), got[:, u])


def test_a_broad_concept_is_rescored_once_a_round_and_scanned_past_the_pool(
    setup, monkeypatch
) -> None:
    """A concept read through many units ("an animal", "objects") adds each round's new
    rows in one exact rescore, not one per unit; a pool grown past the largest one without
    proving the top k gives way to the scan, with the same answer as ranking every item."""
    from sparsemm.query.strategies import ranking

    det0, codes, index, _full, _text, _lists, _ = setup
    det = _sharp(det0)
    full = sr_context(codes, det)
    text = sr_context(sp.csr_matrix((0, D), dtype=np.float32), det)
    lists = build_unit_lists(detector_scorer(det), text, codes, index, length=40)
    calls = []
    real = ranking._rescore

    def counted(source, strat, query, rows):
        calls.append(len(rows))
        return real(source, strat, query, rows)

    monkeypatch.setattr(ranking, "_rescore", counted)
    for q in ("an animal but no car", "objects, no bus", "an organism"):
        query = parse_query(q)
        assert len(get_strategy("match", text).reading(query.include[0]).concepts[0].units) > 1
        want_rows, _ = rank_query(full, query, "match", k=10)
        calls.clear()
        got = get_strategy("match", text).rank_store(
            index, query, k=10, candidates=4, unit_lists=lists
        )
        np.testing.assert_array_equal(got.rows, want_rows, err_msg=q)
        if got.mode == "unit lists":
            assert len(calls) <= got.rounds, q
        calls.clear()
        capped = get_strategy("match", text).rank_store(
            index, query, k=10, candidates=4, max_candidates=8, unit_lists=lists
        )
        assert capped.mode == "scan" and capped.certified, q
        np.testing.assert_array_equal(capped.rows, want_rows, err_msg=q)


def test_lists_round_trip_and_refuse_damage(setup) -> None:
    det, codes, index, _full, _text, lists, tmp = setup
    root = tmp / "col"
    root.mkdir()
    assert UnitLists.load(root) is None
    lists.save(root)
    back = UnitLists.load(root)
    assert back is not None and back.fits(det, index)
    np.testing.assert_array_equal(back.rows, lists.rows)
    np.testing.assert_array_equal(back.ub, lists.ub)
    # other detectors, or an index that changed, no longer fit
    other = sr_detectors(D, seed=1)
    assert not back.fits(other, index)
    grown = InvertedIndex.build(tmp / "ix2", codes, [str(i) for i in range(N)])
    grown.add(codes[:3], ["a", "b", "c"])
    assert not back.fits(det, grown)
    # a damaged file is refused by name
    data = bytearray((root / "unit_lists" / "ub.npy").read_bytes())
    data[-1] ^= 0xFF
    (root / "unit_lists" / "ub.npy").write_bytes(bytes(data))
    with pytest.raises(SparsemmError, match=r"ub\.npy does not match its checksum"):
        UnitLists.load(root)
    meta = json.loads((root / "unit_lists" / "meta.json").read_text())
    meta["version"] = 99
    (root / "unit_lists" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SparsemmError, match="another sparsemm"):
        UnitLists.load(root)


def test_lists_without_checksums_are_not_trusted(setup) -> None:
    """Lists whose checksums were removed and bounds zeroed once gave a wrong top 10 with a
    warning about an older version; lists without checksums are now refused (the searcher
    then goes without them, exact)."""
    _det, _codes, _index, _full, _text, lists, tmp = setup
    root = tmp / "col-unchecked"
    root.mkdir()
    lists.save(root)
    folder = root / "unit_lists"
    np.save(folder / "ub.npy", np.zeros_like(lists.ub), allow_pickle=False)
    np.save(folder / "theta.npy", np.zeros_like(lists.theta), allow_pickle=False)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["sha256"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SparsemmError, match="records no checksums"):
        UnitLists.load(root)


def test_list_length_scales_with_the_collection() -> None:
    assert list_length(500) == 500
    assert list_length(100_000) == 1562
    assert list_length(10_000_000) == 16384


# -- built by `sparsemm index`, used by the Searcher, ignored when stale --------------------

WORDS = ("dog", "cat", "car", "bus", "tree", "ball", "person", "pizza")


class _Words(KeywordEncoder):
    name = "unitlistkw"
    keywords = WORDS


register_encoder("unitlistkw")(_Words)


def test_index_builds_lists_the_searcher_uses_and_drops_when_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sparsemm.query.unit_lists as ul

    monkeypatch.setattr(ul, "MIN_ITEMS", 50)  # a toy collection stands in for a large one
    rng = np.random.default_rng(0)
    objects = {
        f"i{i}": sorted(set(rng.choice(WORDS, size=int(rng.integers(1, 4))).tolist()))
        for i in range(600)
    }
    col = keyword_collection(tmp_path / "col", _Words(), objects)
    sr = identity_sr(tmp_path / "sr", len(WORDS))
    train = ["train", "detectors", str(sr), str(col), "--min-mentions", "5", "--no-progress"]
    assert main(train) == 0
    assert main(["index", str(col), "--model", str(sr), "--no-progress"]) == 0
    assert (col / "unit_lists" / "meta.json").is_file()
    s = Searcher(col)
    assert s.unit_lists is not None and s.unit_lists.count == 600

    def brute(q: str, k: int = 5) -> list[str]:
        rows, _ = rank_query(s.context, parse_query(q), "match", k=k)
        return [s.collection.ids[int(r)] for r in rows]

    queries = ("dog but not cat", "a car", "pizza, no person", "a ball without a tree")
    for q in queries:
        assert [h.id for h in s.search(q, k=5)] == brute(q), q
    # detectors fitted again (other settings): the lists no longer fit and are not used
    assert main([*train[:-3], "--min-mentions", "5", "--max-terms", "6", "--no-progress"]) == 0
    with caplog.at_level("WARNING"):
        stale = Searcher(col)
        assert stale.unit_lists is None
    assert "computed for other detectors or another index" in caplog.text
    for q in queries:
        rows, _ = rank_query(stale.context, parse_query(q), "match", k=5)
        assert [h.id for h in stale.search(q, k=5)] == [stale.collection.ids[int(r)] for r in rows]
    # re-indexing builds them again; a collection under the size gets none
    assert main(["index", str(col), "--model", str(sr), "--no-progress"]) == 0
    assert Searcher(col).unit_lists is not None
    monkeypatch.setattr(ul, "MIN_ITEMS", 10_000)
    assert main(["index", str(col), "--model", str(sr), "--no-progress"]) == 0
    assert not (col / "unit_lists").exists()


def test_an_uncertified_result_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the index path stops growing its candidates before proving the top k (very
    large collections), the CLI says so in a note and --json reports certified false."""
    import dataclasses

    from sparsemm.query.strategies import Match

    objects = {f"i{i}": [WORDS[i % 4], WORDS[(i + 1) % 8]] for i in range(40)}
    col = keyword_collection(tmp_path / "col", _Words(), objects)
    sr = identity_sr(tmp_path / "sr", len(WORDS))
    assert main(["train", "detectors", str(sr), str(col), "--min-mentions", "3"]) == 0
    assert main(["index", str(col), "--model", str(sr), "--no-progress"]) == 0
    real = Match.rank_store

    def stopped(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), certified=False)

    monkeypatch.setattr(Match, "rank_store", stopped)
    capsys.readouterr()
    assert main(["search", str(col), "dog but not cat", "--no-server"]) == 0
    assert "before proving these are the exact top results" in capsys.readouterr().err
    assert main(["search", str(col), "dog but not cat", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["certified"] is False


def test_the_tie_list_bounds_every_items_code_similarity(setup) -> None:
    """The tie-break list's bound: an item outside the first m rows of the include text's
    code list has a code similarity (the match scorer's tie) of at most the list's bound,
    with the quantised search's err, and with the query cut to fewer dims than it has."""
    from sparsemm.query.strategies.ranking import MARGIN, ProxyList, cut

    _det, _codes, index, full, _text, _lists, _ = setup
    m = get_strategy("match", full)
    for text_ in ("dog", "a red car", "cats and dogs"):
        tie = m.tie([text_])
        q = np.asarray(full.term_code(text_), dtype=np.float64)
        for proxy_dims in (3, 256):
            dims, vals, residual = cut(q / np.linalg.norm(q), proxy_dims)
            for quantized in (True, False):
                plist = ProxyList(dims, vals, residual, MARGIN)
                plist.quantized = quantized
                for n in (1, 10, 100):
                    rows, bound = plist.top(index, n, 100, 400)
                    rest = np.setdiff1d(np.arange(N), rows)
                    assert tie[rest].max() <= bound, (text_, proxy_dims, quantized, n)
