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
from sparsemm.models.detectors import ConceptDetectors, DetectorConfig, fit_logistic
from sparsemm.text import CaptionIndex, term_text, term_tokens

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


class HierarchyTargets:
    """Mention targets that follow the concept hierarchy: an item mentions a term when a
    caption names it or anything below it in WordNet ("a puppy" mentions dog, animal;
    "a bus" mentions vehicle), or the item is labelled so.

    Every caption word and label is placed at its unit sense
    (:func:`~sparsemm.concepts.vocabulary.unit_synset`); a term's targets are the ordinary
    mentions (:class:`~sparsemm.text.CaptionIndex`) OR-ed with those of the words placed at
    or below the term's own sense. A term that is a label of the items keeps its ordinary
    targets (measured on COCO: hierarchical targets for the 80 labels lowered the label-pair
    AP@10 by 0.007; docs/concepts.md).
    """

    def __init__(
        self,
        captions: Sequence[Sequence[str]],
        labels: Sequence[Sequence[str]] | None,
        index: CaptionIndex | None = None,
    ) -> None:
        from sparsemm.concepts.vocabulary import unit_synset
        from sparsemm.concepts.wordnet import wordnet

        self.wn = wordnet()
        self.index = index if index is not None else CaptionIndex(captions, labels)
        self.n = len(captions)
        # word -> items naming it (single caption tokens, whole labels)
        items: dict[str, set[int]] = {w: set(s) for w, s in self.index._postings.items()}
        self.labels: set[str] = set()
        for i, labs in enumerate(labels or []):
            for lab in labs:
                key = " ".join(term_tokens(str(lab)))
                items.setdefault(key, set()).add(i)
                self.labels.add(key)
        self.word_items = items
        self.word_synset = {w: unit_synset(w, self.wn) for w in items}
        under: dict[int, set[str]] = {}
        for w, syn in self.word_synset.items():
            if syn is None:
                continue
            for a in {syn} | self.wn.ancestors(syn):
                under.setdefault(a, set()).add(w)
        self.under = under

    def synset(self, term: str) -> int | None:
        from sparsemm.concepts.vocabulary import unit_synset

        return unit_synset(term, self.wn)

    def targets(self, term: str, synset: int | None, config: DetectorConfig) -> np.ndarray:
        """(n,) bool targets of ``term`` placed at ``synset`` (None: no hierarchy). A term
        that is one of the items' labels keeps its own targets: labels say exhaustively
        which items show it, and words placed below it would only add their sense errors."""
        y = self.index.mentions(term, config.min_mentions, config.head_ratio)
        if synset is None or " ".join(term_tokens(term)) in self.labels:
            return y
        hits = set().union(*(self.word_items[w] for w in self.under.get(synset, ())))
        if hits:
            y = y.copy()
            y[np.fromiter(hits, dtype=np.int64)] = True
        return y

    def broader_terms(
        self, terms: Sequence[str], config: DetectorConfig, max_new: int
    ) -> list[tuple[str, int, int]]:
        """(name, synset, items) of the hypernyms worth a detector of their own: above at
        least two of ``terms``, at depth >= :data:`MIN_NODE_DEPTH` (not "object" or
        "whole"), with at least ``min_mentions`` items under them, and not a term already;
        most items first, at most ``max_new``."""
        have = {self.synset(t) for t in terms} - {None}
        placed: dict[int, int] = {}
        for t in terms:
            syn = self.synset(t)
            if syn is None:
                continue
            for a in self.wn.ancestors(syn):
                placed[a] = placed.get(a, 0) + 1
        out = []
        for a, k in placed.items():
            if k < 2 or a in have or self.wn.depth(a) < MIN_NODE_DEPTH:
                continue
            n = len(set().union(*(self.word_items[w] for w in self.under.get(a, ()))))
            if n >= config.min_mentions:
                out.append((self.wn.name(a).lower(), a, n))
        out.sort(key=lambda x: (-x[2], x[0]))
        names: set[str] = set(terms)
        kept = []
        for name, a, n in out:
            if name not in names and term_tokens(name):  # not a bare stop word ("other")
                names.add(name)
                kept.append((name, a, n))
        return kept[:max_new]


MIN_NODE_DEPTH = 5  # hypernyms shallower than this ("object", "whole") get no detector
MAX_NODES = 400  # hypernym detectors added to a vocabulary at most


def fit_concept_detectors(
    codes: sp.csr_matrix | np.ndarray,
    captions: Sequence[Sequence[str]],
    labels: Sequence[Sequence[str]] | None = None,
    config: DetectorConfig | None = None,
    progress: bool = False,
) -> ConceptDetectors:
    """Detectors for the vocabulary of ``captions``/``labels`` over ``codes`` (m, d), one row
    per training item. Targets follow :class:`~sparsemm.text.CaptionIndex` (phrase match,
    head-noun back-off) or the item's labels; with ``config.hierarchy`` they follow the
    concept hierarchy too (:class:`HierarchyTargets`), and the vocabulary gains the
    hypernyms above its words ("vehicle", "animal", "furniture"), each placed at its
    WordNet sense (``ConceptDetectors.wnids``)."""
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
    counts = [n for _, n in vocab]
    synsets: list[int | None] = [None] * len(terms)
    hier = None
    if cfg.hierarchy:
        hier = HierarchyTargets(captions, labels, index)
        synsets = [hier.synset(t) for t in terms]
        for name, syn, n in hier.broader_terms(terms, cfg, MAX_NODES):
            terms.append(name)
            synsets.append(syn)
            counts.append(n)
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
            if hier is not None:
                y[:, j] = hier.targets(t, synsets[lo + j], cfg)
            else:
                y[:, j] = index.mentions(t, cfg.min_mentions, cfg.head_ratio)
        w, b = fit_detectors(xd, y, l2=cfg.l2, max_iter=cfg.max_iter)
        prob = 1.0 / (1.0 + np.exp(-(xd @ w + b)))
        pos = y > 0
        weights[:, lo : lo + len(part)] = w
        bias[lo : lo + len(part)] = b
        rate[lo : lo + len(part)] = [
            float(prob[pos[:, j], j].mean()) if pos[:, j].any() else 1.0 for j in range(len(part))
        ]
    logger.info("fitted %d concept detectors over %d items", len(terms), m)
    from sparsemm.concepts.wordnet import wordnet

    wn = wordnet()
    wnids = [wn.wnid(sy) if sy is not None else None for sy in synsets] if hier else None
    return ConceptDetectors(terms, weights, bias, rate, cfg, counts, wnids=wnids)


# The calibration of the match scorer's term probabilities (sparsemm.query.scorers) is
# fitted on this share of the training items, with detectors fitted on the rest; below
# these counts it is not fitted (the scorer's defaults apply).
CALIBRATION_SHARE = 0.2
CALIBRATION_MIN_ITEMS = 100
CALIBRATION_MIN_POSITIVES = 200
# Log-odds added to the phrase calibration fitted on balanced pairs (a caption against its
# own item and one other): the prior that an item matches a phrase. A balanced prior makes
# every plausible item a near-certain match, so an excluded word's small probabilities
# decide the ranking; -3 (about one item in twenty) was chosen on the COCO caption-proxy
# train split by sentence R@5 - neg-violation@5 over {0, -1, -2, -3, -4, -7}
# (docs/concepts.md).
PHRASE_PRIOR_SHIFT = -3.0
# The phrase calibration's slope is flattened by this factor about its half point. It is
# fitted on training items, whose codes the SR model was trained to bring close to their
# captions, so their similarities separate more sharply than a new picture's (on the COCO
# caption-proxy the slope fitted on test items is 24-33 where the training items give
# 34-42). Too steep a slope lets a sliver of similarity outweigh an excluded object in the
# weakly matching tail of a sentence's top 5. Chosen on the train split from (1, 0.75, 0.5,
# 0.35, 0.25): the largest factor whose negated sentences show the excluded object in the
# top 5 no more often than ``hybrid`` (benchmarks/exclude_caution.py; docs/concepts.md).
PHRASE_SLOPE_FACTOR = 0.5


def detector_targets(
    captions: Sequence[Sequence[str]],
    labels: Sequence[Sequence[str]] | None,
    detectors: ConceptDetectors,
) -> np.ndarray:
    """(m, V) float32 targets of a fitted vocabulary, as :func:`fit_concept_detectors`
    built them (hierarchical when the detectors record their WordNet senses)."""
    cfg = detectors.config
    index = CaptionIndex(captions, labels)
    if detectors.wnids is None:
        cols = [index.mentions(t, cfg.min_mentions, cfg.head_ratio) for t in detectors.terms]
    else:
        from sparsemm.concepts.wordnet import wordnet

        wn = wordnet()
        hier = HierarchyTargets(captions, labels, index)
        cols = [
            hier.targets(t, wn.by_wnid(w) if w else None, cfg)
            for t, w in zip(detectors.terms, detectors.wnids, strict=True)
        ]
    return np.stack(cols, axis=1).astype(np.float32)


def fit_calibration(
    codes: np.ndarray | sp.csr_matrix,
    captions: Sequence[Sequence[str]],
    labels: Sequence[Sequence[str]] | None,
    detectors: ConceptDetectors,
    term_codes: np.ndarray,
    caption_codes: Sequence[np.ndarray],
    seed: int = 0,
) -> np.ndarray | None:
    """The match scorer's calibration (a, g, c, phrase_a, phrase_c, a_l, g_l, c_l), or None
    when the items are too few to fit it.

    A share of the items (:data:`CALIBRATION_SHARE`) is held out and the detectors' terms
    are fitted again on the rest, so the held-out logits z are what a detector gives on an
    item it has not seen. Then, over every (held-out item, term) pair, the mention target
    is regressed on (z, cos(term code, item code)): P(term | x) = sigmoid(a z + g cos + c)
    (Platt scaling with the code similarity as a second feature), separately for the terms
    that are labels of the items (a_l, g_l, c_l; complete targets) and the caption words
    (incomplete: a caption names some of what a picture shows). The phrase calibration
    P = sigmoid(phrase_a cos + phrase_c) is fitted on (caption, its own item) against
    (caption, another held-out item), one of each per caption. ``term_codes`` (V, d): the
    terms' query codes; ``caption_codes[i]`` (n_i, d): item i's captions' query codes.
    """
    cfg = detectors.config
    x = normalize_rows(sp.csr_matrix(codes, dtype=np.float32))
    m = x.shape[0]
    rng = np.random.default_rng(seed)
    order = rng.permutation(m)
    n_hold = round(m * CALIBRATION_SHARE)
    hold, fit = np.sort(order[:n_hold]), np.sort(order[n_hold:])
    if n_hold < CALIBRATION_MIN_ITEMS:
        logger.info("no match calibration: %d held-out items (< %d)", n_hold, CALIBRATION_MIN_ITEMS)
        return None
    y = detector_targets(captions, labels, detectors)  # (m, V)
    xd = np.asarray(x.toarray(), dtype=np.float32)
    w, b = fit_detectors(xd[fit] * cfg.scale, y[fit], l2=cfg.l2, max_iter=cfg.max_iter)
    z = (xd[hold] * cfg.scale) @ w + b  # (h, V) held-out logits
    q = normalize_rows(np.asarray(term_codes, dtype=np.float32))
    cos = xd[hold] @ q.T  # (h, V)
    # Terms that are the items' labels have complete targets, caption words incomplete ones
    # (a caption names some of what is shown): each group gets its own calibration.
    is_label = label_terms(detectors.terms, labels)
    groups: list[list[float] | None] = []
    for cols in (np.flatnonzero(~is_label), np.flatnonzero(is_label)):
        if len(cols) and y[hold][:, cols].sum() >= CALIBRATION_MIN_POSITIVES:
            feats = np.stack([z[:, cols].ravel(), cos[:, cols].ravel()], axis=1)
            (a, g), c = fit_logistic(feats, y[hold][:, cols].ravel())
            groups.append([a, g, c])
        else:
            groups.append(None)
    if groups[0] is None and groups[1] is None:
        logger.info("no match calibration: too few held-out mentions")
        return None
    words: list[float] = groups[0] if groups[0] is not None else groups[1] or []
    labels_cal: list[float] = groups[1] if groups[1] is not None else words
    # phrases: each held-out caption against its own item and one other held-out item
    sims, target = [], []
    for pos, i in enumerate(hold):
        for qc in caption_codes[i]:
            qn = np.asarray(qc, dtype=np.float32)
            qn = qn / max(float(np.linalg.norm(qn)), 1e-12)
            other = hold[(pos + 1 + int(rng.integers(len(hold) - 1))) % len(hold)]
            sims += [float(xd[i] @ qn), float(xd[other] @ qn)]
            target += [1.0, 0.0]
    if len(sims) >= 2 * CALIBRATION_MIN_ITEMS:
        (pa,), pc = fit_logistic(np.asarray(sims)[:, None], np.asarray(target))
        pa, pc = PHRASE_SLOPE_FACTOR * pa, PHRASE_SLOPE_FACTOR * (pc + PHRASE_PRIOR_SHIFT)
    else:
        pa, pc = 20.0, -12.0  # sparsemm.query.scorers.Calibration's defaults
    cal = np.asarray([*words, pa, pc, *labels_cal], dtype=np.float32)
    logger.info(
        "match calibration: words a=%.3f g=%.3f c=%.3f, phrase %.2f / %.2f, labels a=%.3f "
        "g=%.3f c=%.3f",
        *cal,
    )
    return cal


def label_terms(terms: Sequence[str], labels: Sequence[Sequence[str]] | None) -> np.ndarray:
    """(V,) bool: which terms are labels of the items (same singular tokens)."""
    names = {" ".join(term_tokens(str(x))) for labs in (labels or []) for x in labs}
    return np.asarray([" ".join(term_tokens(t)) in names for t in terms], dtype=bool)


def fit_model_detectors(
    model: Any,
    model_dir: str | Path,
    collection: Any,
    split: str = "train",
    config: DetectorConfig | None = None,
    progress: bool = False,
) -> ConceptDetectors:
    """Fit an SR ``model``'s detectors on the items of a collection ``split`` ("all": every
    item), and the match scorer's calibration (:func:`fit_calibration`), and save them in
    ``model_dir``, recording the model weights they belong to."""
    from sparsemm.models.detectors import model_weights_sha256

    mask = collection.split_mask(split)
    rows = np.flatnonzero(mask)
    if not len(rows):
        raise SparsemmError(f"no items on split {split!r} to fit the detectors on")
    captions: list[list[str]] = [[] for _ in rows]
    caption_texts: list[list[int]] = [[] for _ in rows]
    text_rows, owner = collection.caption_rows(mask)
    for r, o in zip(text_rows, owner, strict=True):
        captions[int(o)].append(str(collection.texts[int(r)]["text"]))
        caption_texts[int(o)].append(int(r))
    labels = [list(collection.items[int(r)].get("labels") or []) for r in rows]
    codes = model.encode(collection.image_embeddings()[rows], "image")
    det = fit_concept_detectors(
        codes, captions, labels if any(labels) else None, config, progress=progress
    )
    det.model_sha256 = model_weights_sha256(model_dir)
    det.label_terms = label_terms(det.terms, labels if any(labels) else None)
    if len(rows) * CALIBRATION_SHARE >= CALIBRATION_MIN_ITEMS:
        det.calibration = _calibrate(model, collection, det, codes, captions, labels, caption_texts)
    det.save(model_dir)
    return det


def _calibrate(
    model: Any,
    collection: Any,
    det: ConceptDetectors,
    codes: Any,
    captions: list[list[str]],
    labels: list[list[str]],
    caption_texts: list[list[int]],
) -> np.ndarray | None:
    """:func:`fit_calibration` with the model's own query codes: the terms embedded by the
    collection's text encoder (as queries are), the captions from their stored embeddings.
    The terms' codes are kept in ``det.term_codes``: the calibrated probability reads them,
    so a query does not code the words of the detectors it reads."""
    from sparsemm.encoders.base import as_text_encoder, get_encoder

    info = collection.manifest.get("text_encoder", collection.manifest["encoder"])
    kwargs = {"model": info["model"]} if info.get("model") else {}
    try:
        encoder = as_text_encoder(get_encoder(str(info["name"]), **kwargs))
    except SparsemmError as exc:
        logger.warning("no match calibration (%s)", exc)
        return None
    texts = [term_text(t) for t in det.terms]
    term_codes = np.asarray(
        sp.csr_matrix(model.encode(encoder.encode_text(texts), "text")).toarray(), np.float32
    )
    det.term_codes = np.ascontiguousarray(term_codes.T)  # kept: P(term | x) reads them
    emb = collection.text_embeddings()
    caption_codes = []
    for rows in caption_texts:
        if rows:
            c = model.encode(emb[np.asarray(rows)], "text")
            caption_codes.append(np.asarray(sp.csr_matrix(c).toarray(), np.float32))
        else:
            caption_codes.append(np.zeros((0, term_codes.shape[1]), np.float32))
    return fit_calibration(
        codes, captions, labels if any(labels) else None, det, term_codes, caption_codes
    )
