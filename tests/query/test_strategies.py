"""Exclusion strategies on toy corpora whose right answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fakes import TOY_ITEMS, TOY_WORDS, identity_coder, term_word_encoder, toy_context
from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.query.strategies import (
    STRATEGIES,
    CaptionIndex,
    ExclusionContext,
    ReferenceSet,
    active_dims,
    available_strategies,
    caption_mentions,
    fit_detectors,
    get_strategy,
    register_strategy,
    sr_query_coder,
    term_tokens,
    top_rows,
)

WORDS, ITEMS = TOY_WORDS, TOY_ITEMS
KeywordEncoder = term_word_encoder(WORDS)


@pytest.fixture
def ctx() -> ExclusionContext:
    return toy_context()


def test_filter_drops_items_carrying_b(ctx) -> None:
    s = get_strategy("filter", ctx, dims="query", share=1.0, threshold=0.1)
    ranking = s.rank("dog", "cat", 10).tolist()
    assert ranking == [0, 4, 3]  # 1, 2, 5 carry cat and are gone
    # "items": D_B from cat's top-2 items (2, 5) = {cat, tree}: dog+tree goes too.
    s = get_strategy("filter", ctx, dims="items", top_k=2, share=1.0, threshold=0.1)
    assert s.rank("dog", "cat", 10).tolist() == [0, 3]


def test_filter_specific_dims_keep_shared_ones(ctx) -> None:
    # B-specific dims: mean over cat's top-2 (2, 5) vs dog's top-2 (0, 4). tree is active in
    # both pools (5 and 4) with similar means, so ratio 2 keeps only cat as B-specific.
    s = get_strategy("filter", ctx, dims="specific", top_k=2, ratio=2.0, threshold=0.1)
    assert s.rank("dog", "cat", 10).tolist() == [0, 4, 3]


def _reference() -> ReferenceSet:
    rng = np.random.default_rng(0)
    rows, caps = [], []
    for _ in range(60):
        present = rng.random(4) < 0.4
        vec = present * rng.uniform(0.5, 1.0, 4)
        rows.append(vec)
        caps.append([" and ".join(f"a {w}" for w, p in zip(WORDS, present, strict=True) if p)])
    codes = sp.csr_matrix(np.array(rows, dtype=np.float32))
    return ReferenceSet(captions=caps, dense=codes.toarray(), codes=codes)


@pytest.mark.parametrize("name", ["detector", "dense_detector"])
def test_detector_learns_terms_from_captions(name) -> None:
    c = ExclusionContext(
        items_dense=ITEMS,
        items_codes=sp.csr_matrix(ITEMS),
        text_encoder=KeywordEncoder(),
        query_coder=identity_coder,
        reference=_reference(),
    )
    s = get_strategy(name, c, l2=1e-3, beta=1.0, min_positives=3)
    ranking = s.rank("dog", "cat", 6).tolist()
    assert set(ranking[:2]) == {0, 4}  # dog without cat
    assert ranking.index(1) > 1  # dog with cat demoted below both
    assert set(ranking[-2:]) == {2, 5}  # cat without dog last
    w, _ = s.weights("dog")  # type: ignore[attr-defined]
    assert int(np.argmax(w)) == 0  # the dog detector weighs the dog dimension most
    # The Elkan-Noto rate correction only sharpens the penalty on B.
    pu = get_strategy(name, c, l2=1e-3, rate="pu", mention_rate=0.7, min_positives=3)
    assert set(pu.rank("dog", "cat", 2).tolist()) == {0, 4}


def test_detector_needs_a_reference(ctx) -> None:
    # said in a user's words, with what to do (it read "needs reference, which the
    # context does not have")
    with pytest.raises(SparsemmError, match=r"needs captioned items .* leave the strategy out"):
        get_strategy("detector", ctx)


def test_sparse_strategy_needs_codes() -> None:
    c = ExclusionContext(items_dense=ITEMS, text_encoder=KeywordEncoder())
    with pytest.raises(SparsemmError, match="codes"):
        get_strategy("code_a", c)


def test_registry() -> None:
    names = available_strategies()
    for n in ("slq", "avg_emb", "avg_emb_0.5", "dense_a", "paper", "filter", "detector"):
        assert n in names
    with pytest.raises(SparsemmError, match="unknown exclusion strategy"):
        get_strategy("nope", ExclusionContext(items_dense=ITEMS))
    with pytest.raises(SparsemmError, match="no parameter"):
        get_strategy("avg_emb", ExclusionContext(items_dense=ITEMS), bogus=1)
    with pytest.raises(SparsemmError, match="bad strategy name"):
        register_strategy("a|b", STRATEGIES["avg_emb"].cls, "x")
    assert STRATEGIES["filter"].kind == "sparse"
    assert STRATEGIES["dense_detector"].kind == "dense"
    assert len(STRATEGIES["code_arith"].grid_points()) == 5


def test_strategies_of_other_packages_come_in_through_entry_points(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module named by a sparsemm.strategies entry point is imported and its strategy
    registered; one whose import fails is skipped, and the library's stay as they were."""
    import sys
    from importlib.metadata import EntryPoint

    import sparsemm.query.strategies.registry as registry

    (tmp_path / "plugin_strategy.py").write_text(
        "from sparsemm.query.strategies import HardFilter, register_strategy\n"
        "register_strategy('plugin_filter', HardFilter, 'sparse: a plugin', threshold=0.25)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        EntryPoint("plugin_filter", "plugin_strategy", registry.STRATEGY_GROUP),
        EntryPoint("broken", "no_such_module_here", registry.STRATEGY_GROUP),
        EntryPoint("other", "plugin_strategy", "sparsemm.other"),
    ]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [e for e in eps if e.group == group]
    )
    before = dict(STRATEGIES)
    try:
        registry.load_entry_points()
        assert set(STRATEGIES) - set(before) == {"plugin_filter"}
        assert STRATEGIES["plugin_filter"].defaults == {"threshold": 0.25}
        assert all(STRATEGIES[n] is spec for n, spec in before.items())
    finally:
        STRATEGIES.pop("plugin_filter", None)
        sys.modules.pop("plugin_strategy", None)


def test_rank_many_pads_short_rankings(ctx) -> None:
    s = get_strategy("filter", ctx, dims="query", share=1.0, threshold=0.1)
    out = s.rank_many([("dog", "cat"), ("cat", "dog")], 4)
    assert out.shape == (2, 4)
    assert out[0].tolist() == [0, 4, 3, -1]


def test_helpers() -> None:
    assert top_rows(np.array([0.1, -np.inf, 0.5, 0.5]), 3).tolist() == [2, 3, 0]
    codes = sp.csr_matrix(np.array([[0.6, 0.3, 0.1, 0.0], [0.0, 0.0, 0.5, 0.5]]))
    assert active_dims(codes, np.array([0]), 0.5).tolist() == [0]
    assert active_dims(codes, np.array([0]), 0.8).tolist() == [0, 1]
    assert active_dims(codes, np.array([0, 1]), 0.5).tolist() == [0, 2]
    assert term_tokens("Two dogs and the buses") == ["two", "dog", "bus"]


def test_caption_mentions() -> None:
    caps = [
        ["Two dogs on a couch."],
        ["A table set for dinner."],
        ["A dining table with plates."],
        ["A hot dog stand."],
        ["A cat."],
    ]
    assert caption_mentions(caps, "dog").tolist() == [True, False, False, True, False]
    # "dining table" is one item but "table" two: rarer than head_ratio x head -> head too.
    assert caption_mentions(caps, "dining table", min_positives=1, head_ratio=0.6).tolist() == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert caption_mentions(caps, "dining table", min_positives=1, head_ratio=0.0).tolist() == [
        False,
        False,
        True,
        False,
        False,
    ]
    assert not CaptionIndex(caps).mentions("the").any()  # no content token


def test_fit_detectors_separates() -> None:
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.8]], dtype=np.float32)
    y = np.array([[1], [1], [0], [0]])
    w, b = fit_detectors(x * 5, y, l2=1e-3)
    z = (x * 5) @ w[:, 0] + b[0]
    assert (z[:2] > 0).all() and (z[2:] < 0).all()


def test_fit_detectors_runs_on_one_thread_and_restores_the_setting(monkeypatch) -> None:
    """Multi-threaded sums add in a varying order and moved AP@10 by ~1e-4 run to run, so
    the L-BFGS fit runs on one thread; the caller's thread count comes back afterwards."""
    import torch

    seen: list[int] = []
    step = torch.optim.LBFGS.step

    def spy(self, closure):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return step(self, closure)

    monkeypatch.setattr(torch.optim.LBFGS, "step", spy)
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.8]], dtype=np.float32)
    y = np.array([[1], [1], [0], [0]])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        w2, b2 = fit_detectors(x, y)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        w1, b1 = fit_detectors(x, y)
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]
    np.testing.assert_array_equal(w1, w2)
    np.testing.assert_array_equal(b1, b2)


def test_sr_query_coder_shapes() -> None:
    import torch

    torch.manual_seed(0)
    model = SRModel(SRConfig(text_dim=4, image_dim=4, latent_dim=8, top_k=3))
    coder = sr_query_coder(model)
    emb = KeywordEncoder().encode_text(["a dog", "a cat"])
    codes = coder(emb, ["a dog", "a cat"])
    assert codes.shape == (2, 8)
    assert codes.getnnz(axis=1).max() <= 3
    with pytest.raises(SparsemmError, match="SPINE"):
        sr_query_coder(model, None, mask="topk_or_bias")


# ------------------------------------------------------------- fast paths vs naive slicing


class RandomTerms:
    """Fake text encoder: each text gets a fixed random unit vector (seeded by the text)."""

    dim = 16

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        import zlib

        out = np.stack(
            [np.random.default_rng(zlib.crc32(t.encode())).normal(size=self.dim) for t in texts]
        ).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def _random_ctx(seed: int, negative: bool = False, **kw) -> ExclusionContext:
    """120 items x 60 dims, ~12 non-zeros each; query codes = ReLU top-6 of a projection."""
    rng = np.random.default_rng(seed)
    n, d = 120, 60
    codes = sp.random(n, d, density=0.2, random_state=seed, format="csr", dtype=np.float32)
    codes.data = rng.gamma(0.5, 1.0, size=codes.nnz).astype(np.float32)
    if negative:
        codes.data *= rng.choice([-1.0, 1.0], size=codes.nnz).astype(np.float32)
    proj = rng.normal(size=(RandomTerms.dim, d)).astype(np.float32)

    def coder(emb, texts):
        z = np.maximum(emb @ proj, 0.0)
        z[z < np.sort(z, axis=1)[:, -6:-5]] = 0.0
        return sp.csr_matrix(z)

    return ExclusionContext(items_codes=codes, text_encoder=RandomTerms(), query_coder=coder, **kw)


def _slice_mass(ctx: ExclusionContext, dims: np.ndarray) -> np.ndarray:
    """The naive reference: sum of |x_j| over the sliced columns (the former code path)."""
    return np.asarray(abs(ctx.codes_unit[:, dims]).sum(axis=1), dtype=np.float64).ravel()


def _slice_peak(ctx: ExclusionContext, dims: np.ndarray) -> np.ndarray:
    return np.asarray(abs(ctx.codes_unit[:, dims]).max(axis=1).toarray()).ravel()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mass_and_peaks_equal_the_column_slice_reference(seed) -> None:
    ctx = _random_ctx(seed, negative=seed == 2)
    rng = np.random.default_rng(seed)
    for _ in range(30):
        dims = np.unique(rng.choice(60, size=rng.integers(1, 40)))
        ref = _slice_mass(ctx, dims)
        # same float32 terms in the same order; only scipy's pairwise grouping differs
        np.testing.assert_allclose(ctx.mass_on(dims), ref, rtol=1e-6, atol=1e-7)
        peak = _slice_peak(ctx, dims)
        for thr in (0.0, 0.05, 0.1, 0.3, 1.0, -0.1):
            assert np.array_equal(ctx.peak_over(dims, thr), peak > thr)


def test_paper_and_filter_scores_equal_the_slicing_reference() -> None:
    ctx = _random_ctx(3)
    terms = [f"t{i}" for i in range(12)]
    pairs = [(a, b) for a in terms for b in terms if a != b]
    for params in ({"top_k": 10, "share": 0.5, "pool": "topk"}, {"top_k": 25, "pool": "all"}):
        paper = get_strategy("paper", ctx, **params)
        for a, b in pairs:
            da = paper.item_dims(a, paper.p["top_k"], paper.p["share"])
            db = paper.item_dims(b, paper.p["top_k"], paper.p["share"])
            mass = _slice_mass(ctx, np.setdiff1d(da, db))
            ref = mass * 4.0 + (ctx.code_scores(ctx.term_code(a)) + 1.0) / 2.0
            if params["pool"] == "topk":
                pool = paper.top_items(a, paper.p["top_k"])
                ref, full = np.full(ctx.n_items, -np.inf), ref
                ref[pool] = full[pool]
            got = paper.scores(a, b)
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
            assert np.array_equal(top_rows(got, 10), top_rows(ref, 10))
    for params in ({"dims": "query", "threshold": 0.1}, {"dims": "items", "threshold": 0.05}):
        filt = get_strategy("filter", ctx, **params)
        for a, b in pairs:
            dims = np.flatnonzero(filt.b_weights(a, b) > 0)
            ref = ctx.code_scores(ctx.term_code(a))
            if len(dims):
                ref = np.where(_slice_peak(ctx, dims) > params["threshold"], -np.inf, ref)
            assert np.array_equal(filt.scores(a, b), ref)


def test_caches_are_bounded_lru_and_answers_do_not_change() -> None:
    from sparsemm.query.strategies import LRUCache

    cache = LRUCache(3)
    for k in "abc":
        cache[k] = k
    assert cache["a"] == "a"  # a read is a use: b is now the oldest
    cache["d"] = "d"
    assert list(cache) == ["c", "a", "d"]
    assert cache.setdefault("e", 5) == 5 and "c" not in cache and cache.get("zz") is None
    with pytest.raises(SparsemmError):
        ExclusionContext(items_codes=sp.eye(3, format="csr"), cache_size=2)

    small, big = _random_ctx(4, cache_size=16), _random_ctx(4)
    texts = [f"text {i}" for i in range(40)]
    assert np.array_equal(small.embed(texts), big.embed(texts))  # more texts than it holds
    assert np.array_equal(small.code(texts), big.code(texts))
    pairs = [(f"t{i}", f"t{j}") for i in range(8) for j in range(8) if i != j]
    for name in ("paper", "filter", "penalty", "code_arith"):
        assert np.array_equal(
            get_strategy(name, small).rank_many(pairs, 10),
            get_strategy(name, big).rank_many(pairs, 10),
        )
    assert max(len(c) for c in small.query_caches()) <= 16
    assert len(big.cache) > 16  # the same work caches more without the bound


def test_reference_labels_count_as_mentions() -> None:
    from sparsemm.query.strategies import ReferenceSet

    caps = [["a dog on grass"], ["a sofa"], ["two cats"], ["a street"]]
    ref = ReferenceSet(caps, labels=[["dog"], ["couch", "cat"], [], ["dining table"]])
    assert ref.mentions("dog", 1).tolist() == [True, False, False, False]
    # "cats" in a caption, "cat" as a label of item 1: both are mentions of "cat"
    assert ref.mentions("cat", 1).tolist() == [False, True, True, False]
    assert ref.mentions("couch", 1).tolist() == [False, True, False, False]
    assert ref.mentions("dining tables", 1).tolist() == [False, False, False, True]
    assert not ReferenceSet(caps).mentions("couch", 1).any()
    with pytest.raises(SparsemmError, match="labels have 1 rows"):
        ReferenceSet(caps, labels=[["dog"]])


def test_hybrid_falls_back_to_code_arithmetic_without_captions() -> None:
    """No reference set (a collection without captions): hybrid = alpha cos(I) - gamma cos(B)."""
    from sparsemm.query.parse import Query
    from sparsemm.query.strategies.ranking import score_query

    codes = sp.csr_matrix(np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1]], np.float32))
    ctx = ExclusionContext(
        items_codes=codes,
        text_encoder=_OneHot(),
        query_coder=lambda emb, texts: sp.csr_matrix(emb),
    )
    s = score_query(ctx, Query(("x0",), ("x1",)), "hybrid", alpha_phrase=1.0, gamma=1.0)
    unit = codes.toarray() / np.linalg.norm(codes.toarray(), axis=1, keepdims=True)
    expected = unit[:, 0] - unit[:, 1]
    expected[unit[:, 0] <= 0] = -np.inf  # no concept in common with the include
    assert np.allclose(s, expected)
    absence = score_query(ctx, Query((), ("x1",)), "hybrid")  # ranked by absence
    assert absence.argmax() in (0, 3) and absence[2] == absence.min()


class _OneHot:
    """Text "xJ" -> the J-th unit vector of R^3 (a fake text encoder)."""

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        out = np.zeros((len(texts), 3), np.float32)
        for i, t in enumerate(texts):
            out[i, int(t.split("x")[-1])] = 1.0
        return out
