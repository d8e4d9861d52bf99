"""Names for concept dimensions.

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
concept and stays. :func:`name_dimensions` is what ``sparsemm index`` stores.

The measure (label precision@k), the mutual-information ranking alone (measured, lost) and
the caption-word scores of the demo report's word clouds are research code
(:mod:`sparsemm_experiments.naming`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection
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
    items that mention them (ties: the term's activation-weighted mutual information with the
    dimension, :func:`information_terms`); terms mentioned by fewer than ``min_df`` items,
    or by more than ``max_share`` of them and carried by no item as a label, never name
    one."""
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
        mi = information_terms(p_tj, df, n)
        gain = np.where(ok & (mi > 0), share - base_rate * df / n, 0.0)
        best = np.lexsort((n_words, -mi, -gain))[:top]  # ties: the shorter name
        out.append([terms[b] for b in best if gain[b] > 0.0])
    return out


def information_terms(p: np.ndarray, df: np.ndarray, n: int) -> np.ndarray:
    """p * log(p / (df / n)): a term's share p among a dimension's (activation-weighted)
    items against its share df / n of all items, the term's part in the mutual information
    of term and dimension: high for a term both over-represented and common among the
    dimension's items, so a rare term seen once does not win. ``p`` (..., V), ``df`` (V,)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return p * np.log(np.maximum(p / np.maximum(df / max(n, 1), 1e-12), 1e-12))


def name_dimensions(col: Collection, codes: sp.csr_matrix, model: Any) -> list[list[str]]:
    """Names of each dimension from the collection's captions and labels: the model's
    detector vocabulary (else one built from the collection), ranked by
    :func:`top_share_names`; none without captions or labels."""
    from sparsemm.models.detectors import DetectorConfig
    from sparsemm.train.detectors import detector_vocabulary

    captions = [list(it.get("captions", [])) for it in col.items]
    labels = [list(it.get("labels") or []) for it in col.items]
    if not any(captions) and not any(labels):
        return [[] for _ in range(codes.shape[1])]
    det = getattr(model, "detectors", None)
    terms = (
        list(det.terms)
        if det is not None
        else [t for t, _ in detector_vocabulary(captions, labels, DetectorConfig(min_mentions=5))]
    )
    return top_share_names(codes, CaptionIndex(captions, labels), terms)
