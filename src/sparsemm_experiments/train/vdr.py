"""Training loop for VDR (one plain function; step-resumable; deterministic on CPU).

Objective (VDR, Zhou et al. ICLR 2024, Sec. 3; in-batch InfoNCE, both directions): with q
the query side (texts) and d the document side (images, or texts in the text-to-text
setting), each as a dense vector ``full`` (elu1p, optionally L2-normalised) and its sparse
code ``sparse`` = full * (TopK OR BoW),

    L = mean over the terms present of  CE_sym(a, b) = 1/2 [CE(a b^T / tau) + CE(b a^T / tau)]
        (q.sparse, d.full), (q.full, d.sparse)          parametric
        (BoW(q), d.full), (q.full, BoW(d))              the non-parametric entry (if bow)

The BoW terms are what VDR calls the non-parametric entry during training: the document
encoder must put mass on the tokens the query actually contains (and vice versa), which
keeps dimensions tied to their words (without them, codes drift to whatever tokens are
convenient: "disentanglement laziness"). BoW(d) exists only for text documents. Rows that
share an item (several captions of one image in a batch) are not negatives of each other.
Text-to-text batches may carry hard negatives: extra document columns for q -> d.

Hyper-parameters (VDR's table) are in :data:`VDR_PRESETS`; the CPU runs scale batch size
and steps down (see :class:`VDRTrainConfig`, docs/vdr.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import check_output_dir, write_json
from sparsemm.train.checkpoint import (
    checkpoint_due,
    has_checkpoint,
    resume_checkpoint,
    save_checkpoint,
)
from sparsemm.train.loop import epoch_permutation, stop_if_diverged
from sparsemm_experiments.models.vdr import VDRModel, sparsify

log = logging.getLogger(__name__)

# VDR's published training settings (paper, appendix table), before CPU scaling.
VDR_PRESETS: dict[str, dict[str, Any]] = {
    "t2t": {
        "batch_size": 256,
        "lr": 2e-5,
        "warmup_epochs": 1,
        "schedule": "linear",
        "normalize": False,
        "tau": 1.0,
        "hard_negatives": 1,
        "max_length": 256,
        "top_k": 768,
    },
    "cross": {
        "batch_size": 4096,
        "lr": 2e-4,
        "warmup_epochs": 1,
        "schedule": "cosine",
        "normalize": True,
        "tau": 0.07,
        "hard_negatives": 0,
        "max_length": 77,
        "top_k": 512,
    },
}


@dataclass(frozen=True)
class VDRTrainConfig:
    mode: str = "cross"  # "cross" (text vs image patches) | "t2t" (query vs document texts)
    epochs: int = 1  # passes over the pairs (VDR: tens; CPU runs cap with max_steps)
    max_steps: int | None = None  # stop after this many updates (minutes on 2 cores)
    batch_size: int = 32  # in-batch negatives (VDR: 4096 cross-modal, 256 t2t)
    lr: float = 2e-4  # AdamW for pretrained weights (VDR: 2e-4 cross-modal, 2e-5 t2t)
    new_params_lr: float | None = None  # lr of new parts (adapter, LayerNorms); None: lr
    warmup_fraction: float = 0.1  # VDR warms up 1 epoch of its run; here a share of the steps
    schedule: str = "cosine"  # decay after warm-up: "cosine" (cross-modal) | "linear" (t2t)
    tau: float = 0.07  # temperature (VDR: 0.07 cross-modal; 1.0 = none, t2t)
    freeze_layers: int = 3  # lower transformer layers kept frozen (CPU: backward cost)
    train_embeddings: bool = False  # train the word embeddings = the vocabulary projection
    weight_decay: float = 0.0
    max_grad_norm: float = 2.0  # gradient clipping (0: none)
    seed: int = 0  # order of the pairs and dropout
    checkpoint_every: int = 50  # steps between checkpoints
    log_every: int = 10  # steps per history record

    def __post_init__(self) -> None:
        if self.mode not in ("cross", "t2t"):
            raise SparsemmError(f"VDR training mode must be 'cross' or 't2t', not {self.mode!r}")
        if self.schedule not in ("cosine", "linear"):
            raise SparsemmError("schedule must be 'cosine' or 'linear'")
        if self.batch_size < 2:
            raise SparsemmError("batch_size must be at least 2 (InfoNCE needs in-batch negatives)")
        if self.epochs < 1 or (self.max_steps is not None and self.max_steps < 1):
            raise SparsemmError("epochs and max_steps must be at least 1")
        if not (self.lr > 0 and self.tau > 0 and self.weight_decay >= 0):  # NaN too
            raise SparsemmError("lr and tau must be positive, weight_decay non-negative")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise SparsemmError("warmup_fraction must be in [0, 1)")
        if self.checkpoint_every < 1 or self.log_every < 1 or self.freeze_layers < 0:
            raise SparsemmError("checkpoint_every/log_every >= 1 and freeze_layers >= 0")


def preset_train_config(mode: str, **overrides: Any) -> VDRTrainConfig:
    """A :class:`VDRTrainConfig` with VDR's lr / schedule / tau for ``mode``, then overrides."""
    if mode not in VDR_PRESETS:
        raise SparsemmError(f"unknown VDR mode {mode!r}; use cross or t2t")
    p = VDR_PRESETS[mode]
    base = {"mode": mode, "lr": p["lr"], "schedule": p["schedule"], "tau": p["tau"]}
    return VDRTrainConfig(**{**base, **overrides})


# ------------------------------------------------------------------------------- data


@dataclass
class CrossModalData:
    """(caption, image) pairs: ``texts[j]`` describes item ``pair_item[j]``.

    patches (n_items, P, d_img) float (the frozen image side's input, cached once);
    patch_mask (n_items, P) bool marks real patches (ragged sets) or None. ``hide_patch[j]``
    (or -1) is a patch of item ``pair_item[j]`` left out while pair j trains: on the
    caption-proxy an item's patches are its captions' embeddings, and without leave-one-out
    a caption would be matched to its own copy instead of to the item's other captions.
    """

    texts: list[str]
    pair_item: np.ndarray
    patches: np.ndarray
    patch_mask: np.ndarray | None = None
    hide_patch: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.pair_item = np.asarray(self.pair_item, dtype=np.int64)
        if len(self.texts) != len(self.pair_item):
            raise SparsemmError("pair_item must have one entry per caption")
        if self.patches.ndim != 3:
            raise SparsemmError(f"patches must be (n_items, P, d), got {self.patches.shape}")
        if len(self.pair_item) and (
            self.pair_item.min() < 0 or self.pair_item.max() >= len(self.patches)
        ):
            raise SparsemmError("pair_item points outside the patch array")
        if self.patch_mask is not None and self.patch_mask.shape != self.patches.shape[:2]:
            raise SparsemmError("patch_mask must have shape (n_items, P)")
        if self.hide_patch is not None:
            self.hide_patch = np.asarray(self.hide_patch, dtype=np.int64)
            if self.hide_patch.shape != self.pair_item.shape:
                raise SparsemmError("hide_patch needs one entry (a patch index or -1) per pair")
            if self.hide_patch.max(initial=-1) >= self.patches.shape[1]:
                raise SparsemmError("hide_patch points outside the item's patches")

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class TextPairData:
    """(query, document) text pairs, optionally with hard-negative documents per query.

    ``groups[j]`` names the document of pair j (pairs with the same group are not each
    other's negatives); ``hard_negatives[j]`` lists negative documents for query j.
    """

    queries: list[str]
    documents: list[str]
    hard_negatives: list[list[str]] | None = None
    groups: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.documents):
            raise SparsemmError("queries and documents must pair up one to one")
        if self.hard_negatives is not None and len(self.hard_negatives) != len(self.queries):
            raise SparsemmError("hard_negatives needs one list per query")
        if self.groups is not None:
            self.groups = np.asarray(self.groups, dtype=np.int64)
            if len(self.groups) != len(self.queries):
                raise SparsemmError("groups needs one entry per pair")

    def __len__(self) -> int:
        return len(self.queries)


def data_fingerprint(data: CrossModalData | TextPairData) -> str:
    """sha256 over the training inputs, so a resume on other data is refused."""
    h = hashlib.sha256()
    if isinstance(data, CrossModalData):
        h.update(b"cross")
        h.update("\n".join(data.texts).encode())
        h.update(data.pair_item.tobytes())
        h.update(str(data.patches.shape).encode())
        h.update(np.ascontiguousarray(data.patches).tobytes())
        if data.patch_mask is not None:
            h.update(np.ascontiguousarray(data.patch_mask).tobytes())
        if data.hide_patch is not None:
            h.update(b"hide")
            h.update(data.hide_patch.tobytes())
    else:
        h.update(b"t2t")
        h.update("\n".join(data.queries).encode())
        h.update("\n".join(data.documents).encode())
        for negs in data.hard_negatives or []:
            h.update(("\t".join(negs) + "\n").encode())
        if data.groups is not None:
            h.update(data.groups.tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------- loss


def contrastive_ce(
    a: torch.Tensor,
    b: torch.Tensor,
    tau: float,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """Symmetric in-batch InfoNCE over raw inner products / tau (VDR's retrieval loss).

    a (n, V) queries; b (m, V) documents, m >= n, row i of b is query i's positive and rows
    n.. are extra (hard) negatives, used in the a -> b direction only. ``groups`` (n,): rows
    with equal group are not negatives of each other. Unlike
    :func:`sparsemm.train.losses.info_nce` it does not re-normalise (VDR's text-to-text
    setting scores unnormalised codes) and takes extra negatives.
    """
    n = a.shape[0]
    logits = a @ b.T / tau  # (n, m)
    if groups is not None:
        same = groups[:, None] == groups[None, :]
        same.fill_diagonal_(False)
        pad = torch.zeros(n, b.shape[0] - n, dtype=torch.bool, device=a.device)
        logits = logits.masked_fill(torch.cat([same, pad], dim=1), float("-inf"))
    target = torch.arange(n, device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits[:, :n].T, target))


def vdr_loss(
    q_full: torch.Tensor,
    q_sparse: torch.Tensor,
    q_bow: torch.Tensor | None,
    d_full: torch.Tensor,
    d_sparse: torch.Tensor,
    d_bow: torch.Tensor | None,
    tau: float,
    groups: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """VDR's semi-parametric objective (module docstring); returns every term and ``loss``."""
    parts = {
        "par_q": contrastive_ce(q_sparse, d_full, tau, groups),
        "par_d": contrastive_ce(q_full, d_sparse, tau, groups),
    }
    if q_bow is not None:
        parts["bow_q"] = contrastive_ce(q_bow, d_full, tau, groups)
    if d_bow is not None:
        parts["bow_d"] = contrastive_ce(q_full, d_bow, tau, groups)
    loss = torch.stack(list(parts.values())).mean()
    with torch.no_grad():
        n = q_sparse.shape[0]
        hit = (q_sparse @ d_sparse[:n].T).argmax(dim=1) == torch.arange(n)
        acc = hit.float().mean()
    return {"loss": loss, **parts, "acc": acc}


# ------------------------------------------------------------------------------ loop


def _freeze(model: VDRModel, train: VDRTrainConfig) -> None:
    """Freeze the lower transformer layers (and the embeddings unless trained)."""
    towers: list[Any] = [model.text] + ([model.text_doc] if model.text_doc is not None else [])
    for bert in towers:
        emb: Any = bert.embeddings
        for p in emb.parameters():
            p.requires_grad_(train.train_embeddings)
        layers: Any = bert.encoder.layer
        n = min(train.freeze_layers, len(layers))
        for layer in list(layers)[:n]:
            for p in layer.parameters():
                p.requires_grad_(False)


def _param_groups(model: VDRModel, train: VDRTrainConfig) -> list[dict[str, Any]]:
    new: list[torch.nn.Parameter] = []
    old: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (old if name.startswith(("text.", "text_doc.")) else new).append(p)
    groups = [{"params": old, "lr": train.lr}]
    if new:
        groups.append({"params": new, "lr": train.new_params_lr or train.lr})
    return [g for g in groups if g["params"]]


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Linear warm-up over ``warmup`` steps, then linear or cosine decay to 0 at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    rest = max(1, total - warmup)
    t = min(1.0, (step - warmup) / rest)
    return 0.5 * (1.0 + math.cos(math.pi * t)) if schedule == "cosine" else 1.0 - t


def _batch_cross(
    model: VDRModel, data: CrossModalData, idx: np.ndarray
) -> dict[str, torch.Tensor | None]:
    cfg = model.config
    proj = model.projection()
    input_ids, attn = model.tokenize([data.texts[i] for i in idx])
    q_full = model.activate(model.text_pooled(input_ids, attn, "query", proj))
    items = data.pair_item[idx]
    x = torch.from_numpy(np.asarray(data.patches[items], dtype=np.float32))
    m = None if data.patch_mask is None else torch.from_numpy(data.patch_mask[items].copy())
    if data.hide_patch is not None:
        hide = data.hide_patch[idx]
        rows = np.flatnonzero(hide >= 0)
        if len(rows):
            if m is None:
                m = torch.ones(x.shape[:2], dtype=torch.bool)
            m[rows, hide[rows]] = False
            # an item whose only patch was hidden keeps it (nothing else to pool)
            empty = ~m.any(dim=1)
            m[empty, torch.from_numpy(np.maximum(hide, 0))[empty]] = True
    d_full = model.activate(model.image_pooled(x, m, proj))
    q_bow = model.bow(input_ids, attn) if cfg.bow else None
    return {
        "q_full": q_full,
        "q_sparse": sparsify(q_full, cfg.text_top_k, q_bow),
        "q_bow": None if q_bow is None else _bow_scale(q_bow, cfg.normalize),
        "d_full": d_full,
        "d_sparse": sparsify(d_full, cfg.image_top_k),
        "d_bow": None,
        "groups": torch.from_numpy(items),
    }


def _bow_scale(bow: torch.Tensor, normalize: bool) -> torch.Tensor:
    return F.normalize(bow, dim=1) if normalize else bow


def _batch_t2t(
    model: VDRModel, data: TextPairData, idx: np.ndarray, n_hard: int, rng: np.random.Generator
) -> dict[str, torch.Tensor | None]:
    cfg = model.config
    proj = model.projection()
    q_ids, q_attn = model.tokenize([data.queries[i] for i in idx])
    docs = [data.documents[i] for i in idx]
    if n_hard and data.hard_negatives is not None:
        for i in idx:
            pool = data.hard_negatives[i]
            if len(pool) < n_hard:
                raise SparsemmError(f"query {i} has {len(pool)} hard negatives, needs {n_hard}")
            pick = rng.choice(len(pool), size=n_hard, replace=False)
            docs.extend(pool[j] for j in pick)
    d_ids, d_attn = model.tokenize(docs)
    q_full = model.activate(model.text_pooled(q_ids, q_attn, "query", proj))
    d_proj = proj if model.text_doc is None else model.projection("document")
    d_full = model.activate(model.text_pooled(d_ids, d_attn, "document", d_proj))
    q_bow = model.bow(q_ids, q_attn) if cfg.bow else None
    d_bow = model.bow(d_ids, d_attn) if cfg.bow else None
    groups = None if data.groups is None else torch.from_numpy(data.groups[idx])
    return {
        "q_full": q_full,
        "q_sparse": sparsify(q_full, cfg.text_top_k, q_bow),
        "q_bow": None if q_bow is None else _bow_scale(q_bow, cfg.normalize),
        "d_full": d_full,
        "d_sparse": sparsify(d_full, cfg.text_top_k, d_bow),
        "d_bow": None if d_bow is None else _bow_scale(d_bow, cfg.normalize),
        "groups": groups,
    }


def train_vdr(
    model: VDRModel,
    data: CrossModalData | TextPairData,
    out_dir: str | Path,
    train: VDRTrainConfig | None = None,
    resume: bool = False,
    progress: bool = True,
    hard_negatives: int = 0,
    on_log: Callable[[dict[str, float]], None] | None = None,
) -> tuple[VDRModel, list[dict[str, float]]]:
    """Train ``model`` (e.g. :meth:`VDRModel.from_minilm`) in place on ``data``.

    Writes ``out_dir/{config.json, model.safetensors, tokenizer files, history.json}`` and a
    checkpoint every ``checkpoint_every`` steps in ``out_dir/checkpoint``; ``resume=True``
    continues from it (same settings and data required) and replays exactly the batches and
    dropout of an uninterrupted run. ``hard_negatives`` (text-to-text only): negatives per
    query drawn from ``data.hard_negatives``. Returns (model, history records).
    """
    train = train or VDRTrainConfig()
    out = check_output_dir(out_dir)  # a wrong -o fails before training
    cross = isinstance(data, CrossModalData)
    if (train.mode == "cross") != cross:
        need = "CrossModalData" if train.mode == "cross" else "TextPairData"
        raise SparsemmError(f"train mode {train.mode!r} needs {need}")
    if cross and model.config.image_dim is None:
        raise SparsemmError("cross-modal training needs a VDR model with an image side")
    if cross:
        assert isinstance(data, CrossModalData)
        if data.patches.shape[2] != model.config.image_dim:
            raise SparsemmError(
                f"patches have {data.patches.shape[2]} features, the model's image side "
                f"expects {model.config.image_dim}"
            )
    if hard_negatives and (cross or getattr(data, "hard_negatives", None) is None):
        raise SparsemmError("hard negatives need text-to-text data with hard_negatives lists")
    n = len(data)
    if n < 2:
        raise SparsemmError("VDR training needs at least 2 pairs")
    bs = min(train.batch_size, n)
    per_epoch = n // bs  # full batches only: every step sees bs in-batch negatives
    total = per_epoch * train.epochs
    if train.max_steps is not None:
        total = min(total, train.max_steps)
    warmup = int(train.warmup_fraction * total)

    _freeze(model, train)
    opt = torch.optim.AdamW(_param_groups(model, train), weight_decay=train.weight_decay)
    base_lrs = [g["lr"] for g in opt.param_groups]
    expected = {  # stored in each checkpoint; a resume must match all of it
        "config": json_safe(dataclasses.asdict(model.config)),
        "train": dataclasses.asdict(train),
        "hard_negatives": hard_negatives,
        "data": data_fingerprint(data),
    }
    start, history = 0, []
    state = resume_checkpoint(out, model, opt, expected, resume)
    if state is not None:
        start, history = int(state["step"]), list(state["history"])
        log.info("resuming VDR training at step %d/%d", start, total)

    model.train()
    sums: dict[str, float] = {}
    n_sum = 0
    t0 = time.perf_counter()
    bar = tqdm(range(start, total), desc="VDR", disable=not progress, leave=False)
    for step in bar:
        epoch, b = divmod(step, per_epoch)
        perm = epoch_permutation(train.seed, epoch, n)
        idx = perm[b * bs : (b + 1) * bs]
        torch.manual_seed(train.seed * 1_000_003 + step)  # dropout, replayable on resume
        for g, lr0 in zip(opt.param_groups, base_lrs, strict=True):
            g["lr"] = lr0 * lr_factor(step, total, warmup, train.schedule)
        if cross:
            assert isinstance(data, CrossModalData)
            batch = _batch_cross(model, data, idx)
        else:
            assert isinstance(data, TextPairData)
            rng = np.random.default_rng([train.seed, step, 7])
            batch = _batch_t2t(model, data, idx, hard_negatives, rng)
        q_full, q_sparse, d_full, d_sparse = (
            batch["q_full"],
            batch["q_sparse"],
            batch["d_full"],
            batch["d_sparse"],
        )
        assert q_full is not None and q_sparse is not None
        assert d_full is not None and d_sparse is not None
        losses = vdr_loss(
            q_full,
            q_sparse,
            batch["q_bow"],
            d_full,
            d_sparse,
            batch["d_bow"],
            train.tau,
            batch["groups"],
        )
        stop_if_diverged(
            losses["loss"],
            "VDR",
            f"step {step + 1}",
            f"--lr {train.lr}, --tau {train.tau}",
            out,
            "" if has_checkpoint(out) else None,
        )
        opt.zero_grad()
        losses["loss"].backward()
        if train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(
                [p for g in opt.param_groups for p in g["params"]], train.max_grad_norm
            )
        opt.step()
        for k, v in losses.items():
            sums[k] = sums.get(k, 0.0) + float(v.detach())
        n_sum += 1
        bar.set_postfix(loss=f"{float(losses['loss'].detach()):.3f}")
        done = step + 1
        if done % train.log_every == 0 or done == total:
            record = {
                "step": done,
                "lr": opt.param_groups[0]["lr"],
                **{k: v / n_sum for k, v in sums.items()},
                "seconds": round(time.perf_counter() - t0, 2),
            }
            history.append(record)
            sums, n_sum = {}, 0
            log.info(
                "VDR step %d/%d: %s",
                done,
                total,
                ", ".join(f"{k}={v:.4f}" for k, v in record.items() if k not in ("step",)),
            )
            if on_log is not None:
                on_log(record)
        if checkpoint_due(done, train.checkpoint_every, total):
            save_checkpoint(out, model, opt, {"step": done, "history": history, **expected})
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    model.save_pretrained(out)
    write_json(
        out / "history.json",
        {"train": dataclasses.asdict(train), "steps": total, "history": history},
    )
    return model, history


def json_safe(obj: Any) -> Any:
    """Dataclass dicts -> plain JSON types (tuples become lists) for settings comparison."""
    import json

    return json.loads(json.dumps(obj))


# ---------------------------------------------------- inputs from a collection


def ridge_map(x: np.ndarray, y: np.ndarray, l2: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Least squares W (d_in, d_out), b (d_out,) minimising |x W + b - y|^2 + l2 |W|^2."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    mx, my = x.mean(axis=0), y.mean(axis=0)
    xc, yc = x - mx, y - my
    w = np.linalg.solve(xc.T @ xc + l2 * np.eye(x.shape[1]), xc.T @ yc)
    return w.astype(np.float32), (my - mx @ w).astype(np.float32)


def adapter_ridge_init(
    collection: Collection, patches: np.ndarray, split: str = "train", l2: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Start of the patch adapter for an image backbone: a ridge map (W (d_img, h), b (h,))
    from an item's mean patch feature to its caption view (the L2-normalised mean of its
    caption embeddings, the text model's sentence space), fitted on ``split`` items.

    Applied per patch, the mean of the mapped patches is the predicted view, so the image
    side starts in the space the vocabulary projection reads.
    """
    sel = np.flatnonzero(collection.split_mask(split))
    te = collection.text_embeddings()
    owner = collection.text_item_index()
    views = np.zeros((len(collection.items), te.shape[1]), dtype=np.float64)
    np.add.at(views, owner, te)
    views /= np.maximum(np.linalg.norm(views, axis=1, keepdims=True), 1e-12)
    x = np.stack([np.asarray(patches[i], dtype=np.float32).mean(axis=0) for i in sel])
    return ridge_map(x, views[sel], l2)


def cross_modal_data(
    collection: Collection,
    split: str,
    patches: np.ndarray,
    mask: np.ndarray | None,
    max_pairs: int | None = None,
    leave_one_out: bool = False,
) -> CrossModalData:
    """(caption, item patches) pairs of every caption of the ``split`` items.

    ``leave_one_out`` (caption-proxy patches from :func:`proxy_patches`): while a pair
    trains, its own caption's embedding is hidden from its item's patches.
    """
    sel = collection.split_mask(split)
    rows, pair_item = collection.caption_rows(sel)
    items = np.flatnonzero(sel)
    hide = None
    if leave_one_out:
        # proxy_patches fills an item's slots in caption-row order
        owner = collection.text_item_index()
        slot = np.zeros(len(owner), dtype=np.int64)
        seen = np.zeros(len(collection.items), dtype=np.int64)
        for r, it in enumerate(owner):
            slot[r] = seen[it]
            seen[it] += 1
        hide = slot[rows]
    if max_pairs is not None:
        rows, pair_item = rows[:max_pairs], pair_item[:max_pairs]
        hide = None if hide is None else hide[:max_pairs]
    return CrossModalData(
        [str(collection.texts[r]["text"]) for r in rows],
        pair_item,
        patches[items],
        None if mask is None else mask[items],
        hide,
    )
