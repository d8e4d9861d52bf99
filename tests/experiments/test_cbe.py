"""CBE (content-based exclusion): the stated rule on hand-worked toy items."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import term_word_encoder
from sparsemm.errors import SparsemmError
from sparsemm.query.strategies import (
    STRATEGIES,
    ExclusionContext,
    ReferenceSet,
    get_strategy,
)
from sparsemm_experiments.baselines.cbe import ContentBasedExclusion, top_mean

WORDS = ["dog", "cat", "car", "tree"]


KeywordEncoder = term_word_encoder(WORDS)


def _unit(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# dims: dog, cat, car, tree
ITEMS = _unit(
    [
        [1.0, 0.0, 0.0, 0.0],  # 0: dog
        [1.0, 0.9, 0.0, 0.0],  # 1: dog + cat
        [0.0, 1.0, 0.0, 0.0],  # 2: cat
        [0.0, 0.0, 1.0, 0.0],  # 3: car
        [0.9, 0.0, 0.0, 0.5],  # 4: dog + tree
        [1.0, 0.3, 0.0, 0.0],  # 5: dog, a little cat (an unlabelled cat in the corner)
    ]
)
# A captioned reference collection: item 1's caption says nothing about the cat in it.
REF_DENSE = _unit(
    [
        [0.1, 1.0, 0.0, 0.0],  # mentions cat
        [0.0, 1.0, 0.0, 0.3],  # mentions cat
        [1.0, 0.0, 0.0, 0.0],  # dog only
        [0.0, 0.0, 1.0, 0.0],  # car
    ]
)
REF_CAPTIONS = [["a cat on a sofa"], ["two cats"], ["a dog"], ["a red car"]]


def _ctx(reference: bool = True) -> ExclusionContext:
    ref = ReferenceSet(REF_CAPTIONS, dense=REF_DENSE) if reference else None
    return ExclusionContext(items_dense=ITEMS, text_encoder=KeywordEncoder(), reference=ref)


def test_registered_as_a_dense_strategy_with_a_small_grid() -> None:
    spec = STRATEGIES["cbe"]
    assert spec.cls is ContentBasedExclusion and spec.kind == "dense"
    assert 1 < len(spec.grid_points()) <= 20
    assert "CBE" in spec.description
    ctx = _ctx()
    for point in spec.grid_points():  # every grid point runs on a context with references
        rows = spec.build(ctx, **point).rank("dog", "cat", 3)
        assert len(rows) == 3


def test_keyword_source_uses_the_reference_items_whose_captions_mention_b() -> None:
    s = get_strategy("cbe", _ctx(), source="keyword", min_positives=1, neighbours=1, w=1.0)
    np.testing.assert_allclose(s.negatives("cat"), REF_DENSE[:2], atol=1e-6)
    # sim_B = the largest cosine to the two cat images; score = cos(dog, x) - sim_B.
    sim = (ITEMS @ REF_DENSE[:2].T).max(axis=1)
    expect = ITEMS @ np.array([1, 0, 0, 0], dtype=np.float32) - sim
    np.testing.assert_allclose(s.scores("dog", "cat"), expect, atol=1e-6)
    # Dog-only items beat the dog + cat items, the pure dog first.
    assert s.rank("dog", "cat", 3).tolist() == [0, 4, 5]


def test_dense_source_takes_b_top_items_and_mean_of_neighbours() -> None:
    s = get_strategy("cbe", _ctx(), source="dense", n_examples=2, neighbours=2, w=0.5)
    # cos(cat, x) ranks item 2 (cat) then item 1 (dog + cat); kept in row order
    np.testing.assert_allclose(s.negatives("cat"), ITEMS[[1, 2]], atol=1e-6)
    sims = ITEMS @ ITEMS[[1, 2]].T
    expect = ITEMS[:, 0] - 0.5 * sims.mean(axis=1)
    np.testing.assert_allclose(s.scores("dog", "cat"), expect, atol=1e-6)


def test_auto_source_and_reference_requirements() -> None:
    assert get_strategy("cbe", _ctx(reference=False)).source == "dense"
    assert get_strategy("cbe", _ctx()).source == "keyword"
    with pytest.raises(SparsemmError, match="reference set"):
        get_strategy("cbe", _ctx(reference=False), source="keyword")
    with pytest.raises(SparsemmError, match="source"):
        get_strategy("cbe", _ctx(), source="captions")
    with pytest.raises(SparsemmError, match="positive"):
        get_strategy("cbe", _ctx(), neighbours=0)


def test_keyword_source_falls_back_to_dense_hits_for_rare_terms() -> None:
    # "tree" is mentioned by no reference caption: B's images = its n_examples top ref items.
    s = get_strategy("cbe", _ctx(), source="keyword", min_positives=1, n_examples=1)
    np.testing.assert_allclose(s.negatives("tree"), REF_DENSE[[1]], atol=1e-6)


def test_threshold_drops_items_close_to_b_images() -> None:
    s = get_strategy(
        "cbe", _ctx(), source="keyword", min_positives=1, neighbours=1, w=0.0, threshold=0.9
    )
    sim = (ITEMS @ REF_DENSE[:2].T).max(axis=1)
    scores = s.scores("dog", "cat")
    assert np.isneginf(scores[sim >= 0.9]).all() and np.isfinite(scores[sim < 0.9]).all()
    assert 2 not in s.rank("dog", "cat", 6).tolist()  # the cat image is gone


def test_exclude_a_leaves_out_images_a_retrieves() -> None:
    ctx = _ctx()
    s = get_strategy("cbe", ctx, source="dense", n_examples=2, exclude_a=True)
    # B = cat retrieves items 2 and 1; A = dog retrieves 0 and 5 -> nothing shared: kept.
    np.testing.assert_allclose(s.negatives("cat", "dog"), ITEMS[[1, 2]], atol=1e-6)
    s4 = get_strategy("cbe", ctx, source="dense", n_examples=4, exclude_a=True)
    # with 4: cat -> {2, 1, 5, 0} (0: first of the zero-cosine ties), dog -> {0, 5, 4, 1}
    np.testing.assert_allclose(s4.negatives("cat", "dog"), ITEMS[[2]], atol=1e-6)
    # and without exclude_a all four stay
    plain = get_strategy("cbe", ctx, source="dense", n_examples=4)
    np.testing.assert_allclose(plain.negatives("cat", "dog"), ITEMS[[0, 1, 2, 5]], atol=1e-6)


def test_top_mean_matches_sorting() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 11))
    for n in (1, 3, 11, 50):
        ref = -np.sort(-x, axis=1)[:, : min(n, 11)].mean(axis=1)
        np.testing.assert_allclose(top_mean(x, n), ref)


def test_cbe_in_the_benchmark(tmp_path) -> None:
    from sparsemm.data.collection import write_collection
    from sparsemm_experiments.eval.bench import BenchConfig, run_exclusion_bench

    rng = np.random.default_rng(0)
    enc = KeywordEncoder()
    items, texts = [], []
    for i in range(80):
        labels = sorted(rng.choice(WORDS, size=int(rng.integers(1, 3)), replace=False).tolist())
        cap = "a " + " and a ".join(w for w in labels if rng.random() < 0.8 or w == labels[0])
        split = "train" if i < 50 else "test"
        items.append({"id": str(i), "labels": labels, "captions": [cap], "split": split})
        texts.append({"item": i, "text": cap})
    views = enc.encode_text([t["text"] for t in texts])
    col = write_collection(
        tmp_path / "c",
        items,
        {"name": "keyword", "dim": len(WORDS)},
        image_emb=views,
        text_emb=views,
        texts=texts,
    )
    content = run_exclusion_bench(
        col,
        tmp_path / "run",
        enc,
        config=BenchConfig(methods=("avg_emb_0.5", "cbe"), max_grid=4),
    )
    assert "cbe" in content["subsets"]["all"]["means"]
    assert len(content["tuning"]["grid"]["cbe"]) == 4
