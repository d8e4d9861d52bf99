"""The research package's baseline strategies (sparsemm_experiments.baselines.strategies) on a
toy corpus whose right answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from fakes import TOY_ITEMS, TOY_WORDS, identity_coder, term_word_encoder, toy_context
from sparsemm.query.strategies import ExclusionContext, get_strategy
from sparsemm_experiments.baselines import strategies as baselines

WORDS, ITEMS = TOY_WORDS, TOY_ITEMS
KeywordEncoder = term_word_encoder(WORDS)


@pytest.fixture
def ctx() -> ExclusionContext:
    return toy_context()


def test_the_baselines_are_registered_by_name() -> None:
    from sparsemm.query.strategies import STRATEGIES

    for name in ("dense_a", "slq", "avg_emb", "avg_emb_0.5", "code_a", "paper", "code_arith"):
        assert STRATEGIES[name].cls.__module__ == baselines.__name__
    assert STRATEGIES["penalty"].cls is baselines.SoftPenalty
    assert STRATEGIES["slq"].kind == "dense" and STRATEGIES["paper"].kind == "sparse"
    assert len(STRATEGIES["code_arith"].grid_points()) == 5


def test_dense_a_ranks_by_a_only(ctx) -> None:
    # cos(dog, x): 1.0 (0), 0.87 (4), 0.78 (1), then zeros in row order.
    assert get_strategy("dense_a", ctx).rank("dog", "cat", 6).tolist() == [0, 4, 1, 2, 3, 5]


def test_slq_keyword_encoder_ignores_negation(ctx) -> None:
    # The fake encoder reads "without a cat" as cat: the item with both ranks first.
    assert get_strategy("slq", ctx).rank("dog", "cat", 1).tolist() == [1]


def test_avg_emb_subtracts_b(ctx) -> None:
    # w=1: dog 1.0, dog+tree .87, dog+cat (1-.8)/1.28=.16, car 0, cat+tree -.93, cat -1.
    assert get_strategy("avg_emb", ctx).rank("dog", "cat", 6).tolist() == [0, 4, 1, 3, 5, 2]
    # w=0.5 keeps dog+cat above car too; the order of the ends is the same.
    assert get_strategy("avg_emb_0.5", ctx).rank("dog", "cat", 3).tolist() == [0, 4, 1]


def test_code_strategies(ctx) -> None:
    assert get_strategy("code_a", ctx).rank("dog", "cat", 3).tolist() == [0, 4, 1]
    arith = get_strategy("code_arith", ctx, w=1.0).rank("dog", "cat", 6).tolist()
    assert arith == [0, 4, 1, 3, 5, 2]


def test_paper_two_step(ctx) -> None:
    # Top-2 for dog: items 0, 4 -> D_A = {dog, tree} (share 1: every non-zero dim);
    # top-2 for cat: items 2, 5 -> D_B = {cat, tree}; D = {dog}.
    s = get_strategy("paper", ctx, top_k=2, share=1.0, pool="topk")
    assert s.rank("dog", "cat", 10).tolist() == [0, 4]  # only A's pool is re-ranked
    s = get_strategy("paper", ctx, top_k=2, share=1.0, pool="all")
    # Mass on dog: 1.0 (0), .87 (4), .78 (1); the rest have none (ties: A's similarity).
    assert s.rank("dog", "cat", 3).tolist() == [0, 4, 1]


def test_paper_mass_on_d_reorders_the_pool() -> None:
    # Item 1 is more similar to "dog" (cosine) but item 0 has more mass on the A-only dim.
    items = np.array([[0.6, 0.0, 0.0, 0.8], [1.0, 0.0, 0.0, 0.05], [0.0, 0.0, 0.0, 1.0]])
    c = ExclusionContext(
        items_codes=sp.csr_matrix(items),
        text_encoder=KeywordEncoder(),
        query_coder=identity_coder,
    )
    # dog: top-2 = (1, 0); D_A (share .5) = {dog (item 1), tree (item 0)}.
    # tree: top-2 = (2, 0); D_B = {tree}. D = {dog}: item 1 (1.0) before item 0 (0.6).
    s = get_strategy("paper", c, top_k=2, share=0.5)
    assert s.rank("dog", "tree", 2).tolist() == [1, 0]


def test_penalty_demotes_instead_of_dropping(ctx) -> None:
    s = get_strategy("penalty", ctx, dims="query", share=1.0, lam=1.0)
    # Same as code arithmetic restricted to cat: dog+cat stays, below dog and dog+tree.
    assert s.rank("dog", "cat", 6).tolist() == [0, 4, 1, 3, 5, 2]
