"""Names for concept dimensions, and how well names fit (label precision@k).

The served naming (:func:`top_share_names`, used by ``sparsemm index``): dimension j is named
by the vocabulary terms t that most of its ``k`` highest-valued items *mention*, beyond
chance::

    gain(t, j) = share of j's top-k items mentioning t - base_rate * p(t),   p(t) = df_t / n

(ties: t's activation-weighted mutual-information term with j, then the shorter term).
Item i mentions t when a caption contains t's singular content tokens as a phrase, or i
carries t as a label (:class:`sparsemm.text.CaptionIndex`, the phrase itself, never its head
noun alone). The terms
are the model's detector vocabulary when it has one (caption words, frequent two-word names
such as "ankle boot" or "hot dog", and the labels), else the same vocabulary built from the
collection; singular and plural forms are one term. ``base_rate`` 0 rewards frequent terms
(on COCO it names 311 of 1,000 dims "person"); 1 rewards rare ones; 0.5 was chosen on the
held-out measurement of ``benchmarks/naming.py`` (docs/results.md).

Template words that most captions share ("collage", "grid", "photo" on the Fashion-MNIST
collages) describe no dimension: a term mentioned by more than ``max_share`` of the items,
and carried by no item as a label, never names one. A frequent label ("person" on COCO) is a
concept and stays. :func:`concept_names` is the mutual-information ranking alone (measured,
lost); :func:`label_precision` is the measure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from sparsemm.text import CaptionIndex


def mentions(index: CaptionIndex, term: str) -> np.ndarray:
    """(n_items,) bool: item i mentions ``term`` as written: the whole phrase, never its head
    noun alone (a name "dog sitting" must not stand for every item that says "sitting")."""
    return index.mentions(term, min_positives=0, head_ratio=0.0)


def template_terms(index: CaptionIndex, terms: Sequence[str], share: float) -> set[str]:
    """Terms mentioned by more than ``share`` of the items and carried by no item as a
    label: the words of a caption template ("a grid of product photos", "a collage of ...")
    rather than of what an item shows. A frequent *label* ("person" on COCO) is a concept."""
    n = max(index.n_items, 1)
    return {
        t for t in terms if mentions(index, t).sum() > share * n and not index.labelled(t).any()
    }


def mention_matrix(index: CaptionIndex, terms: Sequence[str]) -> sp.csr_matrix:
    """(n_items, len(terms)) float32 0/1: item i mentions term t."""
    cols = [np.flatnonzero(mentions(index, t)) for t in terms]
    rows = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    col_ids = np.repeat(np.arange(len(terms)), [len(c) for c in cols])
    data = np.ones(len(rows), np.float32)
    return sp.csr_matrix((data, (rows, col_ids)), shape=(index.n_items, len(terms)))


def concept_names(
    codes: sp.csr_matrix,
    index: CaptionIndex,
    terms: Sequence[str],
    top: int = 6,
    min_df: int = 5,
    max_share: float = 0.4,
) -> list[list[str]]:
    """Per dimension, up to ``top`` names, best first (scores: module docstring). Terms
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
    with np.errstate(divide="ignore", invalid="ignore"):
        score = p_tj * np.log(np.maximum(p_tj / np.maximum(df / n, 1e-12)[None, :], 1e-12))
    score[:, (df < min_df) | np.array([t in template for t in terms])] = 0.0
    score[mass <= 0] = 0.0
    out = []
    for j in range(d):
        best = np.argsort(-score[j], kind="stable")[:top]
        out.append([terms[b] for b in best if score[j, b] > 0.0])
    return out


def top_share_names(
    codes: sp.csr_matrix,
    index: CaptionIndex,
    terms: Sequence[str],
    top: int = 6,
    k: int = 50,
    min_df: int = 5,
    max_share: float = 0.4,
    base_rate: float = 0.5,
) -> list[list[str]]:
    """Per dimension, up to ``top`` names ranked by the share of its ``k`` highest-valued
    items that mention them (ties: the mutual-information score of :func:`concept_names`);
    the same term filters."""
    n, d = codes.shape
    terms = list(terms)
    if not terms or n == 0:
        return [[] for _ in range(d)]
    m = sp.csc_matrix(mention_matrix(index, terms)).tocsr()
    df = np.asarray(m.sum(axis=0)).ravel()
    template = template_terms(index, terms, max_share)
    ok = (df >= min_df) & ~np.array([t in template for t in terms])
    n_words = np.array([len(t.split()) for t in terms])
    csc = sp.csc_matrix(abs(sp.csr_matrix(codes)))
    out: list[list[str]] = []
    for j in range(d):
        lo, hi = csc.indptr[j], csc.indptr[j + 1]
        rows, vals = csc.indices[lo:hi], csc.data[lo:hi]
        if not len(rows) or not (vals > 0).any():
            out.append([])
            continue
        sel = rows[np.lexsort((rows, -vals))[:k]]
        share = np.asarray(m[sel].mean(axis=0)).ravel()
        w = vals[np.lexsort((rows, -vals))[:k]]
        p_tj = np.asarray(w @ m[sel].toarray()).ravel() / max(float(w.sum()), 1e-12)
        with np.errstate(divide="ignore", invalid="ignore"):
            mi = p_tj * np.log(np.maximum(p_tj / np.maximum(df / n, 1e-12), 1e-12))
        gain = np.where(ok & (mi > 0), share - base_rate * df / n, 0.0)
        best = np.lexsort((n_words, -mi, -gain))[:top]  # ties: the shorter name
        out.append([terms[b] for b in best if gain[b] > 0.0])
    return out


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
