from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsemm_experiments.eval.metrics import ap_at_k
from sparsemm_experiments.eval.retrieval import (
    multi_target_ap,
    recall_at_ks,
    target_ranks,
    top_k_rows,
)


def test_target_ranks_dense_and_sparse_agree_and_count_ties_against() -> None:
    items = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]], dtype=np.float32)
    queries = np.array([[1, 0, 0], [0, 0, 1], [0, 0, 0]], dtype=np.float32)
    # q0: item0 cos 1, item3 cos .707 -> target 0 is rank 0; q1 target 2 rank 0;
    # q2 (all-zero query) scores every item 0, so its target ranks last-but-ties: rank 3.
    ranks = target_ranks(queries, items, np.array([0, 2, 1]))
    assert ranks.tolist() == [0, 0, 3]
    assert (
        target_ranks(sp.csr_matrix(queries), sp.csr_matrix(items), np.array([0, 2, 1])) == ranks
    ).all()
    assert recall_at_ks(ranks, (1, 4)) == {"R@1": 2 / 3, "R@4": 1.0}


def test_multi_target_ap_matches_single_query_definition() -> None:
    rng = np.random.default_rng(0)
    items = rng.normal(size=(30, 8)).astype(np.float32)
    queries = rng.normal(size=(6, 8)).astype(np.float32)
    relevant = [rng.choice(30, size=5, replace=False) for _ in range(6)]
    got = multi_target_ap(queries, items, relevant, ks=(1, 5, 10))
    ranking = top_k_rows(queries, items, 10)
    for k in (1, 5, 10):
        expected = np.mean(
            [
                ap_at_k(list(r), set(rel.tolist()), k)
                for r, rel in zip(ranking, relevant, strict=True)
            ]
        )
        assert np.isclose(got[f"AP@{k}"], expected)
