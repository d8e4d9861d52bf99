"""Ranking metrics against hand-computed values; the batch helper against the single ones."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from sparsemm.errors import SparsemmError
from sparsemm_experiments.eval.metrics import (
    METRIC_FUNCTIONS,
    ap_at_k,
    evaluate_rankings,
    higher_is_better,
    inclusion_at_k,
    mrr_at_k,
    ndcg_at_k,
    parse_metric_name,
    precision_at_k,
    recall_at_k,
    violation_at_k,
)

L2, L3, L5 = 1.0, math.log2(3), math.log2(5)  # log2(i + 1) for i = 1, 2, 4

# Ranking r = [3, 1, 4, 5, 9], R = {1, 5, 7}  ->  rel = [0, 1, 0, 1, 0], |R| = 3.
R1 = [3, 1, 4, 5, 9]
REL1 = {1, 5, 7}


def test_precision_recall() -> None:
    assert precision_at_k(R1, REL1, 5) == pytest.approx(2 / 5)  # 2 hits / k
    assert precision_at_k(R1, REL1, 2) == pytest.approx(1 / 2)
    assert precision_at_k(R1, REL1, 10) == pytest.approx(2 / 10)  # denominator stays k
    assert recall_at_k(R1, REL1, 5) == pytest.approx(2 / 3)  # 2 of |R| = 3
    assert recall_at_k(R1, REL1, 1) == 0.0


def test_mrr() -> None:
    assert mrr_at_k(R1, REL1, 5) == pytest.approx(1 / 2)  # first hit at rank 2
    assert mrr_at_k(R1, REL1, 2) == pytest.approx(1 / 2)
    assert mrr_at_k(R1, REL1, 1) == 0.0  # no hit in the top 1
    assert mrr_at_k([5, 1], REL1, 1) == 1.0


def test_ndcg() -> None:
    # DCG@5 = 1/log2(3) + 1/log2(5) = 0.630930 + 0.430677 = 1.061606
    # IDCG@5 over min(5, 3) = 3 items = 1 + 1/log2(3) + 1/log2(4) = 2.130930 -> 0.498189
    dcg = 1 / L3 + 1 / L5
    idcg = 1 / L2 + 1 / L3 + 1 / 2
    assert ndcg_at_k(R1, REL1, 5) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(R1, REL1, 5) == pytest.approx(0.498189, abs=1e-6)
    # k = 2: DCG = 1/log2(3); IDCG over min(2, 3) = 2 items = 1 + 1/log2(3) -> 0.386853
    assert ndcg_at_k(R1, REL1, 2) == pytest.approx(0.386853, abs=1e-6)
    assert ndcg_at_k([7, 1, 5], REL1, 10) == pytest.approx(1.0)  # ideal order
    # |R| = 1 found at rank 2: (1/log2(3)) / 1 = 0.630930
    assert ndcg_at_k([0, 1], {1}, 10) == pytest.approx(0.630930, abs=1e-6)


def test_ap() -> None:
    # AP@5 = (1 / min(5, 3)) * (P@2 * 1 + P@4 * 1) = (1/3) * (1/2 + 2/4) = 1/3
    assert ap_at_k(R1, REL1, 5) == pytest.approx(1 / 3)
    # AP@2 = (1 / min(2, 3)) * P@2 = (1/2) * (1/2) = 1/4
    assert ap_at_k(R1, REL1, 2) == pytest.approx(1 / 4)
    assert ap_at_k(R1, REL1, 1) == 0.0
    # |R| = 5 > k = 3: a perfect top 3 scores 1 (normaliser min(k, |R|) = 3)
    assert ap_at_k([1, 2, 3], {1, 2, 3, 4, 5}, 3) == pytest.approx(1.0)
    # [1, 9, 2]: (1/3) * (P@1 + P@3) = (1/3) * (1 + 2/3) = 5/9
    assert ap_at_k([1, 9, 2], {1, 2, 3, 4, 5}, 3) == pytest.approx(5 / 9)
    # all of R = {1, 5, 7} at ranks 1..3 with k = 10: (1/3) * (1 + 1 + 1) = 1
    assert ap_at_k([7, 1, 5, 0], REL1, 10) == pytest.approx(1.0)


def test_violation_and_inclusion() -> None:
    b_items = {4, 9, 8}
    a_items = {1, 3, 5, 7}
    assert violation_at_k(R1, b_items, 5) == pytest.approx(2 / 5)  # 4 and 9 carry B
    assert violation_at_k(R1, b_items, 3) == pytest.approx(1 / 3)  # [3, 1, 4]
    assert violation_at_k(R1, b_items, 2) == 0.0
    # Shorter than k: the denominator is the number returned, 1 -> 1/1
    assert violation_at_k([4], b_items, 10) == 1.0
    assert violation_at_k([], b_items, 10) == 0.0
    assert inclusion_at_k(R1, a_items, 5) == pytest.approx(3 / 5)  # 3, 1, 5
    assert inclusion_at_k(R1, a_items, 2) == 1.0
    assert inclusion_at_k([3, 4], a_items, 10) == pytest.approx(1 / 2)


def test_empty_relevant_set_and_ids_of_any_kind() -> None:
    for fn in (precision_at_k, recall_at_k, mrr_at_k, ndcg_at_k, ap_at_k):
        assert fn(R1, set(), 5) == 0.0
    assert ap_at_k(["a", "b"], {"b"}, 2) == pytest.approx(1 / 2)  # (1/1) * P@2
    assert ap_at_k(np.array([3, 1]), np.array([1]), 2) == pytest.approx(1 / 2)


def test_single_query_errors() -> None:
    with pytest.raises(SparsemmError, match="positive integer"):
        ap_at_k(R1, REL1, 0)
    with pytest.raises(SparsemmError, match="more than once"):
        mrr_at_k([1, 1], REL1, 2)


def test_metric_names() -> None:
    assert parse_metric_name("ap@10") == ("ap", 10)
    assert not higher_is_better("violation@10")
    assert higher_is_better("inclusion@10")
    for bad in ("map@10", "ap", "ap@0", "AP@10", "ap@x"):
        with pytest.raises(SparsemmError, match="unknown metric"):
            parse_metric_name(bad)


ALL = [f"{m}@{k}" for m in METRIC_FUNCTIONS for k in (1, 3, 5, 8)]


@pytest.mark.parametrize("as_matrix", [False, True])
def test_batch_equals_single(as_matrix: bool) -> None:
    rng = np.random.default_rng(0)
    q, width, n_items = 40, 6, 15
    rankings = np.stack([rng.permutation(n_items)[:width] for _ in range(q)])
    # Pad some rankings (negative = no item) to exercise shorter lists.
    lengths = rng.integers(0, width + 1, size=q)
    rankings[np.arange(width)[None, :] >= lengths[:, None]] = -1
    sets: dict[str, list[set[int]]] = {
        name: [
            set(rng.choice(n_items, size=rng.integers(0, 6), replace=False).tolist())
            for _ in range(q)
        ]
        for name in ("relevant", "excluded", "included")
    }
    specs: dict[str, Any]
    if as_matrix:
        specs = {}
        for name, rows in sets.items():
            mat = np.zeros((q, n_items), dtype=bool)
            for i, s in enumerate(rows):
                mat[i, list(s)] = True
            specs[name] = mat
    else:
        specs = dict(sets)
    out = evaluate_rankings(
        rankings, specs["relevant"], ALL, excluded=specs["excluded"], included=specs["included"]
    )
    for name in ALL:
        base, k = parse_metric_name(name)
        side = {"violation": "excluded", "inclusion": "included"}.get(base, "relevant")
        expected = [
            METRIC_FUNCTIONS[base]([x for x in row if x >= 0], sets[side][i], k)
            for i, row in enumerate(rankings.tolist())
        ]
        assert out[name].shape == (q,)
        np.testing.assert_allclose(out[name], expected, err_msg=name)


def test_batch_hand_values() -> None:
    out = evaluate_rankings(np.array([R1]), [REL1], ["ap@5", "ndcg@5", "mrr@1", "recall@5"])
    assert out["ap@5"][0] == pytest.approx(1 / 3)
    assert out["ndcg@5"][0] == pytest.approx(0.498189, abs=1e-6)
    assert out["mrr@1"][0] == 0.0
    assert out["recall@5"][0] == pytest.approx(2 / 3)
    empty = evaluate_rankings(np.zeros((0, 3), dtype=int), [], ["ap@3"])
    assert empty["ap@3"].shape == (0,)


def test_batch_errors() -> None:
    r = np.array([[0, 1, 2]])
    with pytest.raises(SparsemmError, match="2-D integer"):
        evaluate_rankings(np.array([0.5, 1.0]), [{1}], ["ap@3"])
    with pytest.raises(SparsemmError, match="more than once"):
        evaluate_rankings(np.array([[0, 1, 1]]), [{1}], ["ap@3"])
    with pytest.raises(SparsemmError, match="excluded= item sets"):
        evaluate_rankings(r, [{1}], ["violation@3"])
    with pytest.raises(SparsemmError, match="one set of item indices per ranking"):
        evaluate_rankings(r, [{1}, {2}], ["ap@3"])
    with pytest.raises(SparsemmError, match="outside the 2 columns"):
        evaluate_rankings(r, np.zeros((1, 2), dtype=bool), ["ap@3"])
    with pytest.raises(SparsemmError, match="unknown metric"):
        evaluate_rankings(r, [{1}], ["map@3"])
