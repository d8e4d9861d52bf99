"""VDR's offline runs: the COCO caption-proxy and the Fashion-MNIST collages.

Per dataset (caption views: docs/formats.md; the label-pair protocol: docs/negation.md;
every number below is measured by this module):

1. Image side input, frozen and cached: on the **caption-proxy** (no pixels) an item's
   "patches" are the frozen MiniLM embeddings of its 5-7 captions (a set of vectors, like a
   spatial grid; their mean is the item's dense view, so VDR sees exactly what the dense
   and SR rows see); on the **collages** the 7 x 7 x 1280 EfficientNet-Lite0 feature map.
2. Models: a VDR bi-encoder initialised from all-MiniLM-L6-v2 (:meth:`VDRModel.from_minilm`),
   head biases calibrated on a train sample (:meth:`VDRModel.calibrate`); for the collages
   the patch adapter starts as a ridge map from pooled image features to the items' caption
   views. Trained cross-modally (:func:`~sparsemm_experiments.train.vdr.train_vdr`) on the ``train``
   split's (caption, item) pairs, with the bag-of-words entry (main model) and without it
   (ablation). Zero-shot (untrained) codes are reported too.
3. Evaluation: the exclusion benchmark
   (:func:`~sparsemm_experiments.eval.bench.run_exclusion_bench`,
   with ``item_codes``; VDR's exclusion is the SR paper's multi-step method ``paper``, next
   to the other sparse strategies) and its image-text retrieval table; the same run for an
   SR model when given; effectiveness vs the number of active dimensions k; the BoW on/off
   ablation with the "disentanglement laziness" check (per-token mean values of the encoded
   test items, top-100 tokens as a word cloud and as a box plot); explanations of index
   search results (top tokens, per-token contributions that sum to the score).

Everything a run produced lands in one report folder (``report.md``, ``metrics.json``,
``config.json`` with the git commit, PNGs, one sub-folder per benchmark run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.io import (
    atomic_open,
    load_csr,
    read_json,
    save_csr,
    write_json,
)
from sparsemm.linalg import normalize_rows
from sparsemm.query.strategies import (
    QueryCoder,
    TextEncoder,
    get_spec,
    register_strategy,
    sr_query_coder,
)
from sparsemm.runtime import torch_threads
from sparsemm.train.checkpoint import has_checkpoint
from sparsemm_experiments.eval.bench import BenchConfig, run_exclusion_bench
from sparsemm_experiments.eval.exclusion import git_commit
from sparsemm_experiments.eval.tables import md_table
from sparsemm_experiments.models.vdr import VDRModel, explain_pair, fast_bf16_available, resparsify
from sparsemm_experiments.presets import load_preset
from sparsemm_experiments.train.vdr import (
    CrossModalData,
    cross_modal_data,
    preset_train_config,
    train_vdr,
)

log = logging.getLogger(__name__)

# Ablations: the violation reference, the include-only row and the multi-step method with the
# parameters chosen for the main model (FIXED_PAPER; re-tuning per variant costs minutes).
FIXED_PAPER = "paper_vdr_main"
ABLATION_METHODS = ("avg_emb_0.5", "code_a", FIXED_PAPER)
TABLE_METRICS = ("ap@10", "mrr@10", "ndcg@10", "violation@10")


# The run's settings, as data: presets/vdr.json (the --quick preset overrides them).
_VDR = load_preset("vdr")


@dataclass(frozen=True)
class VDRRunConfig:
    steps: int = _VDR["steps"]  # training updates per model (about 2 minutes on an idle core)
    # in-batch negatives (VDR: 4096 cross-modal; scaled to CPU)
    batch_size: int = _VDR["batch_size"]
    lr: float = _VDR["lr"]  # pretrained transformer layers (VDR: 2e-5 t2t; 2e-4 cross-modal
    # degraded retrieval within 60-80 CPU steps here, see docs/vdr.md)
    # adapter, LayerNorms, head biases (start near their init)
    new_params_lr: float = _VDR["new_params_lr"]
    freeze_layers: int = _VDR["freeze_layers"]  # lower MiniLM layers kept frozen (6 in all)
    top_k: int = _VDR["top_k"]  # active dims per code (VDR cross-modal: 512)
    ks: tuple[int, ...] = _VDR["ks"]  # the activation-count ablation
    ablate_bow: bool = _VDR["ablate_bow"]  # also train without the bag-of-words entry
    zero_shot: bool = _VDR["zero_shot"]  # also score the untrained (calibrated) initialisation
    # Exclusion strategies of the main runs: the dense baselines, the include-only reference,
    # the SR paper's multi-step method (how the SR paper ran VDR) and code arithmetic.
    # ``filter`` and ``penalty`` (84 grid points over 30k-dim codes) can be added with --methods.
    methods: tuple[str, ...] = _VDR["methods"]
    max_train_pairs: int | None = None  # quick runs: first N training pairs
    limit_items: int | None = None  # quick runs: first N items per split in the benchmark
    max_grid: int | None = None  # quick runs: grid points per strategy
    calibration_size: int = _VDR["calibration_size"]  # train texts / items used by calibrate()
    bf16: bool | None = None  # bfloat16 vocabulary projection (None: when the CPU has AMX)
    threads: int = 1  # torch threads (2 shared cores: one thread is fastest per process)
    seed: int = 0
    init: str | None = None  # BERT folder to start from (None: packaged all-MiniLM-L6-v2)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 2:
            raise SparsemmError("steps must be >= 1 and batch_size >= 2")
        if not self.ks or min(self.ks) < 1:
            raise SparsemmError("ks must be positive activation counts")


QUICK: dict[str, Any] = load_preset("vdr_quick")  # presets/vdr_quick.json


# ------------------------------------------------------------------------ image inputs


# ------------------------------------------------------------------------------ models


def _new_model(cfg: VDRRunConfig, image_dim: int, bow: bool) -> VDRModel:
    overrides: dict[str, Any] = {"bow": bow, "text_top_k": max((*cfg.ks, cfg.top_k))}
    overrides["image_top_k"] = overrides["text_top_k"]
    if cfg.init is None:
        return VDRModel.from_minilm(image_dim=image_dim, **overrides)
    return VDRModel.from_bert(cfg.init, image_dim=image_dim, **overrides)


def train_or_load(
    out_dir: Path,
    data: CrossModalData,
    cfg: VDRRunConfig,
    bow: bool,
    adapter_init: tuple[np.ndarray, np.ndarray] | None = None,
    progress: bool = False,
) -> tuple[VDRModel, dict[str, Any]]:
    """Train (or resume / reload) one VDR model in ``out_dir``; returns it and run facts.

    A fresh run calibrates the head biases on ``cfg.calibration_size`` training texts and
    items and, when given, sets the patch adapter to ``adapter_init`` (W (d_img, h), b (h,)).
    The model's codes are encoded at k = max(ks) and re-sparsified per k.
    """
    model = _new_model(cfg, data.patches.shape[2], bow)
    model.head_dtype = _head_dtype(cfg)
    info: dict[str, Any] = {"bow": bow, "folder": str(out_dir)}
    if not has_checkpoint(out_dir):
        if adapter_init is not None:
            assert model.image_adapter is not None
            w, b = adapter_init
            with torch.no_grad():
                model.image_adapter.weight.copy_(torch.from_numpy(w.T.copy()))
                model.image_adapter.bias.copy_(torch.from_numpy(b))
        n = cfg.calibration_size
        rng = np.random.default_rng(cfg.seed)
        pick = np.sort(rng.permutation(len(data))[:n])
        items = np.unique(data.pair_item[pick])
        offsets = model.calibrate(
            [data.texts[i] for i in pick],
            np.asarray(data.patches[items], dtype=np.float32),
            None if data.patch_mask is None else data.patch_mask[items],
            rank=cfg.top_k,
        )
        write_json(out_dir / "calibration.json", offsets)
    if (out_dir / "calibration.json").is_file():
        info["calibration"] = read_json(out_dir / "calibration.json")
    tc = preset_train_config(
        "cross",
        max_steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        new_params_lr=cfg.new_params_lr,
        freeze_layers=cfg.freeze_layers,
        seed=cfg.seed,
        checkpoint_every=max(10, cfg.steps // 4),
        log_every=max(1, min(10, cfg.steps)),
    )
    t0 = time.perf_counter()
    model, history = train_vdr(model, data, out_dir, tc, resume=True, progress=progress)
    info.update(
        {
            "train": dataclasses.asdict(tc),
            "pairs": len(data),
            "seconds": round(time.perf_counter() - t0, 1),
            "first": history[0] if history else None,
            "last": history[-1] if history else None,
            "train_seconds": history[-1]["seconds"] if history else None,
        }
    )
    return model, info


def _head_dtype(cfg: VDRRunConfig) -> torch.dtype:
    use = fast_bf16_available() if cfg.bf16 is None else cfg.bf16
    return torch.bfloat16 if use else torch.float32


class VDRCodes:
    """One model's codes, encoded once at ``k_max`` and re-sparsified to any k <= k_max.

    Texts are cached by string (their BoW too), so the retrieval table, the exclusion
    strategies and the k ablation share one encoding per text. With ``cache_dir`` the item
    and text codes are also kept on disk (``codes_cache/``, keyed by the model weights and
    the inputs), so a re-run of a report skips the encoding.
    """

    def __init__(
        self,
        model: VDRModel,
        k_max: int,
        progress: bool = False,
        cache_dir: str | Path | None = None,
    ) -> None:
        self.model = model
        self.k_max = int(k_max)
        self.progress = progress
        self._text: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.items_max: sp.csr_matrix | None = None
        self.cache = None if cache_dir is None else Path(cache_dir) / "codes_cache"
        self._model_key = ""
        if self.cache is not None:
            h = hashlib.sha256(str(self.k_max).encode())
            for k, v in sorted(model.state_dict().items()):
                h.update(k.encode())
                h.update(v.detach().float().contiguous().numpy().tobytes())
            self._model_key = h.hexdigest()
            self._load_texts()

    # -- disk cache ------------------------------------------------------------------------
    def _load_texts(self) -> None:
        assert self.cache is not None
        meta = self.cache / "texts.json"
        if not meta.is_file() or read_json(meta).get("model") != self._model_key:
            return
        texts = read_json(meta)["texts"]
        codes, bows = load_csr(self.cache / "texts.npz"), load_csr(self.cache / "texts_bow.npz")
        for i, t in enumerate(texts):
            lo, hi = codes.indptr[i], codes.indptr[i + 1]
            blo, bhi = bows.indptr[i], bows.indptr[i + 1]
            self._text[t] = (codes.indices[lo:hi], codes.data[lo:hi], bows.indices[blo:bhi])

    def save(self) -> None:
        """Write the text codes encoded so far to the disk cache (no-op without one)."""
        if self.cache is None or not self._text:
            return
        texts = list(self._text)
        v = self.model.config.vocab_size
        rows = [self._text[t] for t in texts]
        save_csr(self.cache / "texts.npz", _stack([(r[0], r[1]) for r in rows], v))
        bows = _stack([(r[2], np.ones(len(r[2]), np.float32)) for r in rows], v)
        save_csr(self.cache / "texts_bow.npz", bows)
        write_json(self.cache / "texts.json", {"model": self._model_key, "texts": texts})

    # -- items -----------------------------------------------------------------------------
    def encode_items(
        self, patches: np.ndarray, mask: np.ndarray | None, rows: np.ndarray | None = None
    ) -> sp.csr_matrix:
        """Codes of every item (rows (n_items, V)); only ``rows`` are encoded when given, the
        others stay empty (quick runs score a few items of each split)."""
        key = ""
        if self.cache is not None:
            h = hashlib.sha256(self._model_key.encode())
            h.update(str(patches.shape).encode())
            h.update(np.ascontiguousarray(patches).tobytes())
            h.update(b"" if mask is None else np.ascontiguousarray(mask).tobytes())
            h.update(b"all" if rows is None else np.asarray(rows).tobytes())
            key = h.hexdigest()
            meta = self.cache / "items.json"
            if meta.is_file() and read_json(meta).get("key") == key:
                self.items_max = load_csr(self.cache / "items.npz")
                return self.items_max
        if rows is None:
            self.items_max = self.model.encode_image(
                patches, mask, top_k=self.k_max, progress=self.progress
            )
        else:
            part = self.model.encode_image(
                patches[rows], None if mask is None else mask[rows], top_k=self.k_max
            )
            place = sp.csr_matrix(
                (np.ones(len(rows), np.float32), (np.asarray(rows), np.arange(len(rows)))),
                shape=(len(patches), len(rows)),
            )
            self.items_max = sp.csr_matrix(place @ part)
        if self.cache is not None:
            save_csr(self.cache / "items.npz", self.items_max)
            write_json(self.cache / "items.json", {"key": key})
        return self.items_max

    def items(self, k: int) -> sp.csr_matrix:
        if self.items_max is None:
            raise SparsemmError("encode the items first")
        return resparsify(self.items_max, k)

    # -- texts -----------------------------------------------------------------------------
    def texts(self, texts: Sequence[str], k: int) -> sp.csr_matrix:
        missing = [t for t in dict.fromkeys(texts) if t not in self._text]
        if missing:
            codes = self.model.encode_text(missing, top_k=self.k_max, progress=self.progress)
            bows = self.model.text_bow(missing)
            for i, t in enumerate(missing):
                lo, hi = codes.indptr[i], codes.indptr[i + 1]
                blo, bhi = bows.indptr[i], bows.indptr[i + 1]
                self._text[t] = (
                    codes.indices[lo:hi].copy(),
                    codes.data[lo:hi].copy(),
                    bows.indices[blo:bhi].copy(),
                )
            if len(missing) > 100:
                self.save()
        v = self.model.config.vocab_size
        rows = [self._text[t] for t in texts]
        full = _stack([(r[0], r[1]) for r in rows], v)
        bow = (
            _stack([(r[2], np.ones(len(r[2]), np.float32)) for r in rows], v)
            if self.model.config.bow
            else None
        )
        return resparsify(full, k, bow)

    def query_coder(self, k: int) -> QueryCoder:
        def code(emb: np.ndarray, texts: Sequence[str]) -> sp.csr_matrix:
            return self.texts(list(texts), k)

        return code


def _stack(rows: Sequence[tuple[np.ndarray, np.ndarray]], dim: int) -> sp.csr_matrix:
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(r[0]) for r in rows])
    if rows:
        ind = np.concatenate([r[0] for r in rows]).astype(np.int32)
        dat = np.concatenate([r[1] for r in rows]).astype(np.float32)
    else:
        ind, dat = np.zeros(0, np.int32), np.zeros(0, np.float32)
    return sp.csr_matrix((dat, ind, indptr), shape=(len(rows), dim))


# ------------------------------------------------------------------------- analysis


def laziness_stats(
    codes: sp.csr_matrix,
    tokens: Sequence[str],
    caption_bow: sp.csr_matrix,
    top: int = 100,
) -> dict[str, Any]:
    """The "disentanglement laziness" check on encoded test items.

    codes (n, V) item codes; caption_bow (n, V) binary tokens of each item's captions.
    Returns the per-token mean values' top ``top`` tokens with their means and per-item
    values, how many items activate each of them (ubiquity: a lazy token is on for nearly
    every item), the share of each item's L1 mass on tokens its captions contain
    (grounding), and the number of distinct active tokens.
    """
    codes = sp.csr_matrix(codes, dtype=np.float32)
    n = codes.shape[0]
    mean = np.asarray(codes.mean(axis=0)).ravel()
    order = np.argsort(-mean, kind="stable")[:top]
    sub = codes[:, order].toarray()
    active_share = (sub > 0).mean(axis=0)
    grounded = np.asarray(codes.multiply(caption_bow > 0).sum(axis=1)).ravel()
    mass = np.asarray(abs(codes).sum(axis=1)).ravel()
    top_caption_share = float(
        np.mean([caption_bow[:, j].getnnz() / max(n, 1) for j in order[: min(20, top)]])
    )
    return {
        "n_items": n,
        "top_tokens": [tokens[j] for j in order],
        "top_means": [float(mean[j]) for j in order],
        "top_values": sub,  # (n, top), not JSON: for the box plot
        "mean_items_active_top100": float(active_share.mean()),
        "grounding_mass_share": float(np.mean(grounded / np.maximum(mass, 1e-12))),
        "distinct_active_tokens": int(np.unique(codes.indices).size),
        "top20_caption_frequency": top_caption_share,
    }


def save_word_cloud(weights: Mapping[str, float], path: str | Path, title: str = "") -> Path:
    """A word cloud PNG of token weights (larger weight, larger word)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from wordcloud import WordCloud

    positive = {t: float(w) for t, w in weights.items() if w > 0}
    if not positive:
        raise SparsemmError("no positive weights to draw")
    wc = WordCloud(width=800, height=400, background_color="white", random_state=0)
    img = wc.generate_from_frequencies(positive).to_array()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    ax.imshow(img, interpolation="bilinear")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    out = Path(path)
    with atomic_open(out, "wb") as fh:
        fig.savefig(fh, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out


def save_box_plot(
    values: np.ndarray, labels: Sequence[str], path: str | Path, title: str = ""
) -> Path:
    """Box plot PNG of per-item values (n, m) of m tokens (one box per token)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(8.0, 0.16 * len(labels)), 4))
    ax.boxplot(np.asarray(values), showfliers=False, widths=0.6)
    ax.set_xticks(np.arange(1, len(labels) + 1))
    ax.set_xticklabels(list(labels), rotation=90, fontsize=6)
    ax.set_ylabel("value in item code")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    with atomic_open(out, "wb") as fh:
        fig.savefig(fh, format="png", dpi=90)
    plt.close(fig)
    return out


def index_examples(
    out_dir: Path,
    model: VDRModel,
    codes: VDRCodes,
    item_codes: sp.csr_matrix,
    ids: Sequence[str],
    captions: Sequence[Sequence[str]],
    queries: Sequence[str],
    k: int,
    hits: int = 3,
) -> list[dict[str, Any]]:
    """Index the items' unit-normalised codes and explain the top hits of ``queries``.

    The index scores by inner product, so with unit rows it ranks by cosine; each hit's
    per-token contributions (query token value x item token value) sum to its index score
    (``max_abs_gap`` records the largest difference seen).
    """
    units = sp.csr_matrix(normalize_rows(item_codes), dtype=np.float32)
    index = InvertedIndex.build(
        out_dir,
        units,
        list(ids),
        overwrite=True,
        meta={"model_type": "vdr", "top_k": k, "vocab": "token ids of the model's tokenizer"},
    )
    out = []
    for q in queries:
        qc = sp.csr_matrix(normalize_rows(codes.texts([q], k)), dtype=np.float32)
        res = index.search(qc, k=hits)
        entry: dict[str, Any] = {"query": q, "query_top_tokens": model.top_tokens(qc, 10)}
        rows = []
        for row, rid, score in zip(res.rows, res.ids, res.scores, strict=True):
            ex = explain_pair(qc, units[int(row)], model.tokens)
            rows.append(
                {
                    "id": rid,
                    "score": float(score),
                    "sum_of_contributions": ex.score,
                    "max_abs_gap": abs(ex.score - float(score)),
                    "caption": captions[int(row)][0] if captions[int(row)] else "",
                    "contributions": [(c.token, round(c.contribution, 4)) for c in ex.top(8)],
                    "item_top_tokens": [
                        (t, round(v, 4)) for t, v in model.top_tokens(units[int(row)], 10)
                    ],
                }
            )
        entry["hits"] = rows
        out.append(entry)
    return out


# ------------------------------------------------------------------------ one dataset


def fix_paper_params(params: Mapping[str, Any]) -> str:
    """Register the ``paper`` strategy under :data:`FIXED_PAPER` with ``params`` as its
    defaults and no tuning grid (ablations reuse the main model's choice); returns the name."""
    spec = get_spec("paper")
    fixed = {**spec.defaults, **params}
    desc = "sparse: SR paper two-step, parameters fixed to the main VDR run's " + ", ".join(
        f"{k}={v}" for k, v in fixed.items()
    )
    register_strategy(FIXED_PAPER, spec.cls, desc, **fixed)
    return FIXED_PAPER


def _means(content: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """{subset: {method: {metric: mean}}} of a benchmark's metrics.json content."""
    return {s: dict(v["means"]) for s, v in content["subsets"].items()}


def _retrieval(content: Mapping[str, Any], which: str) -> dict[str, float] | None:
    row = content.get("retrieval", {}).get(which)
    return None if row is None else {k: float(v) for k, v in row.items()}


def _sr_coders(
    sr_model: Any, collection: Collection, text_encoder: Any
) -> tuple[sp.csr_matrix, QueryCoder]:
    """SR codes of every collection item (from its raw image embeddings, not the dense
    strategies' possibly aligned ones) and a query coder over the raw text backbone."""
    base = getattr(text_encoder, "base", text_encoder)
    items = sp.csr_matrix(sr_model.encode(collection.image_embeddings(), "image"))
    return items, sr_query_coder(sr_model, text_encoder=base)


def run_dataset(
    name: str,
    collection: Collection,
    out_dir: str | Path,
    text_encoder: TextEncoder,
    patches: np.ndarray,
    patch_mask: np.ndarray | None,
    cfg: VDRRunConfig,
    adapter_init: tuple[np.ndarray, np.ndarray] | None = None,
    dense_items: np.ndarray | None = None,
    dense_texts: np.ndarray | None = None,
    sr_model: Any = None,
    example_queries: Sequence[str] = (),
    progress: bool = False,
    leave_one_out: bool = False,
) -> dict[str, Any]:
    """Train/evaluate VDR on one collection; returns this dataset's metrics (JSON-able).

    ``leave_one_out``: the patches are the items' caption embeddings (caption-proxy); a
    training caption's own embedding is hidden from its item (see :func:`cross_modal_data`).
    """
    out = Path(out_dir)
    t0 = time.perf_counter()
    data = cross_modal_data(
        collection, "train", patches, patch_mask, cfg.max_train_pairs, leave_one_out
    )
    result: dict[str, Any] = {"dataset": name, "collection": str(collection.root)}
    k_max = max((*cfg.ks, cfg.top_k))
    bench_base = BenchConfig(limit_items=cfg.limit_items, max_grid=cfg.max_grid, seed=cfg.seed)
    captions = [list(it.get("captions") or []) for it in collection.items]
    test_rows = np.flatnonzero(collection.split_mask("test"))
    rows: np.ndarray | None = None
    if cfg.limit_items:
        test_rows = test_rows[: cfg.limit_items]
        train_rows = np.flatnonzero(collection.split_mask("train"))[: cfg.limit_items]
        rows = np.union1d(test_rows, train_rows)

    def bench(
        sub: str, methods: Sequence[str], item_codes: Any, query: QueryCoder, info: Mapping
    ) -> dict[str, Any]:
        content = run_exclusion_bench(
            collection,
            out / sub,
            text_encoder,
            item_codes=item_codes,
            dense_items=dense_items,
            dense_texts=dense_texts,
            query_coder=query,
            config=dataclasses.replace(bench_base, methods=tuple(methods)),
            run_info={"dataset": name, **info},
        )
        return {
            "means": _means(content),
            "n_queries": {s: v["n_queries"] for s, v in content["subsets"].items()},
            "dense_retrieval": _retrieval(content, "dense"),
            "sparse_retrieval": _retrieval(content, "sparse"),
            "chosen": content.get("tuning", {}).get("chosen", {}),
            "seconds": content.get("seconds", {}).get("total"),
        }

    # 1. the main model (BoW entry on), zero-shot and trained
    models: dict[str, tuple[VDRModel, dict[str, Any]]] = {}
    variants = [("vdr", True)] + ([("vdr_nobow", False)] if cfg.ablate_bow else [])
    for tag, bow in variants:
        models[tag] = train_or_load(out / tag, data, cfg, bow, adapter_init, progress)
    result["training"] = {tag: info for tag, (_, info) in models.items()}

    codes: dict[str, VDRCodes] = {}
    for tag, (model, _) in models.items():
        c = VDRCodes(model, k_max, progress, cache_dir=out / tag)
        c.encode_items(patches, patch_mask, rows)
        codes[tag] = c
    main = codes["vdr"]
    all_codes = list(codes.values())
    info = {"sparse_model_name": f"VDR (top-{cfg.top_k} of |V|)", "vdr": str(out / "vdr")}
    result["main"] = bench(
        "bench", cfg.methods, main.items(cfg.top_k), main.query_coder(cfg.top_k), info
    )
    result["paper_fixed"] = get_spec(
        fix_paper_params(result["main"]["chosen"].get("paper", {}))
    ).defaults

    # 2. zero-shot: the same initialisation (calibrated heads), no training steps
    zs_model = _new_model(cfg, patches.shape[2], True)
    zs_model.head_dtype = _head_dtype(cfg)
    if adapter_init is not None and zs_model.image_adapter is not None:
        with torch.no_grad():
            zs_model.image_adapter.weight.copy_(torch.from_numpy(adapter_init[0].T.copy()))
            zs_model.image_adapter.bias.copy_(torch.from_numpy(adapter_init[1]))
    calib = result["training"]["vdr"].get("calibration")
    if cfg.zero_shot and isinstance(calib, Mapping):
        with torch.no_grad():
            zs_model.text_bias.fill_(-float(calib["text"]))
            if zs_model.image_bias is not None:
                zs_model.image_bias.fill_(-float(calib["image"]))
        zs = VDRCodes(zs_model, k_max, progress, cache_dir=out / "zero_shot")
        zs.encode_items(patches, patch_mask, rows)
        all_codes.append(zs)
        result["zero_shot"] = bench(
            "bench_zero_shot",
            ABLATION_METHODS,
            zs.items(cfg.top_k),
            zs.query_coder(cfg.top_k),
            {"sparse_model_name": "VDR zero-shot (calibrated MiniLM head, no training)"},
        )

    # 3. SR on the same queries, when given
    if sr_model is not None:
        sr_items, sr_query = _sr_coders(sr_model, collection, text_encoder)
        result["sr"] = bench(
            "bench_sr",
            cfg.methods,
            sr_items,
            sr_query,
            {"sparse_model_name": f"SR (d={sr_model.config.latent_dim})"},
        )

    # 4. k ablation (retrieval + exclusion; `paper` keeps the main run's parameters). At the
    # main k the main run already has every number (its `paper` is the same strategy).
    result["k_ablation"] = {}
    for k in cfg.ks:
        if k == cfg.top_k and "paper" in cfg.methods and "code_a" in cfg.methods:
            keep = {"avg_emb_0.5": "avg_emb_0.5", "code_a": "code_a", "paper": FIXED_PAPER}
            r = dict(result["main"])
            r["means"] = {
                sub: {keep[m]: v for m, v in means.items() if m in keep}
                for sub, means in result["main"]["means"].items()
            }
            r["from_main_run"] = True
            result["k_ablation"][str(k)] = r
            continue
        r = bench(
            f"bench_k{k}",
            ABLATION_METHODS,
            main.items(k),
            main.query_coder(k),
            {"sparse_model_name": f"VDR top-{k}"},
        )
        result["k_ablation"][str(k)] = r

    # 5. BoW on/off: effectiveness and the laziness check on the test items
    cap_bow = models["vdr"][0].text_bow([" ".join(captions[r]) for r in test_rows])
    result["laziness"] = {}
    for tag, (model, _) in models.items():
        item_codes = codes[tag].items(cfg.top_k)[test_rows]
        stats = laziness_stats(item_codes, model.tokens, cap_bow)
        values = stats.pop("top_values")
        cloud = save_word_cloud(
            dict(zip(stats["top_tokens"], stats["top_means"], strict=True)),
            out / f"laziness_{tag}_cloud.png",
            f"{name}: {tag} top-100 tokens by mean value over test items",
        )
        box = save_box_plot(
            values,
            stats["top_tokens"],
            out / f"laziness_{tag}_box.png",
            f"{name}: {tag} value distribution of the top-100 tokens",
        )
        stats["top_tokens"] = stats["top_tokens"][:30]
        stats["top_means"] = [round(v, 5) for v in stats["top_means"][:30]]
        stats["plots"] = {"cloud": cloud.name, "box": box.name}
        result["laziness"][tag] = stats
        if tag != "vdr":
            result[f"{tag}_bench"] = bench(
                f"bench_{tag}",
                ABLATION_METHODS,
                codes[tag].items(cfg.top_k),
                codes[tag].query_coder(cfg.top_k),
                {"sparse_model_name": f"VDR without BoW (top-{cfg.top_k})"},
            )

    # 6. explanations of index search results
    model = models["vdr"][0]
    ids = [collection.ids[r] for r in test_rows]
    result["examples"] = index_examples(
        out / "index",
        model,
        main,
        main.items(cfg.top_k)[test_rows],
        ids,
        [captions[r] for r in test_rows],
        list(example_queries),
        cfg.top_k,
    )
    if result["examples"] and result["examples"][0]["hits"]:
        top = result["examples"][0]["hits"][0]
        weights = dict(top["item_top_tokens"])
        save_word_cloud(weights, out / "example_item_cloud.png", f"item {top['id']}")
        result["example_cloud"] = "example_item_cloud.png"
    for c in all_codes:
        c.save()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


# ------------------------------------------------------------------------- the report


def _fmt_pair(means: Mapping[str, Any], method: str, metric: str) -> str:
    try:
        a = means["all"][method][metric]
        h = means["hard"][method][metric]
    except KeyError:
        return "–"
    return f"{a:.3f} / {h:.3f}"


def _exclusion_rows(res: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    rows: list[tuple[str, Mapping[str, Any], str]] = []
    main = res["main"]["means"]
    for m in main.get("all", {}):
        label = "dense" if not m.startswith(("code", "paper", "filter", "penalty")) else "VDR"
        rows.append((f"{label}: `{m}`", main, m))
    if "sr" in res:
        for m in res["sr"]["means"].get("all", {}):
            if m.startswith(("code", "paper", "filter", "penalty")):
                rows.append((f"SR: `{m}`", res["sr"]["means"], m))
    for key, label in (("zero_shot", "VDR zero-shot"), ("vdr_nobow_bench", "VDR without BoW")):
        if key in res:
            means = res[key]["means"]
            rows.append((f"{label}: `code_a`", means, "code_a"))
            rows.append((f"{label}: `paper` (main run's parameters)", means, FIXED_PAPER))
    return rows


def _retr(row: Mapping[str, float] | None) -> str:
    if not row:
        return "– | –"
    i2t = " / ".join(f"{row[f'i2t_AP@{k}']:.3f}" for k in (1, 5, 10))
    t2i = " / ".join(f"{row[f't2i_AP@{k}']:.3f}" for k in (1, 5, 10))
    return f"{i2t} | {t2i}"


def render_vdr_report(metrics: Mapping[str, Any]) -> str:
    """report.md of ``sparsemm bench vdr`` from its metrics.json content."""
    lines = [
        "# VDR: vocabulary-space disentangled retrieval (offline runs)",
        "",
        f"Commit: `{metrics.get('git_commit', 'unknown')}`; run config: `config.json`.",
        "",
    ]
    cfg = metrics.get("config", {})
    lines += [
        f"Scale: {cfg.get('steps')} training steps of batch {cfg.get('batch_size')} per model, "
        f"lr {cfg.get('lr')} (new parts {cfg.get('new_params_lr')}), lower "
        f"{cfg.get('freeze_layers')} of 6 MiniLM layers frozen, top-k {cfg.get('top_k')}, "
        f"{cfg.get('threads')} torch thread(s), projection dtype {metrics.get('head_dtype')}.",
        "",
    ]
    for name, res in metrics.get("datasets", {}).items():
        lines += [f"## {name} (`{res['collection']}`)", ""]
        nq = res["main"]["n_queries"]
        lines += [
            f"### Exclusion queries 'A but not B' (test; {nq.get('all')} queries, "
            f"{nq.get('hard')} hard; all / hard)",
            "",
            *md_table(
                ["method", *TABLE_METRICS],
                [
                    [label, *(_fmt_pair(means, m, met) for met in TABLE_METRICS)]
                    for label, means, m in _exclusion_rows(res)
                ],
            ),
        ]
        lines += ["", "### Image-text retrieval (test; AP@1 / AP@5 / AP@10)", ""]

        def nnz(r: Mapping[str, Any] | None) -> str:
            return f"{r['nnz_image']:.0f} / {r['nnz_text']:.0f}" if r else "–"

        def cells(label: str, r: Mapping[str, float] | None, size: str) -> list[str]:
            return [label, *_retr(r).split(" | "), size]  # _retr: "i2t | t2i"

        retrieval = [cells("dense", res["main"]["dense_retrieval"], "dense")]
        for label, key in (("VDR", "main"), ("SR", "sr"), ("VDR zero-shot", "zero_shot")):
            if key in res:
                r = res[key]["sparse_retrieval"]
                retrieval.append(cells(label, r, nnz(r)))
        if "vdr_nobow_bench" in res:
            r = res["vdr_nobow_bench"]["sparse_retrieval"]
            retrieval.append(cells("VDR without BoW", r, nnz(r)))
        header = ["representation", "image-to-text", "text-to-image", "nnz image / text"]
        lines += md_table(header, retrieval)
        fixed = ", ".join(f"{k}={v}" for k, v in res.get("paper_fixed", {}).items())
        lines += [
            "",
            "### Effectiveness vs active dimensions k",
            "",
            f"Items and queries re-sparsified to k; `paper` keeps the main run's parameters "
            f"({fixed}).",
            "",
        ]
        k_rows = []
        for k, r in res["k_ablation"].items():
            sr_ = r["sparse_retrieval"] or {}
            k_rows.append(
                [
                    k,
                    nnz(sr_),
                    f"{sr_.get('t2i_AP@1', float('nan')):.3f}",
                    f"{sr_.get('i2t_AP@10', float('nan')):.3f}",
                    _fmt_pair(r["means"], "code_a", "ap@10"),
                    _fmt_pair(r["means"], FIXED_PAPER, "ap@10"),
                    _fmt_pair(r["means"], FIXED_PAPER, "violation@10"),
                ]
            )
        header = [
            "k",
            "nnz image / text",
            "t2i AP@1",
            "i2t AP@10",
            "code_a AP@10 (all / hard)",
            "paper AP@10",
            "paper violation@10",
        ]
        lines += md_table(header, k_rows, "rllllll")
        lines += ["", "### Non-parametric (bag-of-words) entry on vs off", ""]
        header = [
            "model",
            "mean share of items activating a top-100 token",
            "grounding (L1 mass on the item's caption tokens)",
            "distinct active tokens",
            "top-20 tokens' caption frequency",
            "top tokens by mean value",
        ]
        lazy_rows = [
            [
                tag,
                f"{st['mean_items_active_top100']:.3f}",
                f"{st['grounding_mass_share']:.3f}",
                st["distinct_active_tokens"],
                f"{st['top20_caption_frequency']:.3f}",
                ", ".join(st["top_tokens"][:12]),
            ]
            for tag, st in res["laziness"].items()
        ]
        lines += md_table(header, lazy_rows)
        lines.append("")
        for tag, st in res["laziness"].items():
            lines.append(f"![{tag} cloud]({name}/{st['plots']['cloud']})")
            lines.append(f"![{tag} box]({name}/{st['plots']['box']})")
        lines += ["", "### Training", ""]
        for tag, tr in res["training"].items():
            first, last = tr.get("first") or {}, tr.get("last") or {}
            lines.append(
                f"- {tag}: {tr.get('pairs')} pairs, loss {first.get('loss', float('nan')):.3f}"
                f" -> {last.get('loss', float('nan')):.3f}, in-batch acc "
                f"{first.get('acc', float('nan')):.3f} -> {last.get('acc', float('nan')):.3f}, "
                f"{tr.get('train_seconds')} s; head calibration {tr.get('calibration')}"
            )
        lines += [
            "",
            "### Explanations (index search, unit codes: contributions sum to the score)",
            "",
        ]
        for ex in res.get("examples", []):
            qtok = ", ".join(t for t, _ in ex["query_top_tokens"][:6])
            lines.append(f"- query **{ex['query']}** (top tokens: {qtok})")
            for h in ex["hits"]:
                parts = ", ".join(f"{t} {v:+.3f}" for t, v in h["contributions"][:6])
                lines.append(
                    f"  - {h['id']} score {h['score']:.3f} (sum of contributions "
                    f'{h["sum_of_contributions"]:.3f}): {parts} — "{h["caption"]}"'
                )
        if res.get("example_cloud"):
            lines.append(f"\n![item word cloud]({name}/{res['example_cloud']})")
        lines += ["", f"Dataset wall time: {res.get('seconds')} s.", ""]
    lines += [f"Total wall time: {metrics.get('seconds')} s.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------- entry


PROXY_EXAMPLES = ("a dog on a couch", "pizza on a plate", "a man riding a surfboard")
COLLAGE_EXAMPLES = ("two sneakers and a bag", "a dress", "ankle boots")


def run_vdr_bench(
    out_dir: str | Path,
    datasets: Mapping[str, Mapping[str, Any]],
    cfg: VDRRunConfig | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run every dataset of ``datasets`` and write the report folder ``out_dir``.

    ``datasets[name]`` holds ``collection``, ``text_encoder``, ``patches``, ``patch_mask``
    and optionally ``adapter_init``, ``dense_items``, ``dense_texts``, ``sr_model``,
    ``examples``, ``leave_one_out``, ``info`` (see :func:`run_dataset`). Returns the
    metrics.json content.
    """
    cfg = cfg or VDRRunConfig()
    out = Path(out_dir)
    t0 = time.perf_counter()
    metrics: dict[str, Any] = {
        "format": "sparsemm.vdr_bench",
        "git_commit": git_commit(),
        "config": dataclasses.asdict(cfg),
        "head_dtype": str(_head_dtype(cfg)).replace("torch.", ""),
        "datasets": {},
    }
    write_json(
        out / "config.json",
        {**metrics, "datasets": {k: dict(v.get("info", {})) for k, v in datasets.items()}},
    )
    with torch_threads(cfg.threads):
        for name, spec in datasets.items():
            log.info("VDR bench: %s", name)
            metrics["datasets"][name] = run_dataset(
                name,
                spec["collection"],
                out / name,
                spec["text_encoder"],
                spec["patches"],
                spec.get("patch_mask"),
                cfg,
                adapter_init=spec.get("adapter_init"),
                dense_items=spec.get("dense_items"),
                dense_texts=spec.get("dense_texts"),
                sr_model=spec.get("sr_model"),
                example_queries=spec.get("examples", ()),
                progress=progress,
                leave_one_out=bool(spec.get("leave_one_out", False)),
            )
    metrics["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(out / "metrics.json", metrics)
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(render_vdr_report(metrics))
    return metrics
