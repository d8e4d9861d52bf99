"""The served path (index candidates + exact rescoring, certified) == brute force over every
item: on the toy searcher, and on random codes with random model detectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from test_searcher import _collection, _identity_sr

from fakes import term_word_encoder
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.linalg import normalize_rows
from sparsemm.models.detectors import ConceptDetectors
from sparsemm.query.indexing import build_index
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.searcher import Searcher
from sparsemm.query.strategies import ExclusionContext, get_strategy, ranking
from sparsemm.query.strategies.hybrid import _proxy_vectors as proxy_vectors
from sparsemm.query.strategies.ranking import build_strategy, rank_query, scan_rank

WORDS = [
    f"{a}{b}" for a in ("red", "blue", "green", "gold") for b in ("fox", "owl", "elk", "ram", "yak")
]
D = len(WORDS)


@pytest.fixture()
def searcher(tmp_path: Path) -> Searcher:
    col = _collection(tmp_path)
    build_index(col, _identity_sr(tmp_path))
    return Searcher(col)


@pytest.mark.parametrize("text", ["dog but not cat", "a dog and a tree, no ball", "pizza -car"])
def test_toy_searcher_equals_brute_force(searcher: Searcher, text: str) -> None:
    q = parse_query(text)
    rows, scores = rank_query(searcher.context, q, "hybrid", k=5)
    res = get_strategy("hybrid", searcher.context).rank_store(searcher.index, q, k=5, candidates=2)
    assert res.rows.tolist() == rows.tolist()
    assert np.array_equal(res.scores, scores)
    assert res.certified


@pytest.mark.parametrize("text", ["dog but not cat", "a dog and a tree, no ball", "no ball"])
def test_a_search_reads_each_hit_code_once(searcher: Searcher, text: str) -> None:
    """The served ranking keeps the codes it read to rescore its candidates, so a search
    reads no row of the store twice (explaining a hit used to read its code again: for
    a Qdrant store, one more round trip a search)."""
    read: list[int] = []
    codes_of = searcher.store.codes

    def counting(rows):  # type: ignore[no-untyped-def]
        read.extend(int(r) for r in rows)
        return codes_of(rows)

    searcher.store.codes = counting  # type: ignore[method-assign]
    hits = searcher.search(text, k=3)
    assert hits and read
    assert len(read) == len(set(read)), sorted(read)


def test_bad_pool_sizes(searcher: Searcher, tmp_path: Path) -> None:
    """Both served strategies refuse pool sizes that cannot grow (the match scorer used to
    take them and fail later, or never)."""
    q = parse_query("dog")
    _codes, index, full, _rng = _random_world(tmp_path, n=200)
    for strat, store in (
        (get_strategy("hybrid", searcher.context), searcher.index),
        (get_strategy("match", full), index),
    ):
        with pytest.raises(SparsemmError, match="candidates"):
            strat.rank_store(store, q, candidates=0)
        with pytest.raises(SparsemmError, match="candidates"):
            strat.rank_store(store, q, candidates=10, max_candidates=5)


def _random_world(tmp_path: Path, n: int = 3000, seed: int = 0):
    """Random non-negative unit codes over D word dims, an index of them, and a context
    whose query code of a word is its one-hot dim and whose model has a random detector
    per word (weights peaked on the word's dim, some negative, a negative bias)."""
    rng = np.random.default_rng(seed)
    codes = sp.random(n, D, density=0.25, random_state=rng, format="csr", dtype=np.float32)
    codes = normalize_rows(codes)
    index = InvertedIndex.build(tmp_path / "ix", codes, [str(i) for i in range(n)])
    weights = rng.normal(0.0, 1.5, (D, D)).astype(np.float32) + 8.0 * np.eye(D, dtype=np.float32)
    det = ConceptDetectors(
        WORDS, weights, bias=np.full(D, -3.0, np.float32), rate=np.full(D, 0.8, np.float32)
    )
    enc = term_word_encoder(WORDS)()
    ctx = ExclusionContext(
        items_codes=codes,
        text_encoder=enc,
        query_coder=lambda e, t: sp.csr_matrix(e),
        detectors=det,
    )
    return codes, index, ctx, rng


def _queries(rng: np.random.Generator, m: int) -> list[Query]:
    out = []
    for _ in range(m):
        a, b, c, e = (int(v) for v in rng.choice(D, 4, replace=False))
        kind = rng.integers(0, 4)
        if kind == 0:  # label pair
            out.append(Query((WORDS[a],), (WORDS[b],)))
        elif kind == 1:  # two includes, two exclusions
            out.append(Query((WORDS[a], WORDS[c]), (WORDS[b], WORDS[e])))
        elif kind == 2:  # a phrase without a detector (sentence-like) minus a word
            out.append(Query((f"{WORDS[a]} {WORDS[c]} near the river",), (WORDS[b],)))
        else:  # include only
            out.append(Query((WORDS[a],), ()))
    return out


@pytest.mark.parametrize(("seed", "fetch"), [(0, 4096), (1, 4096), (2, 40), (3, None)])
def test_random_codes_equal_brute_force(tmp_path: Path, seed: int, fetch: int | None) -> None:
    """Certified results are exactly the brute-force top k (rows and scores), at every
    offset, with pools far smaller than the collection; the pool grows within the rows
    each search fetched, and a list is searched again past them (fetch = 40, and the
    default: the first pool on an index this small)."""
    codes, index, full, rng = _random_world(tmp_path, seed=seed)
    text = full.sub(sp.csr_matrix((0, D), dtype=np.float32))  # no items at all
    certified = researched = scanned = 0
    for q in _queries(rng, 40):
        for k, offset in ((10, 0), (5, 7)):
            want_rows, want_scores = rank_query(full, q, "hybrid", k=k, offset=offset)
            res = get_strategy("hybrid", text).rank_store(
                index, q, k=k, offset=offset, candidates=32, fetch=fetch
            )
            assert res.rows.tolist() == want_rows.tolist(), (q, k, offset)
            # the hits' codes come back with them, as the index stores them
            assert res.codes.has_sorted_indices
            assert abs(res.codes - codes[res.rows]).max() < 1e-6 if len(res.rows) else True
            if res.mode == "scan":  # the pool would have passed a quarter of the items
                assert res.searches == 0 and res.certified
                scanned += 1
            else:
                assert 1 <= res.searches <= (2 if (fetch or 0) > 3000 else 2 * res.rounds)
                assert res.candidates < 3000
            researched += res.searches > 2
            assert np.array_equal(res.scores, want_scores)
            certified += res.certified
            assert res.certified or res.candidates >= 32
    assert certified == 80
    assert (researched > 0) == ((fetch or 0) < 3000)
    assert scanned < 40


def test_quantised_lists_fall_back_to_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The candidate lists come from ``search_quantized``; when only its err keeps a result
    from being certified and a larger pool would need a new search, the lists are searched
    again exactly at the same size. A larger err is still a valid bound, so one inflated
    here makes that happen often, and results still equal brute force."""
    _codes, index, full, rng = _random_world(tmp_path, seed=4)
    text = full.sub(sp.csr_matrix((0, D), dtype=np.float32))
    quantized = InvertedIndex.search_quantized
    calls = {"quantized": 0, "exact": 0}

    def loose(self: InvertedIndex, query: object, k: int = 10) -> tuple[object, float]:
        calls["quantized"] += 1
        hits, err = quantized(self, query, k=k)
        return hits, err * 40 + 1e-3

    exact = InvertedIndex.search

    def counted(self: InvertedIndex, *args: object, **kwargs: object) -> object:
        calls["exact"] += 1
        return exact(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(InvertedIndex, "search_quantized", loose)
    monkeypatch.setattr(InvertedIndex, "search", counted)
    for q in _queries(rng, 30):
        want_rows, want_scores = rank_query(full, q, "hybrid", k=10)
        res = get_strategy("hybrid", text).rank_store(index, q, k=10, candidates=32, fetch=32)
        assert res.rows.tolist() == want_rows.tolist(), q
        assert np.array_equal(res.scores, want_scores)
    assert calls["quantized"] > 0 and calls["exact"] > 0
    # a pool that cannot grow (max_candidates reached) still gets its exact search: as
    # many certified results as with exact lists from the start
    certified = {}
    for name, fn in (
        ("loose", loose),
        ("exact", lambda self, query, k=10: (exact(self, query, k=k), 0.0)),
    ):
        monkeypatch.setattr(InvertedIndex, "search_quantized", fn)
        certified[name] = sum(
            get_strategy("hybrid", text)
            .rank_store(index, q, k=10, candidates=32, max_candidates=32, fetch=32)
            .certified
            for q in _queries(np.random.default_rng(9), 30)
        )
    assert certified["loose"] == certified["exact"] > 0


def test_second_list_waits_while_the_first_pool_can_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The P list's first search comes only once A's pool cannot grow within the rows A
    fetched (pools 32 -> 128 -> 512 within a fetch of 512: not before the pool is 512),
    and results still equal brute force."""
    _codes, index, full, rng = _random_world(tmp_path, seed=6)
    text = full.sub(sp.csr_matrix((0, D), dtype=np.float32))
    first_searches: list[tuple[int, int]] = []
    top = ranking.ProxyList.top

    def spy(self: ranking.ProxyList, source: object, n: int, fetch: int, cap: int) -> object:
        if not self.searches:
            first_searches.append((id(self), n))
        return top(self, source, n, fetch, cap)  # type: ignore[arg-type]

    monkeypatch.setattr(ranking.ProxyList, "top", spy)
    second = 0
    for q in _queries(rng, 40):
        first_searches.clear()
        want_rows, _ = rank_query(full, q, "hybrid", k=10)
        res = get_strategy("hybrid", text).rank_store(index, q, k=10, candidates=32, fetch=512)
        assert res.rows.tolist() == want_rows.tolist(), q
        if len(first_searches) == 2:
            second += 1
            assert first_searches[0][1] == 32 and first_searches[1][1] >= 512
    assert second > 0


def test_proxy_bounds_every_item(tmp_path: Path) -> None:
    """s(x) <= min(A(x), P(x)) for every item: the inequality the certificate rests on."""
    codes, _, full, rng = _random_world(tmp_path, n=500)
    strat = build_strategy(full, "hybrid")
    signed = 0
    for q in _queries(rng, 30):
        va, vp, bias = proxy_vectors(strat, q)
        s = strat.score_query(q.include, q.exclude)
        # up to float32 rounding, which the certificate's margin covers
        assert (s <= codes @ va + 2e-5 * (1 + np.linalg.norm(va))).all()
        if vp is not None:
            assert (s <= codes @ vp + bias + 2e-5 * (1 + np.linalg.norm(vp))).all()
        # the searched lists are the positive parts: larger still on non-negative codes
        assert (codes @ np.maximum(va, 0) >= codes @ va - 1e-9).all()
        signed += bool((va < 0).any())
    assert signed  # the excluded terms' weights, left out of the searched lists


def test_negative_codes_are_scanned_not_bounded(tmp_path: Path) -> None:
    """The candidate bounds hold for non-negative codes only: an index holding a negative
    value is ranked by the exact scan (and still equals brute force)."""
    codes, _, full, rng = _random_world(tmp_path, n=800, seed=5)
    signed = codes.copy()
    signed.data[::7] *= -1.0
    index = InvertedIndex.build(tmp_path / "signed", signed, [str(i) for i in range(800)])
    assert not index.nonnegative
    ctx = ExclusionContext(
        items_codes=signed,
        text_encoder=full.text_encoder,
        query_coder=full.query_coder,
        detectors=full.detectors,
    )
    text = ctx.sub(sp.csr_matrix((0, D), dtype=np.float32))
    for q in _queries(rng, 8):
        res = get_strategy("hybrid", text).rank_store(index, q, k=10)
        assert res.mode == "scan"
        assert res.rows.tolist() == rank_query(ctx, q, "hybrid", k=10)[0].tolist()


def test_small_pool_cap_is_reported(tmp_path: Path) -> None:
    """A pool capped below what the certificate needs is returned as not certified."""
    _, index, full, rng = _random_world(tmp_path, n=3000, seed=3)
    flags = []
    for q in _queries(rng, 20):
        res = get_strategy("hybrid", full).rank_store(
            index, q, k=10, candidates=10, max_candidates=10
        )
        want = rank_query(full, q, "hybrid", k=10)[0].tolist()
        flags.append(res.certified)
        if res.certified:
            assert res.rows.tolist() == want
    assert not all(flags)


def test_scan_equals_brute_force(tmp_path: Path) -> None:
    """Exclusion-only queries are ranked by scanning the row store in chunks."""
    codes, index, full, _rng = _random_world(tmp_path, n=1000)
    for q in [Query((), (WORDS[3],)), Query((), (WORDS[1], WORDS[7]))]:
        want = rank_query(full, q, "hybrid", k=10, offset=2)
        res = scan_rank(index, full, q, k=10, offset=2, chunk=128)
        assert res.rows.tolist() == want[0].tolist()
        assert abs(res.codes - codes[res.rows]).max() < 1e-6
        assert np.array_equal(res.scores, want[1])
        assert get_strategy("hybrid", full).rank_store(index, q, k=10, offset=2).mode == "scan"


def test_a_strategy_over_some_rows_scores_them_as_the_full_context_does(
    searcher: Searcher, tmp_path: Path
) -> None:
    """Strategy.over: the same strategy and parameters over a context of just the given rows
    (ExclusionContext.sub), sharing the text caches, so a served path's rescoring and a
    ranking over every item agree."""
    q = parse_query("dog but not cat")
    full = build_strategy(searcher.context, "hybrid", beta=0.5)
    rows = np.array([0, 2, 3], dtype=np.int64)
    sub = full.over(searcher.context.items_codes[rows])
    assert type(sub) is type(full) and sub.p == full.p
    assert sub.ctx._emb is searcher.context._emb and sub.ctx.readings is searcher.context.readings
    want = ranking.score_query(searcher.context, q, full)[rows]
    assert np.array_equal(ranking.score_query(sub.ctx, q, sub), want)
