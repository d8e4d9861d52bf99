"""Measuring dimension names, and the namings the served one was measured against.

- :func:`label_precision`: (precision@k, coverage) of dimension names: how many of a
  dimension's top items mention its first name (``benchmarks/naming.py``, docs/results.md).
- :func:`concept_names`: the mutual-information ranking alone, a naming that was measured and
  lost to :func:`sparsemm.query.naming.top_share_names`.
- :func:`dimension_word_scores` / :func:`dimension_labels`: how characteristic each caption
  word is of a dimension's items (the demo report's word clouds, the lift labels of
  ``benchmarks/naming.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.query.naming import (
    information_terms,
    mention_matrix,
    mentions,
    template_terms,
)
from sparsemm.text import CaptionIndex, tokenize


def label_precision(
    codes: sp.csr_matrix, index: CaptionIndex, names: Sequence[Sequence[str]], k: int = 50
) -> tuple[float, float]:
    """(precision, coverage) of dimension names.

    For each *used* dimension (some item has a non-zero value on it), precision@k is the
    share of its ``k`` highest-valued items (fewer if fewer are active) that mention its
    first name (:class:`~sparsemm.text.CaptionIndex` rules); a dimension without a name
    scores 0. Returns the mean over used dimensions, and the share of them with a name.
    """
    csc = sp.csc_matrix(codes)
    precs, named = [], []
    cache: dict[str, np.ndarray] = {}
    for j in range(csc.shape[1]):
        lo, hi = csc.indptr[j], csc.indptr[j + 1]
        rows, vals = csc.indices[lo:hi], np.abs(csc.data[lo:hi])
        keep = vals > 0
        rows, vals = rows[keep], vals[keep]
        if not len(rows):
            continue
        top = rows[np.lexsort((rows, -vals))[:k]]
        name = names[j][0] if j < len(names) and names[j] else None
        named.append(name is not None)
        if name is None:
            precs.append(0.0)
            continue
        if name not in cache:
            cache[name] = mentions(index, name)
        precs.append(float(cache[name][top].mean()))
    if not precs:
        return 0.0, 0.0
    return float(np.mean(precs)), float(np.mean(named))


def concept_names(
    codes: sp.csr_matrix,
    index: CaptionIndex,
    terms: Sequence[str],
    top: int = 6,
    min_df: int = 5,
    max_share: float = 0.4,
) -> list[list[str]]:
    """Per dimension, up to ``top`` names, best first, by the term's activation-weighted
    mutual information with the dimension (:func:`~sparsemm.query.naming.information_terms`),
    with the served naming's term filters (:mod:`sparsemm.query.naming`). Terms
    mentioned by fewer than ``min_df`` items or by more than ``max_share`` of them score 0;
    a dimension no item activates has no name."""
    n, d = codes.shape
    terms = list(terms)
    if not terms or n == 0:
        return [[] for _ in range(d)]
    m = mention_matrix(index, terms)
    df = np.asarray(m.sum(axis=0)).ravel()
    template = template_terms(index, terms, max_share)
    x = abs(sp.csr_matrix(codes))
    mass = np.asarray(x.sum(axis=0)).ravel()
    joint = (x.T @ m).toarray()  # (d, V) activation-weighted mentions
    p_tj = joint / np.maximum(mass, 1e-12)[:, None]
    score = information_terms(p_tj, df, n)
    score[:, (df < min_df) | np.array([t in template for t in terms])] = 0.0
    score[mass <= 0] = 0.0
    out = []
    for j in range(d):
        best = np.argsort(-score[j], kind="stable")[:top]
        out.append([terms[b] for b in best if score[j, b] > 0.0])
    return out


def dimension_word_scores(
    codes: sp.csr_matrix, captions: list[list[str]], min_df: int = 5
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How characteristic each caption word is of each dimension's items.

    codes (n, d) non-negative; captions[i] the captions of item i. With
    p(w | j) = sum_i x_ij [w in item i] / sum_i x_ij (activation-weighted share of j's items
    mentioning w) and lift(w, j) = p(w | j) / (df(w) / n), a word scores
    p(w | j) * log lift(w, j), its term in the mutual information of word and dimension: over-
    represented (lift > 1) *and* common among j's items, so a rare word seen once does not win.
    Words seen in fewer than ``min_df`` items score 0. Returns (words (V,), score (d, V),
    mass (d,)), mass being each dimension's total activation.
    """
    n, d = codes.shape
    vocab: dict[str, int] = {}
    rows, cols = [], []
    for i, caps in enumerate(captions):
        for w in {t for c in caps for t in tokenize(c)}:
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
    mass = np.asarray(abs(codes).sum(axis=0)).ravel()  # (d,)
    if not vocab:
        return np.array([], dtype=str), np.zeros((d, 0)), mass
    words = np.array(sorted(vocab, key=vocab.__getitem__))
    mention = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, len(vocab)))
    df = np.asarray(mention.sum(axis=0)).ravel()
    joint = (abs(codes).T @ mention).toarray()  # (d, V) activation-weighted mentions
    p_wj = joint / np.maximum(mass, 1e-12)[:, None]
    score = information_terms(p_wj, df, n)
    score[:, df < min_df] = 0.0
    score[mass <= 0] = 0.0
    return words, score, mass


def dimension_labels(
    codes: sp.csr_matrix, captions: list[list[str]], top: int = 6, min_df: int = 5
) -> list[list[str]]:
    """Per dimension, the ``top`` caption words most characteristic of the items active on
    it (scores: :func:`dimension_word_scores`)."""
    words, score, _ = dimension_word_scores(codes, captions, min_df)
    out: list[list[str]] = []
    for j in range(codes.shape[1]):
        best: Any = np.argsort(-score[j], kind="stable")[:top] if len(words) else []
        out.append([str(words[b]) for b in best if score[j, b] > 0.0])
    return out
