"""Ranking metrics at a cut-off k: pure functions over one ranking, plus a batch version.

Notation (the label-pair protocol, docs/negation.md): the ranking r_1, r_2, ... lists item ids
best first; rel_i = 1 if r_i is in the relevant set R else 0; only the first k positions
count. A ranking shorter than k is scored as if the missing positions held non-relevant
items, except violation@k / inclusion@k, which are shares of the items actually returned
(see :func:`violation_at_k`). A query with an empty R scores 0 on every relevance metric.

One definition per metric: :func:`evaluate_rankings` computes the same numbers for a
``(q, k)`` matrix of rankings at once (the tests check it against the single-query
functions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError

Ranking = Sequence[Hashable] | np.ndarray
# Per-query relevance for the batch helper: one collection of item indices per query, or a
# (q, n_items) boolean matrix.
Relevance = Sequence[Collection[int]] | np.ndarray

METRIC_NAMES = ("mrr", "ndcg", "ap", "recall", "precision", "violation", "inclusion")
# Metrics where a smaller value is better (everything else: larger is better).
LOWER_IS_BETTER = frozenset({"violation"})
_NAME_RE = re.compile(r"^([a-z]+)@(\d+)$")


# ------------------------------------------------------------------- single-query metrics


def _top(ranking: Ranking, k: int) -> list[Any]:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise SparsemmError(f"cut-off k must be a positive integer, got {k!r}")
    top = list(ranking[:k])
    if len(set(top)) != len(top):
        raise SparsemmError("the ranking lists an item more than once; de-duplicate it")
    return top


def _as_set(items: Collection[Any]) -> set[Any]:
    if isinstance(items, np.ndarray):
        return set(items.ravel().tolist())
    return set(items)


def _rels(ranking: Ranking, relevant: Collection[Any], k: int) -> tuple[list[int], int]:
    """(rel_1..rel_min(k, len), |R|)."""
    top = _top(ranking, k)
    rel = _as_set(relevant)
    return [int(x in rel) for x in top], len(rel)


def precision_at_k(ranking: Ranking, relevant: Collection[Any], k: int = 10) -> float:
    """P@k = (1/k) * sum_{i<=k} rel_i  (the denominator is k even for a shorter ranking)."""
    rels, _ = _rels(ranking, relevant, k)
    return sum(rels) / k


def recall_at_k(ranking: Ranking, relevant: Collection[Any], k: int = 10) -> float:
    """Recall@k = (1/|R|) * sum_{i<=k} rel_i  (0 when R is empty)."""
    rels, n_rel = _rels(ranking, relevant, k)
    return sum(rels) / n_rel if n_rel else 0.0


def mrr_at_k(ranking: Ranking, relevant: Collection[Any], k: int = 10) -> float:
    """RR@k = 1 / (rank of the first relevant item within the top k), 0 if there is none.

    MRR@k is its mean over queries.
    """
    rels, _ = _rels(ranking, relevant, k)
    for i, r in enumerate(rels, 1):
        if r:
            return 1.0 / i
    return 0.0


def ndcg_at_k(ranking: Ranking, relevant: Collection[Any], k: int = 10) -> float:
    """NDCG@k = DCG@k / IDCG@k with binary gains.

    DCG@k = sum_{i<=k} rel_i / log2(i + 1);
    IDCG@k = sum_{i<=min(k, |R|)} 1 / log2(i + 1)  (0 when R is empty).
    """
    rels, n_rel = _rels(ranking, relevant, k)
    if not n_rel:
        return 0.0
    dcg = sum(r / math.log2(i + 1) for i, r in enumerate(rels, 1))
    idcg = sum(1.0 / math.log2(i + 1) for i in range(1, min(k, n_rel) + 1))
    return dcg / idcg


def ap_at_k(ranking: Ranking, relevant: Collection[Any], k: int = 10) -> float:
    """AP@k = (1 / min(k, |R|)) * sum_{i<=k} P@i * rel_i  (0 when R is empty).

    P@i is the precision of the top i. Normalising by min(k, |R|) makes a perfect top k
    score 1 even when |R| > k.
    """
    rels, n_rel = _rels(ranking, relevant, k)
    if not n_rel:
        return 0.0
    hits = 0
    total = 0.0
    for i, r in enumerate(rels, 1):
        if r:
            hits += 1
            total += hits / i
    return total / min(k, n_rel)


def _share(ranking: Ranking, items: Collection[Any], k: int) -> float:
    top = _top(ranking, k)
    if not top:
        return 0.0
    marked = _as_set(items)
    return sum(x in marked for x in top) / len(top)


def violation_at_k(ranking: Ranking, excluded: Collection[Any], k: int = 10) -> float:
    """violation@k = (1/n) * sum_{i<=n} [r_i carries B],  n = min(k, len(ranking)).

    ``excluded`` is the set of items carrying the excluded concept B. The denominator is the
    number of results actually returned (not k), so a method cannot lower its violation rate
    by returning fewer results; an empty ranking scores 0. Lower is better.
    """
    return _share(ranking, excluded, k)


def inclusion_at_k(ranking: Ranking, included: Collection[Any], k: int = 10) -> float:
    """inclusion@k = (1/n) * sum_{i<=n} [r_i carries A],  n = min(k, len(ranking)).

    ``included`` is the set of items carrying the wanted concept A; same denominator as
    :func:`violation_at_k`; an empty ranking scores 0.
    """
    return _share(ranking, included, k)


METRIC_FUNCTIONS: dict[str, Callable[[Ranking, Collection[Any], int], float]] = {
    "mrr": mrr_at_k,
    "ndcg": ndcg_at_k,
    "ap": ap_at_k,
    "recall": recall_at_k,
    "precision": precision_at_k,
    "violation": violation_at_k,
    "inclusion": inclusion_at_k,
}


# ------------------------------------------------------------------------ metric names


def parse_metric_name(name: str) -> tuple[str, int]:
    """Split a metric name like ``"ap@10"`` into ``("ap", 10)``."""
    m = _NAME_RE.match(name) if isinstance(name, str) else None
    if m is None or m.group(1) not in METRIC_NAMES or int(m.group(2)) < 1:
        raise SparsemmError(
            f"unknown metric {name!r}: use <name>@<k> with name one of "
            f"{', '.join(METRIC_NAMES)} and k >= 1, e.g. 'ap@10'"
        )
    return m.group(1), int(m.group(2))


def higher_is_better(name: str) -> bool:
    """False for metrics where lower is better (violation@k), True otherwise."""
    return parse_metric_name(name)[0] not in LOWER_IS_BETTER


# ------------------------------------------------------------------------ batch version


def _hits(
    rankings: np.ndarray, valid: np.ndarray, spec: Relevance, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """Membership matrix (q, K) of each ranked item in the query's set, and set sizes (q,)."""
    q = rankings.shape[0]
    if isinstance(spec, np.ndarray) and spec.ndim == 2:
        mat = spec
        if mat.shape[0] != q:
            raise SparsemmError(f"{what}: {mat.shape[0]} rows for {q} rankings")
        if mat.dtype != bool:
            if not np.isin(mat, (0, 1)).all():
                raise SparsemmError(f"{what}: a relevance matrix must hold 0/1 or booleans")
            mat = mat.astype(bool)
        if valid.any() and rankings[valid].max() >= mat.shape[1]:
            raise SparsemmError(
                f"{what}: ranked item {int(rankings[valid].max())} is outside the "
                f"{mat.shape[1]} columns of the relevance matrix"
            )
        rows = np.arange(q)[:, None]
        hits = mat[rows, np.where(valid, rankings, 0)] & valid
        return hits, mat.sum(axis=1)
    if isinstance(spec, np.ndarray) or len(spec) != q:
        raise SparsemmError(
            f"{what}: expected one set of item indices per ranking ({q}) or a "
            "(q, n_items) boolean matrix"
        )
    sets = []
    for s in spec:
        try:
            arr = np.unique(np.asarray(list(_as_set(s)), dtype=np.int64))
        except (TypeError, ValueError) as exc:
            raise SparsemmError(f"{what}: item ids must be integers ({exc})") from exc
        sets.append(arr)
    sizes = np.array([len(s) for s in sets], dtype=np.int64)
    flat = np.concatenate(sets) if sets else np.zeros(0, dtype=np.int64)
    if (flat < 0).any():
        raise SparsemmError(f"{what}: item ids must be >= 0")
    # Encode (query, item) pairs as one integer so membership is a single np.isin.
    width = int(max(flat.max(initial=-1), rankings.max(initial=-1))) + 1
    keys = np.repeat(np.arange(q, dtype=np.int64), sizes) * width + flat
    ranked = np.arange(q, dtype=np.int64)[:, None] * width + np.where(valid, rankings, 0)
    hits = np.isin(ranked, keys) & valid
    return hits, sizes


def evaluate_rankings(
    rankings: np.ndarray,
    relevant: Relevance,
    metrics: Sequence[str],
    *,
    excluded: Relevance | None = None,
    included: Relevance | None = None,
) -> dict[str, np.ndarray]:
    """Per-query values of each named metric for a batch of rankings.

    ``rankings``: ``(q, K)`` int item indices, best first; negative entries pad a ranking
    shorter than K (scored exactly like the truncated ranking by the single-query
    functions). ``relevant`` / ``excluded`` / ``included``: per query the relevant items,
    the items carrying B (for violation@k) and the items carrying A (for inclusion@k), each
    as a list of index collections or a ``(q, n_items)`` boolean matrix. ``metrics``: names
    like ``"ap@10"``, ``"mrr@1"``, ``"ndcg@3"``, ``"violation@10"``; k may exceed K.
    Returns ``{name: (q,) float64}``.
    """
    rankings = np.asarray(rankings)
    if rankings.ndim != 2 or not (np.issubdtype(rankings.dtype, np.integer) or rankings.size == 0):
        raise SparsemmError(
            f"rankings must be a 2-D integer array (queries, k); got shape "
            f"{rankings.shape} dtype {rankings.dtype}"
        )
    rankings = rankings.astype(np.int64, copy=False)
    parsed = {name: parse_metric_name(name) for name in metrics}
    q = rankings.shape[0]
    width = max([rankings.shape[1], *(k for _, k in parsed.values())])
    # Pad to the largest cut-off: the extra positions hold no item.
    padded = np.full((q, width), -1, dtype=np.int64)
    padded[:, : rankings.shape[1]] = rankings
    valid = padded >= 0
    srt = np.sort(np.where(valid, padded, -1 - np.arange(width)), axis=1)
    if (srt[:, 1:] == srt[:, :-1]).any():
        raise SparsemmError("a ranking lists an item more than once; de-duplicate it")

    bases = {b for b, _ in parsed.values()}
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if bases - {"violation", "inclusion"}:
        cache["relevant"] = _hits(padded, valid, relevant, "relevant")
    for base, spec in (("violation", excluded), ("inclusion", included)):
        if base in bases:
            arg = "excluded" if base == "violation" else "included"
            if spec is None:
                raise SparsemmError(f"{base}@k needs the {arg}= item sets")
            cache[base] = _hits(padded, valid, spec, arg)

    out: dict[str, np.ndarray] = {}
    for name, (base, k) in parsed.items():
        ranks = np.arange(1, k + 1, dtype=np.float64)
        if base in ("violation", "inclusion"):
            h = cache[base][0][:, :k]
            n = valid[:, :k].sum(axis=1)
            out[name] = np.divide(h.sum(axis=1), n, out=np.zeros(q), where=n > 0)
            continue
        hits_all, n_rel = cache["relevant"]
        h = hits_all[:, :k]
        found = h.sum(axis=1).astype(np.float64)
        if base == "precision":
            out[name] = found / k
        elif base == "recall":
            out[name] = np.divide(found, n_rel, out=np.zeros(q), where=n_rel > 0)
        elif base == "mrr":
            first = h.argmax(axis=1)
            out[name] = np.where(h.any(axis=1), 1.0 / (first + 1), 0.0)
        elif base == "ndcg":
            disc = 1.0 / np.log2(ranks + 1)
            ideal = np.concatenate([[0.0], np.cumsum(disc)])[np.minimum(k, n_rel)]
            out[name] = np.divide(h @ disc, ideal, out=np.zeros(q), where=ideal > 0)
        else:  # ap
            prec = np.cumsum(h, axis=1) / ranks
            denom = np.minimum(k, n_rel).astype(np.float64)
            out[name] = np.divide((prec * h).sum(axis=1), denom, out=np.zeros(q), where=denom > 0)
    return out
