"""Offline LexLIP runs: COCO caption-proxy, Fashion-MNIST collages, a large-scale pool.

What :func:`run_lexlip_bench` does (``sparsemm bench lexlip``):

1. **Settings.** ``coco``: the COCO val2017 caption-proxy collection; an item's "patches"
   are the frozen MiniLM embeddings of its 5-7 captions (no pixels exist), and while a pair
   trains the paired caption is hidden from its item (leave-one-out). ``collages``: the
   Fashion-MNIST collage collection; patches are EfficientNet-Lite0 7x7 spatial features
   (49 x 1280) of the real images. One LexLIP model per setting is trained on the ``train``
   split (:func:`sparsemm_experiments.train.lexlip.train_lexlip`; cached in
   ``OUT/<setting>/model``).
2. **Retrieval** on the ``test`` split: text-to-image (each caption ranks the test items)
   and image-to-text R@1/5/10 for LexLIP's lexicon codes, its Dense variant ([CLS]
   projections) and, on COCO, the dense MiniLM views. BM25 cannot use the standard protocol
   (a query caption is part of its own item's document); it is measured leave-one-out
   (:func:`sparsemm_experiments.baselines.bm25.caption_retrieval`) next to MiniLM under the
   same rule.
3. **Exclusion** ("A but not B" from labels, :mod:`sparsemm_experiments.eval.bench`): dense
   strategies
   on the LexLIP-Dense embeddings, sparse strategies on the LexLIP codes, parameters tuned on
   the train split; BM25 over captions on the same queries (B-mentioning items demoted,
   :class:`~sparsemm_experiments.baselines.bm25.CaptionBM25`); on COCO also the MiniLM dense
   baselines.
   Means over all / hard queries with paired t-tests against LexLIP-Dense's
   emb(A) - 0.5 emb(B) and against BM25.
4. **Large scale** (COCO model): the 950 test items mixed into a pool of every val2017 item
   plus every collage (collages enter as caption patches, the proxy's item form). Caption
   queries and "a photo of a {label}" queries; LexLIP codes searched with
   :class:`sparsemm.index.InvertedIndex` (exact top-k), dense variants by brute force; p50/p99
   latency per query on one thread and index/array sizes.
5. **Export**: the COCO test items as an Anserini JsonVectorCollection and an Elasticsearch
   ``rank_features`` bulk file, validated line by line.

Everything lands in ``OUT``: ``config.json`` (settings, git commit), ``metrics.json`` and
``report.md`` (rendered from the metrics), plus one folder per setting.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection, write_collection
from sparsemm.data.encode import caption_views
from sparsemm.encoders.base import l2_normalize
from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, write_json
from sparsemm.linalg import normalize_rows
from sparsemm.query.strategies import TERM_TEMPLATE, get_spec
from sparsemm.runtime import torch_threads
from sparsemm_experiments.baselines.bm25 import CaptionBM25, caption_retrieval
from sparsemm_experiments.eval.bench import METRICS, BenchConfig, run_exclusion_bench
from sparsemm_experiments.eval.exclusion import (
    build_exclusion_queries,
    git_commit,
    hard_mask,
    jsonable,
    markdown_table,
    query_matrices,
    read_per_query,
    significance,
    summarize,
)
from sparsemm_experiments.eval.metrics import evaluate_rankings
from sparsemm_experiments.eval.retrieval import recall_at_ks, target_ranks, top_k_rows
from sparsemm_experiments.eval.tables import md_table
from sparsemm_experiments.models.lexlip import LexLIPConfig, LexLIPModel, expected_flops
from sparsemm_experiments.presets import load_preset
from sparsemm_experiments.train.lexlip import (
    LexLIPTrainConfig,
    build_config,
    caption_patches,
    lexlip_data,
    spatial_patches,
    train_lexlip,
    trained_matches,
)

logger = logging.getLogger(__name__)

# Strategies of the timed bench. Left out for time: the caption-word detectors (288-point
# grids, minutes each; ``with_detectors`` adds them) and ``filter`` (48 grid points, about
# 2 CPU-minutes on the COCO lexicon codes; pass it in ``methods`` to include it).
DEFAULT_METHODS = (
    "dense_a",
    "slq",
    "avg_emb",
    "avg_emb_0.5",
    "code_a",
    "code_arith",
    "penalty",
)
DETECTORS = ("dense_detector", "detector")
SHOWN = ("ap@10", "mrr@10", "ndcg@10", "violation@10")
BM25_NAME = "BM25 captions (B demoted)"
KS = (1, 5, 10)


# The run's settings, as data: presets/lexlip.json (the --quick preset overrides them).
_LEXLIP = load_preset("lexlip")


@dataclass(frozen=True)
class LexLIPRunConfig:
    pretrain_steps: int = _LEXLIP["pretrain_steps"]  # phase-1 steps (COCO)
    contrastive_steps: int = _LEXLIP["contrastive_steps"]  # phase-2 steps (COCO)
    # phase-1 steps (collages: 49-patch images, 59 terms)
    collage_pretrain_steps: int = _LEXLIP["collage_pretrain_steps"]
    # phase-2 steps (collages)
    collage_contrastive_steps: int = _LEXLIP["collage_contrastive_steps"]
    batch_size: int = _LEXLIP["batch_size"]
    # training captions per item (cached frozen states)
    captions_per_item: int | None = _LEXLIP["captions_per_item"]
    frozen_layers: int = _LEXLIP["frozen_layers"]  # MiniLM layers kept frozen (the 6th trains)
    # word pieces per caption (90% of COCO captions fit)
    max_text_len: int = _LEXLIP["max_text_len"]
    # lexicon = training-caption pieces seen this often
    vocab_min_count: int = _LEXLIP["vocab_min_count"]
    queue_size: int = _LEXLIP["queue_size"]  # paper 11,520 at a far larger batch and data scale
    new_lr: float = _LEXLIP["new_lr"]  # fresh layers (see LexLIPTrainConfig)
    limit_items: int | None = None  # evaluation / tuning items per split (quick runs)
    methods: tuple[str, ...] = _LEXLIP["methods"]
    max_grid: int | None = None  # grid points per strategy (quick runs)
    latency_queries: int = _LEXLIP["latency_queries"]  # queries timed in the large-scale setting
    seed: int = 0
    base_model: LexLIPConfig | None = None  # text side etc. as is (tests: tiny towers)

    def train_config(self, setting: str = "coco") -> LexLIPTrainConfig:
        collages = setting == "collages"
        return LexLIPTrainConfig(
            pretrain_steps=self.collage_pretrain_steps if collages else self.pretrain_steps,
            contrastive_steps=(
                self.collage_contrastive_steps if collages else self.contrastive_steps
            ),
            batch_size=self.batch_size,
            new_lr=self.new_lr,
            seed=self.seed,
            captions_per_item=self.captions_per_item,
        )

    def model_config(self, kind: str) -> LexLIPConfig:
        if self.base_model is not None:
            return dataclasses.replace(self.base_model, image_input=kind)
        return LexLIPConfig(
            image_input=kind,
            frozen_layers=self.frozen_layers,
            max_text_len=self.max_text_len,
            queue_size=self.queue_size,
            seed=self.seed,
        )


QUICK = LexLIPRunConfig(**load_preset("lexlip_quick"))  # presets/lexlip_quick.json


# --------------------------------------------------------------------------- settings


@dataclass
class Setting:
    """One collection with its item patches (all items) and patch kind."""

    name: str
    collection: Collection
    kind: str  # "captions" | "efficientnet"
    patches: np.ndarray
    patch_mask: np.ndarray

    @classmethod
    def coco(cls, collection: Collection) -> Setting:
        p, m, _ = caption_patches(collection)
        return cls("coco", collection, "captions", p, m)

    @classmethod
    def collages(cls, collection: Collection, cache_dir: Path, progress: bool = False) -> Setting:
        p, m = spatial_patches(collection, cache_dir, progress=progress)
        return cls("collages", collection, "efficientnet", p, m)

    def rows(self, split: str, limit: int | None = None) -> np.ndarray:
        rows = np.flatnonzero(self.collection.split_mask(split))
        return rows[:limit] if limit else rows


class CachedTextCoder:
    """LexLIP's text side with a per-text cache.

    ``encode_text`` gives the Dense variant's unit [CLS] projections (the text encoder of
    the dense strategies), :meth:`query_coder` the lexicon codes (the sparse query coder);
    each text is encoded once.
    """

    name = "lexlip-text"

    def __init__(self, model: LexLIPModel) -> None:
        self.model = model
        self.dim = model.config.dense_dim
        self._lex: dict[str, sp.csr_matrix] = {}
        self._dense: dict[str, np.ndarray] = {}

    def _ensure(self, texts: Sequence[str]) -> None:
        missing = [t for t in dict.fromkeys(texts) if t not in self._dense]
        if missing:
            lex, dense = self.model.encode_text(missing)
            for i, t in enumerate(missing):
                self._lex[t] = lex[i]
                self._dense[t] = dense[i]

    def lexicon(self, texts: Sequence[str]) -> sp.csr_matrix:
        self._ensure(texts)
        if not texts:
            return sp.csr_matrix((0, self.model.config.lexicon_size), dtype=np.float32)
        return sp.csr_matrix(sp.vstack([self._lex[t] for t in texts]), dtype=np.float32)

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        self._ensure(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._dense[t] for t in texts]).astype(np.float32)

    def query_coder(self, emb: np.ndarray, texts: Sequence[str]) -> sp.csr_matrix:
        return self.lexicon(list(texts))


def train_or_load(
    setting: Setting,
    out_dir: Path,
    cfg: LexLIPRunConfig,
    progress: bool = False,
) -> tuple[LexLIPModel, dict[str, Any]]:
    """Train LexLIP on the setting's train split, or reuse a finished identical run."""
    col = setting.collection
    data = lexlip_data(
        col, col.split_mask("train"), setting.kind, patches=(setting.patches, setting.patch_mask)
    )
    config, vocab = build_config(data, cfg.model_config(setting.kind), cfg.vocab_min_count)
    tc = cfg.train_config(setting.name)
    info: dict[str, Any] = {
        "model_dir": str(out_dir),
        "train_items": data.n_items,
        "train_captions": len(data.captions),
        "lexicon_size": config.lexicon_size,
        "config": dataclasses.asdict(config),
        "train": dataclasses.asdict(tc),
    }
    if trained_matches(out_dir, data, config, tc):
        logger.info("%s: reusing the trained LexLIP model in %s", setting.name, out_dir)
        model = LexLIPModel.from_pretrained(out_dir)
        info["train_seconds"] = None
        return model, info
    t0 = time.perf_counter()
    model, history = train_lexlip(data, config, vocab, out_dir, tc, resume=True, progress=progress)
    info["train_seconds"] = round(time.perf_counter() - t0, 1)
    info["history_first_last"] = [history[0], history[-1]] if history else []
    return model, info


# -------------------------------------------------------------------------- retrieval


def _i2t_recall(
    items: Any, texts: Any, owner: np.ndarray, ks: Sequence[int] = KS
) -> dict[str, float]:
    """Image-to-text R@k: share of items with one of their captions in the top k."""
    n = items.shape[0]
    top = top_k_rows(items, texts, max(ks))
    hits = owner[top] == np.arange(n)[:, None]
    return {f"R@{k}": float(hits[:, :k].any(axis=1).mean()) for k in ks}


def _loo_dense(texts: np.ndarray, owner: np.ndarray, n_items: int) -> np.ndarray:
    """Leave-one-out caption-to-item ranks with dense caption embeddings (0-based)."""
    unit = l2_normalize(texts)
    ranks = np.empty(len(unit), dtype=np.int64)
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(n_items))
    if len(np.unique(owner)) != n_items:
        raise SparsemmError("every item needs at least one caption for leave-one-out ranks")
    for s in range(0, len(unit), 512):
        sc = unit[s : s + 512] @ unit.T
        idx = np.arange(s, min(s + 512, len(unit)))
        sc[idx - s, idx] = -np.inf
        # Best caption per item: captions sorted by item, max over each item's block.
        per_item = np.maximum.reduceat(sc[:, order], bounds, axis=1)
        tgt = per_item[np.arange(len(idx)), owner[idx]][:, None]
        ranks[idx] = (per_item > tgt).sum(axis=1) + (per_item == tgt).sum(axis=1) - 1
    return ranks


def _loo_ranks_from_rankings(rankings: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """0-based rank of each target in (q, k) rankings; k (= beyond) when absent."""
    hit = rankings == targets[:, None]
    return np.where(hit.any(axis=1), hit.argmax(axis=1), rankings.shape[1]).astype(np.int64)


def retrieval_metrics(
    setting: Setting,
    coder: CachedTextCoder,
    item_lex: sp.csr_matrix,
    item_dense: np.ndarray,
    limit: int | None = None,
    minilm_views: bool = False,
) -> dict[str, dict[str, float]]:
    """Test-split retrieval: t2i / i2t R@k per representation + leave-one-out rows."""
    col = setting.collection
    rows = setting.rows("test", limit)
    mask = np.zeros(len(col.items), dtype=bool)
    mask[rows] = True
    trows, owner = col.caption_rows(mask)
    texts = [str(col.texts[r]["text"]) for r in trows]
    q_lex, q_dense = coder.lexicon(texts), coder.encode_text(texts)
    reps: dict[str, tuple[Any, Any]] = {
        "LexLIP (lexicon, sparse)": (q_lex, item_lex[rows]),
        "LexLIP-Dense ([CLS])": (q_dense, item_dense[rows]),
    }
    enc = col.text_encoder_name
    if minilm_views:
        reps[f"{enc} dense (caption views)"] = (
            col.text_embeddings()[trows],
            col.image_embeddings()[rows],
        )
    out: dict[str, dict[str, float]] = {}
    for name, (q, it) in reps.items():
        t2i = recall_at_ks(target_ranks(q, it, owner), KS)
        i2t = _i2t_recall(it, q, owner)
        row = {**{f"t2i_{k}": v for k, v in t2i.items()}, **{f"i2t_{k}": v for k, v in i2t.items()}}
        if sp.issparse(q):
            row["nnz_query"] = float(sp.csr_matrix(q).getnnz(axis=1).mean())
            row["nnz_item"] = float(sp.csr_matrix(it).getnnz(axis=1).mean())
            row["flops"] = expected_flops(it, q)
        out[name] = row
    # Leave-one-out caption matching (the only meaningful t2i protocol for BM25).
    bm = caption_retrieval(texts, owner, np.arange(len(texts)), k=max(KS))
    out["BM25 captions (leave-one-out)"] = {
        f"t2i_{k}": v for k, v in recall_at_ks(_loo_ranks_from_rankings(bm, owner), KS).items()
    }
    out[f"{enc} captions (leave-one-out)"] = {
        f"t2i_{k}": v
        for k, v in recall_at_ks(
            _loo_dense(col.text_embeddings()[trows], owner, len(rows)), KS
        ).items()
    }
    out["_counts"] = {"items": float(len(rows)), "captions": float(len(texts))}
    return out


# -------------------------------------------------------------------------- exclusion


def _per_query(run_dir: Path, methods: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    per, _ = read_per_query(run_dir)
    return {m: {k: per[m][k] for k in METRICS} for m in methods}


def _label(method: str, prefix_dense: str, prefix_sparse: str) -> str:
    kind = get_spec(method).kind
    return f"{prefix_dense if kind == 'dense' else prefix_sparse}: {method}"


def exclusion_metrics(
    setting: Setting,
    coder: CachedTextCoder,
    item_lex: sp.csr_matrix,
    item_dense: np.ndarray,
    out_dir: Path,
    cfg: LexLIPRunConfig,
    minilm_encoder: Any = None,
    with_detectors: bool = False,
) -> dict[str, Any]:
    """The exclusion benchmark for LexLIP / LexLIP-Dense (+ MiniLM) + BM25 on one setting."""
    col = setting.collection
    methods = tuple(cfg.methods) + (DETECTORS if with_detectors else ())
    bench_cfg = BenchConfig(
        methods=methods, limit_items=cfg.limit_items, max_grid=cfg.max_grid, seed=cfg.seed
    )
    lex_dir = out_dir / "exclusion-lexlip"

    def dense_texts(rows: np.ndarray) -> np.ndarray:
        # The bench's retrieval table asks for the evaluation items' captions in the dense
        # space: only those are encoded (all 25k COCO captions would cost minutes).
        return coder.encode_text([str(col.texts[r]["text"]) for r in rows])

    content = run_exclusion_bench(
        col,
        lex_dir,
        coder,
        query_coder=coder.query_coder,
        config=bench_cfg,
        run_info={
            "sparse_model_name": "LexLIP lexicon",
            "dense": "LexLIP-Dense [CLS] projections (image and text)",
        },
        item_codes=item_lex,
        dense_items=item_dense,
        dense_texts=dense_texts,
    )
    names = list(content["methods"])
    per_query = {
        _label(m, "LexLIP-Dense", "LexLIP"): v for m, v in _per_query(lex_dir, names).items()
    }
    if minilm_encoder is not None:
        mini = ("dense_a", "avg_emb_0.5")
        mdir = out_dir / "exclusion-minilm"
        run_exclusion_bench(
            col,
            mdir,
            minilm_encoder,
            config=dataclasses.replace(bench_cfg, methods=mini),
            run_info={"dense": "MiniLM caption views"},
        )
        per_query.update({f"MiniLM: {m}": v for m, v in _per_query(mdir, mini).items()})

    rows = setting.rows("test", cfg.limit_items)
    labels = [list(col.items[r].get("labels") or []) for r in rows]
    queries = build_exclusion_queries(labels)
    n = len(next(iter(per_query.values()))["ap@10"])
    if len(queries) != n:
        raise SparsemmError(f"rebuilt {len(queries)} exclusion queries, the bench had {n}")
    caps: list[list[str]] = [[] for _ in col.items]
    for t in col.texts:
        caps[int(t["item"])].append(str(t["text"]))
    bm25 = CaptionBM25().fit([caps[r] for r in rows])
    rankings = bm25.rank_many([(q.a, q.b) for q in queries], 10)
    rel, has_a, has_b = query_matrices(queries, len(rows))
    per_query[BM25_NAME] = evaluate_rankings(
        rankings, rel, list(METRICS), excluded=has_b, included=has_a
    )

    baselines = [b for b in ("LexLIP-Dense: avg_emb_0.5", BM25_NAME) if b in per_query]
    subsets = {"all": np.ones(n, dtype=bool), "hard": hard_mask(queries)}
    result: dict[str, Any] = {
        "n_queries": n,
        "n_hard": int(subsets["hard"].sum()),
        "baselines": baselines,
        "chosen": content.get("tuning", {}).get("chosen", {}),
        "subsets": {},
        "bench_dirs": [str(lex_dir)]
        + ([str(out_dir / "exclusion-minilm")] if minilm_encoder is not None else []),
    }
    for name, m in subsets.items():
        if not m.any():
            continue
        result["subsets"][name] = {
            "n_queries": int(m.sum()),
            "means": summarize(per_query, m),
            "p_values": significance(per_query, list(SHOWN), baselines, m),
        }
    return result


# ------------------------------------------------------------------------ large scale


def _latency(fn: Callable[[int], Any], n: int, warmup: int = 10) -> dict[str, float]:
    for i in range(min(warmup, n)):
        fn(i)
    times = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times[i] = time.perf_counter() - t0
    return {
        "p50_ms": float(np.percentile(times, 50) * 1e3),
        "p99_ms": float(np.percentile(times, 99) * 1e3),
        "mean_ms": float(times.mean() * 1e3),
    }


def _dense_topk(items: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    s = items @ q
    top = np.argpartition(-s, k)[:k]
    return top[np.argsort(-s[top], kind="stable")]


def _csr_bytes(m: sp.csr_matrix) -> int:
    m = sp.csr_matrix(m)
    return int(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes)


def prune_rows(codes: sp.csr_matrix, k: int | None) -> sp.csr_matrix:
    """Keep each row's k largest values (None: unchanged)."""
    m = sp.csr_matrix(codes, dtype=np.float32, copy=True)
    if k is None:
        return m
    for i in range(m.shape[0]):
        lo, hi = m.indptr[i], m.indptr[i + 1]
        if hi - lo > k:
            vals = m.data[lo:hi]
            drop = np.argpartition(-vals, k)[k:]
            vals[drop] = 0.0
    m.eliminate_zeros()
    return m


def _rows_of_hits(hits: Sequence[Any], k: int) -> np.ndarray:
    out = np.full((len(hits), k), -1, dtype=np.int64)
    for i, h in enumerate(hits):
        out[i, : len(h.rows)] = h.rows
    return out


PRUNED = (64, 32)  # item / query top-k of the pruned sparse variant


def large_scale_metrics(
    coco: Setting,
    model: LexLIPModel,
    coder: CachedTextCoder,
    collages: Collection | None,
    out_dir: Path,
    cfg: LexLIPRunConfig,
) -> dict[str, Any]:
    """The COCO test items inside a pool of every COCO item plus every collage.

    Sparse variants: the full lexicon codes and a pruned copy (item top-64, query top-32),
    each served by :class:`~sparsemm.index.InvertedIndex` (exact inner-product top-k over
    L2-normalised rows, i.e. cosine); dense variants by brute force. Latency: one query at
    a time on one thread (BLAS limited to one thread too).
    """
    from threadpoolctl import threadpool_limits

    from sparsemm.index import InvertedIndex

    col = coco.collection
    enc = col.text_encoder_name
    patches, pmask = coco.patches, coco.patch_mask
    ids = [f"coco:{i}" for i in col.ids]
    labels = [set(it.get("labels") or []) for it in col.items]
    caps: list[list[str]] = [[] for _ in col.items]
    for t in col.texts:
        caps[int(t["item"])].append(str(t["text"]))
    views = col.image_embeddings()
    n_collages = 0
    if collages is not None:
        if not collages.has_texts() or collages.text_dim != coco.patches.shape[2]:
            logger.warning("collage captions are not %d-d; pool without collages", patches.shape[2])
        else:
            cp, cm, _ = caption_patches(collages)
            width = max(patches.shape[1], cp.shape[1])
            patches = np.concatenate(
                [
                    np.pad(patches, ((0, 0), (0, width - patches.shape[1]), (0, 0))),
                    np.pad(cp, ((0, 0), (0, width - cp.shape[1]), (0, 0))),
                ]
            )
            pmask = np.concatenate(
                [
                    np.pad(pmask, ((0, 0), (0, width - pmask.shape[1]))),
                    np.pad(cm, ((0, 0), (0, width - cm.shape[1]))),
                ]
            )
            ids += [f"collage:{i}" for i in collages.ids]
            labels += [set() for _ in collages.items]  # no COCO category is relevant there
            ccaps: list[list[str]] = [[] for _ in collages.items]
            for t in collages.texts:
                ccaps[int(t["item"])].append(str(t["text"]))
            caps += ccaps
            cviews, _ = caption_views(
                collages.text_embeddings(), collages.text_item_index(), len(collages.items)
            )
            views = np.concatenate([views, cviews])
            n_collages = len(collages.items)
    n_pool = len(ids)
    t0 = time.perf_counter()
    pool_lex, pool_dense = model.encode_items(patches, pmask)
    encode_s = time.perf_counter() - t0
    dense_pool = np.ascontiguousarray(pool_dense, dtype=np.float32)
    view_pool = np.ascontiguousarray(l2_normalize(views), dtype=np.float32)

    # Caption queries: the COCO test captions, target = their item (rows 0..n_coco-1).
    test = coco.rows("test", cfg.limit_items)
    tmask = np.zeros(len(col.items), dtype=bool)
    tmask[test] = True
    trows, owner = col.caption_rows(tmask)
    targets = test[owner]
    texts = [str(col.texts[r]["text"]) for r in trows]
    q_lex_raw = coder.lexicon(texts)
    q_dense = coder.encode_text(texts)
    q_views = l2_normalize(col.text_embeddings()[trows])
    test_labels = sorted({x for r in test for x in labels[r]})
    lab_texts = [TERM_TEMPLATE.format(x) for x in test_labels]
    rel = [np.flatnonzero([x in s for s in labels]) for x in test_labels]
    lab_lex_raw = coder.lexicon(lab_texts)
    n_lat = min(cfg.latency_queries, len(texts))
    sel = np.random.default_rng(cfg.seed).choice(len(texts), n_lat, replace=False)

    sparse_variants = {
        "LexLIP (inverted index)": (None, None),
        f"LexLIP top-{PRUNED[0]}/{PRUNED[1]} (inverted index)": PRUNED,
    }
    t2i: dict[str, dict[str, float]] = {}
    label_rankings: dict[str, np.ndarray] = {}
    latency: dict[str, dict[str, float]] = {}
    sizes: dict[str, dict[str, float]] = {}
    agreement: dict[str, float] = {}
    build_s: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(prefix="lexlip-index-", dir=out_dir))
    try:
        for name, (ki, kq) in sparse_variants.items():
            items = sp.csr_matrix(normalize_rows(prune_rows(pool_lex, ki)), dtype=np.float32)
            queries = sp.csr_matrix(normalize_rows(prune_rows(q_lex_raw, kq)), dtype=np.float32)
            labq = sp.csr_matrix(normalize_rows(prune_rows(lab_lex_raw, kq)), dtype=np.float32)
            t0 = time.perf_counter()
            index = InvertedIndex.build(tmp / f"index-{len(build_s)}", items, ids)
            build_s[name] = round(time.perf_counter() - t0, 3)
            index.warm()
            hits = index.search_batch(queries, k=10)
            top = _rows_of_hits(hits, 10)
            agreement[name] = _exact_share(hits, queries, items, 10)
            t2i[name] = recall_at_ks(_loo_ranks_from_rankings(top, targets), KS)
            label_rankings[name] = _rows_of_hits(index.search_batch(labq, k=10), 10)
            qrows = [queries[int(i)] for i in sel]
            with threadpool_limits(1):
                latency[name] = _latency(_index_query(index, qrows), n_lat)
            sizes[name] = {
                "bytes": int(index.nbytes),
                "bytes_per_item": index.nbytes / n_pool,
                "nnz_per_item": float(items.getnnz(axis=1).mean()),
                "nnz_per_query": float(queries.getnnz(axis=1).mean()),
            }
            if ki is None:
                with threadpool_limits(1):
                    latency["LexLIP (scipy CSR brute force)"] = _latency(
                        _csr_query(items, qrows), n_lat
                    )
                sizes["LexLIP (CSR arrays)"] = {
                    "bytes": _csr_bytes(items),
                    "bytes_per_item": _csr_bytes(items) / n_pool,
                }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    t2i["LexLIP-Dense (brute force)"] = recall_at_ks(target_ranks(q_dense, pool_dense, targets), KS)
    t2i[f"{enc} dense (brute force)"] = recall_at_ks(target_ranks(q_views, views, targets), KS)
    label_rankings["LexLIP-Dense (brute force)"] = top_k_rows(
        coder.encode_text(lab_texts), pool_dense, 10
    )
    label_rankings["BM25 captions"] = CaptionBM25().fit(caps).search_many(test_labels, 10)
    mini = _minilm_encoder(col)
    if mini is not None:
        label_rankings[f"{enc} dense (brute force)"] = top_k_rows(
            mini.encode_text(lab_texts), views, 10
        )
    label_ap = {
        name: float(evaluate_rankings(r, rel, ["ap@10"])["ap@10"].mean())
        for name, r in label_rankings.items()
    }
    qd, qv = q_dense[sel], q_views[sel]
    with threadpool_limits(1):
        latency["LexLIP-Dense (brute force)"] = _latency(
            lambda i: _dense_topk(dense_pool, qd[i], 10), n_lat
        )
        latency[f"{enc} dense (brute force)"] = _latency(
            lambda i: _dense_topk(view_pool, qv[i], 10), n_lat
        )
    sizes["LexLIP-Dense (float32)"] = {
        "bytes": int(dense_pool.nbytes),
        "bytes_per_item": dense_pool.nbytes / n_pool,
    }
    sizes[f"{enc} dense (float32)"] = {
        "bytes": int(view_pool.nbytes),
        "bytes_per_item": view_pool.nbytes / n_pool,
    }
    return {
        "pool": {"items": n_pool, "coco": len(col.items), "collages": n_collages},
        "caption_queries": len(texts),
        "label_queries": len(test_labels),
        "t2i": t2i,
        "label_ap@10": label_ap,
        "latency": latency,
        "latency_queries": n_lat,
        "sizes": sizes,
        "index_agreement_top10": agreement,
        "encode_pool_seconds": round(encode_s, 2),
        "index_build_seconds": build_s,
    }


def _exact_share(
    hits: Sequence[Any], queries: sp.csr_matrix, items: sp.csr_matrix, k: int
) -> float:
    """Share of queries whose index top-k scores equal the brute-force top-k scores (same
    ranking up to the order of tied items)."""
    ok = 0
    for s in range(0, queries.shape[0], 512):
        scores = np.asarray((queries[s : s + 512] @ items.T).toarray())
        best = -np.sort(-scores, axis=1)[:, :k]
        for j, want in enumerate(best):
            got = np.asarray(hits[s + j].scores, dtype=np.float64)
            ok += len(got) == len(want) and bool(np.allclose(got, want, atol=1e-5))
    return ok / max(queries.shape[0], 1)


def _index_query(index: Any, queries: list[sp.csr_matrix]) -> Callable[[int], Any]:
    return lambda i: index.search(queries[i], k=10)


def _csr_query(items: sp.csr_matrix, queries: list[sp.csr_matrix]) -> Callable[[int], Any]:
    return lambda i: _sparse_topk(items, queries[i], 10)


def _sparse_topk(items: sp.csr_matrix, q: sp.csr_matrix, k: int) -> np.ndarray:
    s = np.asarray((items @ q.T).toarray()).ravel()
    top = np.argpartition(-s, k)[:k]
    return top[np.argsort(-s[top], kind="stable")]


def _minilm_encoder(col: Collection) -> Any:
    """The collection's own text encoder when it is the packaged MiniLM, else None."""
    if col.text_encoder_name != "minilm":
        return None
    return packaged_minilm()


@functools.lru_cache(maxsize=1)
def packaged_minilm() -> Any:
    """The packaged all-MiniLM-L6-v2 encoder, loaded once per process."""
    from sparsemm.encoders.base import get_encoder

    return get_encoder("minilm")


# ------------------------------------------------------------------------------ export


def export_demo(
    setting: Setting,
    model: LexLIPModel,
    item_lex: sp.csr_matrix,
    coder: CachedTextCoder,
    out_dir: Path,
    limit: int | None = None,
    n_queries: int = 100,
) -> dict[str, Any]:
    """Export the test items (and some caption queries) for Anserini and ES; validate."""
    from sparsemm_experiments.export import (
        rank_features_mapping,
        validate_anserini_document,
        validate_rank_features_document,
        write_anserini_collection,
        write_anserini_queries,
        write_manifest,
        write_rank_features,
        write_rank_features_queries,
    )

    col = setting.collection
    rows = setting.rows("test", limit)
    ids = [col.ids[r] for r in rows]
    terms = model.terms
    codes = item_lex[rows]
    mask = np.zeros(len(col.items), dtype=bool)
    mask[rows] = True
    trows, _ = col.caption_rows(mask)
    qrows = trows[:n_queries]
    qtexts = [str(col.texts[r]["text"]) for r in qrows]
    qids = [f"q{r}" for r in qrows]
    qcodes = coder.lexicon(qtexts)
    stats = [
        write_anserini_collection(out_dir / "anserini" / "docs" / "docs.jsonl", ids, codes, terms),
        write_anserini_queries(out_dir / "anserini" / "queries.tsv", qids, qcodes, terms),
        write_rank_features(out_dir / "es" / "bulk.ndjson", ids, codes, terms, index="lexlip"),
        write_rank_features_queries(out_dir / "es" / "queries.jsonl", qids, qcodes, terms),
    ]
    write_json(out_dir / "es" / "mapping.json", rank_features_mapping())
    write_manifest(
        out_dir / "export.json",
        {"items": len(ids), "queries": len(qids), "terms": len(terms), "anserini_scale": 100},
        stats,
    )
    n_docs = 0
    with (out_dir / "anserini" / "docs" / "docs.jsonl").open() as fh:
        for line in fh:
            validate_anserini_document(json.loads(line))
            n_docs += 1
    with (out_dir / "es" / "bulk.ndjson").open() as fh:
        lines = fh.read().splitlines()
    for src in lines[1::2]:
        validate_rank_features_document(json.loads(src))
    return {
        "files": {Path(s.path).name: dataclasses.asdict(s) for s in stats},
        "validated_anserini_docs": n_docs,
        "validated_es_docs": len(lines) // 2,
    }


# ------------------------------------------------------------------------------ runner


def run_lexlip_bench(
    out_dir: str | Path,
    coco: Collection | None,
    collages: Collection | None,
    cfg: LexLIPRunConfig | None = None,
    with_detectors: bool = False,
    progress: bool = False,
    run_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every LexLIP table (see the module docstring) into ``out_dir``."""
    cfg = cfg or LexLIPRunConfig()
    if coco is None and collages is None:
        raise SparsemmError("give a COCO collection and/or a collage collection")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    settings: list[Setting] = []
    with torch_threads(1):
        if coco is not None:
            settings.append(Setting.coco(coco))
        if collages is not None:
            settings.append(
                Setting.collages(collages, out / "collages" / "features", progress=progress)
            )
        metrics: dict[str, Any] = {"settings": {}}
        models: dict[str, tuple[LexLIPModel, CachedTextCoder]] = {}
        for st in settings:
            t0 = time.perf_counter()
            sdir = out / st.name
            model, info = train_or_load(st, sdir / "model", cfg, progress)
            coder = CachedTextCoder(model)
            t1 = time.perf_counter()
            item_lex, item_dense = model.encode_items(st.patches, st.patch_mask)
            info["encode_items_seconds"] = round(time.perf_counter() - t1, 1)
            minilm = _minilm_encoder(st.collection) if st.name == "coco" else None
            res: dict[str, Any] = {
                "model": info,
                "retrieval": retrieval_metrics(
                    st, coder, item_lex, item_dense, cfg.limit_items, minilm is not None
                ),
                "exclusion": exclusion_metrics(
                    st, coder, item_lex, item_dense, sdir, cfg, minilm, with_detectors
                ),
            }
            if st.name == "coco":
                res["export"] = export_demo(
                    st, model, item_lex, coder, sdir / "export", cfg.limit_items
                )
            res["seconds"] = round(time.perf_counter() - t0, 1)
            metrics["settings"][st.name] = res
            models[st.name] = (model, coder)
            logger.info("%s setting done in %.0f s", st.name, res["seconds"])
        if "coco" in models:
            model, coder = models["coco"]
            t0 = time.perf_counter()
            metrics["large_scale"] = large_scale_metrics(
                settings[0], model, coder, collages, out, cfg
            )
            metrics["large_scale"]["seconds"] = round(time.perf_counter() - t0, 1)
    metrics["seconds_total"] = round(time.perf_counter() - t_start, 1)
    config = {
        "name": "LexLIP offline runs",
        "run": dataclasses.asdict(cfg),
        "with_detectors": with_detectors,
        "coco": str(coco.root) if coco is not None else None,
        "collages": str(collages.root) if collages is not None else None,
        "git_commit": git_commit(),
        **dict(run_info or {}),
    }
    metrics["git_commit"] = config["git_commit"]
    write_json(out / "config.json", jsonable(config))
    metrics = jsonable(metrics)
    write_json(out / "metrics.json", metrics)
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(render_report(metrics, config))
    return metrics


# ------------------------------------------------------------------------------ report


def _f(v: Any, digits: int = 3) -> str:
    return "–" if v is None else f"{float(v):.{digits}f}"


def render_report(m: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """``report.md`` from ``metrics.json`` content (tables are never typed by hand)."""
    lines = ["# LexLIP offline runs", "", f"Commit: `{m.get('git_commit', 'unknown')}`", ""]
    run = config.get("run", {})
    lines += [
        f"Training: {run.get('pretrain_steps')} lexicon-bottleneck + "
        f"{run.get('contrastive_steps')} momentum-contrastive steps on COCO, "
        f"{run.get('collage_pretrain_steps')} + {run.get('collage_contrastive_steps')} on the "
        f"collages, batch "
        f"{run.get('batch_size')}, {run.get('captions_per_item')} cached captions per item, "
        f"MiniLM layers frozen: {run.get('frozen_layers')}/6, queue {run.get('queue_size')}, "
        f"one CPU thread. Total time {m.get('seconds_total')} s.",
        "",
    ]
    for name, res in m.get("settings", {}).items():
        info = res["model"]
        lines += [
            f"## {name}",
            "",
            f"Trained on {info['train_items']} items / {info['train_captions']} captions; "
            f"lexicon of {info['lexicon_size']} word pieces; training "
            f"{_f(info.get('train_seconds'), 0)} s; setting total {res['seconds']} s.",
            "",
            "### Retrieval (test split, R@k)",
            "",
        ]
        ret = res["retrieval"]
        counts = ret.get("_counts", {})
        lines.append(
            f"{int(counts.get('captions', 0))} caption queries over "
            f"{int(counts.get('items', 0))} test items."
        )
        rows = []
        for rep, row in ret.items():
            if rep.startswith("_"):
                continue
            cells = [_f(row.get(f"t2i_R@{k}")) for k in KS]
            cells += [_f(row.get(f"i2t_R@{k}")) for k in KS]
            cells += [
                _f(row.get("nnz_item"), 1),
                _f(row.get("nnz_query"), 1),
                _f(row.get("flops"), 1),
            ]
            rows.append([rep, *cells])
        header = [
            "representation",
            *(f"{d} R@{k}" for d in ("t2i", "i2t") for k in KS),
            "nnz item",
            "nnz query",
            "FLOPs",
        ]
        lines += ["", *md_table(header, rows, "l" + "r" * (len(header) - 1))]
        lines += [
            "",
            "Leave-one-out rows: documents are single captions, the query caption is removed "
            "and items rank by their best remaining caption (BM25 would otherwise match the "
            "query to itself).",
            "",
        ]
        ex = res["exclusion"]
        lines += [f"### Exclusion queries ({ex['n_queries']} queries, {ex['n_hard']} hard)", ""]
        for sub_name, sub in ex["subsets"].items():
            lines += [f"**{sub_name}** ({sub['n_queries']} queries)", ""]
            lines.append(
                markdown_table(
                    sub["means"],
                    list(SHOWN),
                    baseline=ex["baselines"] or None,
                    p_values=sub["p_values"],
                    n_queries=sub["n_queries"],
                )
            )
        chosen = ex.get("chosen") or {}
        if chosen:
            lines += ["Tuned parameters (train split): "]
            lines += [
                "; ".join(
                    f"{k}: " + (", ".join(f"{a}={b}" for a, b in v.items()) or "defaults")
                    for k, v in chosen.items()
                ),
                "",
            ]
        if "export" in res:
            ex_info = res["export"]
            lines += ["### Export", ""]
            for fname, st in ex_info["files"].items():
                lines.append(
                    f"- `{fname}`: {st['documents']} rows, {st['postings']} postings, "
                    f"{st['dropped']} dropped, {st['bytes']} bytes"
                )
            lines += [
                f"- validated: {ex_info['validated_anserini_docs']} Anserini documents, "
                f"{ex_info['validated_es_docs']} rank_features documents",
                "",
            ]
    ls = m.get("large_scale")
    if ls:
        pool = ls["pool"]
        lines += [
            "## Large-scale pool (COCO model)",
            "",
            f"Pool: {pool['items']} items ({pool['coco']} COCO val2017 + {pool['collages']} "
            f"collages as caption patches); {ls['caption_queries']} COCO test caption queries, "
            f"{ls['label_queries']} label queries; the inverted index returns the brute-force "
            "top-10 scores for "
            + ", ".join(f"{_f(v)} ({k})" for k, v in ls["index_agreement_top10"].items())
            + " of the queries.",
            "",
        ]
        systems = list(dict.fromkeys([*ls["t2i"], *ls["label_ap@10"]]))
        rows = [
            [
                s,
                *(_f(ls["t2i"].get(s, {}).get(f"R@{k}")) for k in KS),
                _f(ls["label_ap@10"].get(s)),
            ]
            for s in systems
        ]
        header = ["system", *(f"t2i R@{k}" for k in KS), "label AP@10"]
        lines += md_table(header, rows, "l" + "r" * (len(header) - 1))
        lines += [
            "",
            f"Latency per query ({ls['latency_queries']} caption queries, one thread, top-10):",
            "",
            *md_table(
                ["system", "p50 ms", "p99 ms"],
                [(s, _f(v["p50_ms"]), _f(v["p99_ms"])) for s, v in ls["latency"].items()],
                "lrr",
            ),
            "",
            *md_table(
                ["storage", "bytes", "bytes / item", "nnz / item", "nnz / query"],
                [
                    (
                        s,
                        v["bytes"],
                        _f(v["bytes_per_item"], 1),
                        _f(v.get("nnz_per_item"), 1),
                        _f(v.get("nnz_per_query"), 1),
                    )
                    for s, v in ls["sizes"].items()
                ],
                "lrrrr",
            ),
            "",
        ]
    return "\n".join(lines) + "\n"


def build_collage_collection(
    out: str | Path,
    n_train: int,
    n_test: int,
    seed: int = 0,
    progress: bool = False,
    features_dir: str | Path | None = None,
) -> Collection:
    """Build Fashion-MNIST collages and their collection in one EfficientNet pass.

    The collection matches ``sparsemm encode ITEMS --encoder efficientnet --text-encoder
    minilm`` (image_emb = the L2-normalised mean of the 7x7 map = the pooled feature), and
    the spatial features are cached in ``features_dir`` for :func:`spatial_patches`.
    """
    from sparsemm.data.sources import read_items
    from sparsemm.encoders.efficientnet import EfficientNetEncoder
    from sparsemm_experiments.data.fashion import build_collages

    out = Path(out)
    items_path = build_collages(out / "images", n_train, n_test, seed=seed, progress=progress)
    items = [dict(it) for it in read_items(items_path)]
    enc = EfficientNetEncoder()
    spatial = enc.encode_spatial([it["image"] for it in items], progress=progress)
    pooled = l2_normalize(spatial.mean(axis=1))
    texts = [{"item": i, "text": c} for i, it in enumerate(items) for c in it.get("captions") or []]
    tenc = packaged_minilm()
    temb = tenc.encode_text([t["text"] for t in texts], progress=progress)
    col = write_collection(
        out / "collection",
        items,
        {"name": enc.name, "dim": enc.dim, "model": enc.model_id},
        image_emb=pooled,
        text_emb=temb,
        texts=texts,
        extra={"image_kind": "pixels"},
        text_encoder={"name": tenc.name, "dim": tenc.dim, "model": tenc.model_id},
    )
    if features_dir is not None:
        from sparsemm.io import save_npy
        from sparsemm_experiments.train.lexlip import collection_key

        save_npy(
            Path(features_dir) / f"spatial-{collection_key(col, 'effnet-lite0')}.npy",
            spatial.astype(np.float16),
        )
    return col
