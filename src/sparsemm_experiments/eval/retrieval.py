"""Standard cross-modal retrieval evaluation over dense or sparse embeddings.

Scores are inner products of row-L2-normalised representations (cosine similarity), computed
in query blocks so 25k x 5k score matrices never sit in memory at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from sparsemm.linalg import Matrix, normalize_rows
from sparsemm_experiments.eval.metrics import evaluate_rankings


def score_block(queries: Matrix, items: Matrix) -> np.ndarray:
    """Dense (q, n) score matrix queries @ items.T for dense or sparse inputs."""
    s = queries @ items.T
    if sp.issparse(s):
        s = s.toarray()
    return np.asarray(s, dtype=np.float32)


def target_ranks(
    queries: Matrix, items: Matrix, targets: np.ndarray, block: int = 1024
) -> np.ndarray:
    """0-based rank of each query's single target item among all items (ties count against).

    rank_i = #{j : s_ij > s_i,target} + #{j != target : s_ij == s_i,target}, a pessimistic
    tie rule so that all-zero sparse scores can never look good.
    """
    qn, itn = normalize_rows(queries), normalize_rows(items)
    ranks = np.empty(len(targets), dtype=np.int64)
    for s in range(0, len(targets), block):
        sc = score_block(qn[s : s + block], itn)
        t = targets[s : s + block]
        tgt = sc[np.arange(len(t)), t][:, None]
        ranks[s : s + block] = (sc >= tgt).sum(axis=1) - 1
    return ranks


def recall_at_ks(ranks: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """R@k for single-target queries: the share whose target is within the top k."""
    return {f"R@{k}": float((ranks < k).mean()) for k in ks}


def top_k_rows(queries: Matrix, items: Matrix, k: int, block: int = 512) -> np.ndarray:
    """(q, k) item indices by descending cosine score (ties: lower index first)."""
    qn, itn = normalize_rows(queries), normalize_rows(items)
    k = min(k, itn.shape[0])
    out = np.empty((qn.shape[0], k), dtype=np.int64)
    for s in range(0, qn.shape[0], block):
        sc = score_block(qn[s : s + block], itn)
        # Stable sort on -score gives the lower index first among equal scores.
        out[s : s + block] = np.argsort(-sc, axis=1, kind="stable")[:, :k]
    return out


def multi_target_ap(
    queries: Matrix,
    items: Matrix,
    relevant: Sequence[np.ndarray],
    ks: Sequence[int] = (1, 5, 10),
) -> dict[str, float]:
    """Mean AP@k over queries with several relevant items (image-to-text: 5 captions each).

    AP@k as defined once in :mod:`sparsemm_experiments.eval.metrics`.
    """
    rankings = top_k_rows(queries, items, max(ks))
    rel = [set(np.asarray(r).tolist()) for r in relevant]
    per_query = evaluate_rankings(rankings, rel, [f"ap@{k}" for k in ks])
    return {f"AP@{k}": float(per_query[f"ap@{k}"].mean()) for k in ks}
