"""Fitting concept detectors: logistic regressions from codes to caption/label mentions.

:func:`fit_detectors` fits independent L2-regularised logistic regressions (one per target
column) with full-batch L-BFGS, deterministic on CPU. :func:`detector_vocabulary` picks a
model's terms from its training captions and labels (words, and frequent two-word names
such as "hot dog"), and :func:`fit_concept_detectors` fits them all over the training items'
codes (:class:`sparsemm.models.detectors.ConceptDetectors`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.models.detectors import ConceptDetectors, DetectorConfig
from sparsemm.text import CaptionIndex, term_tokens

logger = logging.getLogger(__name__)


def fit_detectors(
    features: np.ndarray,
    targets: np.ndarray,
    l2: float = 1e-3,
    max_iter: int = 200,
) -> tuple[np.ndarray, np.ndarray]:
    """Independent L2-regularised logistic regressions, one per target column.

    features (m, d) float, targets (m, T) {0, 1}. Minimises, per column t,
    mean_i BCE(sigmoid(x_i . w_t + b_t), y_it) + l2 * |w_t|^2 (bias unpenalised) with
    L-BFGS (full batch). Returns W (d, T) float32 and b (T,) float32.

    The fit runs on one torch thread: multi-threaded sums add in a varying order, which
    moved query-time detector scores (and AP@10 by about 1e-4) from run to run.
    """
    import torch

    from sparsemm.runtime import torch_threads

    with torch_threads(1):
        return _fit_lbfgs(torch, features, targets, l2, max_iter)


def _fit_lbfgs(
    torch: Any, features: np.ndarray, targets: np.ndarray, l2: float, max_iter: int
) -> tuple[np.ndarray, np.ndarray]:

    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    y = torch.from_numpy(np.ascontiguousarray(targets, dtype=np.float32))
    if x.shape[0] != y.shape[0]:
        raise SparsemmError("features and targets must have the same number of rows")
    d, t = x.shape[1], y.shape[1]
    w = torch.zeros(d, t, requires_grad=True)
    prior = y.mean(dim=0).clamp(1e-4, 1 - 1e-4)
    b = torch.log(prior / (1 - prior)).clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        logits = x @ w + b
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none")
        total = loss.mean(dim=0).sum() + l2 * (w * w).sum()
        total.backward()
        return total

    opt.step(closure)
    return w.detach().numpy().astype(np.float32), b.detach().numpy().astype(np.float32)


def detector_vocabulary(
    captions: Sequence[Sequence[str]],
    labels: Sequence[Sequence[str]] | None,
    config: DetectorConfig,
) -> list[tuple[str, int]]:
    """(term, items mentioning it) for the terms with at least ``min_mentions`` items: the
    labels, the caption words and (``bigrams``) adjacent word pairs, most frequent first,
    at most ``max_terms``. Words and pairs are singular content tokens (stop words out)."""
    counts: Counter[tuple[str, ...]] = Counter()
    for i, caps in enumerate(captions):
        seen: set[tuple[str, ...]] = set()
        for c in caps:
            toks = term_tokens(c)
            seen.update((t,) for t in toks)
            if config.bigrams:
                seen.update(pairwise(toks))
        if labels is not None:
            seen.update(tuple(term_tokens(str(x))) for x in labels[i])
        counts.update(seen - {()})
    terms = [(" ".join(k), n) for k, n in counts.items() if n >= config.min_mentions]
    terms.sort(key=lambda t: (-t[1], t[0]))
    return terms[: config.max_terms]


def fit_concept_detectors(
    codes: sp.csr_matrix | np.ndarray,
    captions: Sequence[Sequence[str]],
    labels: Sequence[Sequence[str]] | None = None,
    config: DetectorConfig | None = None,
    progress: bool = False,
) -> ConceptDetectors:
    """Detectors for the vocabulary of ``captions``/``labels`` over ``codes`` (m, d), one row
    per training item. Targets follow :class:`~sparsemm.text.CaptionIndex` (phrase match,
    head-noun back-off) or the item's labels."""
    cfg = config or DetectorConfig()
    m = codes.shape[0]
    if len(captions) != m or (labels is not None and len(labels) != m):
        raise SparsemmError(f"detectors need one caption list (and label list) per item ({m})")
    vocab = detector_vocabulary(captions, labels, cfg)
    if not vocab:
        raise SparsemmError(
            f"no term is mentioned by {cfg.min_mentions} or more training items; the "
            "detectors need captions or labels (lower --min-mentions for a small collection)"
        )
    x = normalize_rows(sp.csr_matrix(codes, dtype=np.float32))
    xd = np.asarray(x.toarray(), dtype=np.float32) * cfg.scale
    index = CaptionIndex(captions, labels)
    terms = [t for t, _ in vocab]
    weights = np.zeros((xd.shape[1], len(terms)), np.float32)
    bias = np.zeros(len(terms), np.float32)
    rate = np.ones(len(terms), np.float32)
    chunks = range(0, len(terms), cfg.chunk)
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="detectors", unit="chunk")
    for lo in chunks:
        part = terms[lo : lo + cfg.chunk]
        y = np.zeros((m, len(part)), np.float32)
        for j, t in enumerate(part):
            hit = index.mentions(t, cfg.min_mentions, cfg.head_ratio)
            y[:, j] = hit
        w, b = fit_detectors(xd, y, l2=cfg.l2, max_iter=cfg.max_iter)
        prob = 1.0 / (1.0 + np.exp(-(xd @ w + b)))
        pos = y > 0
        weights[:, lo : lo + len(part)] = w
        bias[lo : lo + len(part)] = b
        rate[lo : lo + len(part)] = [
            float(prob[pos[:, j], j].mean()) if pos[:, j].any() else 1.0 for j in range(len(part))
        ]
    logger.info("fitted %d concept detectors over %d items", len(terms), m)
    return ConceptDetectors(terms, weights, bias, rate, cfg, [n for _, n in vocab])


def fit_model_detectors(
    model: Any,
    model_dir: str | Path,
    collection: Any,
    split: str = "train",
    config: DetectorConfig | None = None,
    progress: bool = False,
) -> ConceptDetectors:
    """Fit an SR ``model``'s detectors on the items of a collection ``split`` ("all": every
    item) and save them in ``model_dir``, recording the model weights they belong to."""
    from sparsemm.models.detectors import model_weights_sha256

    mask = collection.split_mask(split)
    rows = np.flatnonzero(mask)
    if not len(rows):
        raise SparsemmError(f"no items on split {split!r} to fit the detectors on")
    captions: list[list[str]] = [[] for _ in rows]
    text_rows, owner = collection.caption_rows(mask)
    for r, o in zip(text_rows, owner, strict=True):
        captions[int(o)].append(str(collection.texts[int(r)]["text"]))
    labels = [list(collection.items[int(r)].get("labels") or []) for r in rows]
    codes = model.encode(collection.image_embeddings()[rows], "image")
    det = fit_concept_detectors(
        codes, captions, labels if any(labels) else None, config, progress=progress
    )
    det.model_sha256 = model_weights_sha256(model_dir)
    det.save(model_dir)
    return det


def ensure_model_detectors(
    model: Any,
    model_dir: str | Path,
    collection: Any,
    split: str = "train",
    config: DetectorConfig | None = None,
    progress: bool = False,
) -> ConceptDetectors:
    """The model's detectors: those in ``model_dir`` when they were fitted on its current
    weights, else fitted now (:func:`fit_model_detectors`); a pipeline stage's cache."""
    from sparsemm.models.detectors import has_detectors

    if has_detectors(model_dir):
        try:
            return ConceptDetectors.for_model(model_dir)
        except SparsemmError as exc:
            logger.info("refitting the concept detectors: %s", exc)
    det = fit_model_detectors(model, model_dir, collection, split, config, progress)
    logger.info("fitted %d concept detectors on the %s split", len(det), split)
    return det
