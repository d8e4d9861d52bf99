"""Training loop for the SR model (one plain function; resumable; deterministic on CPU)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from tqdm.auto import tqdm

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import write_json
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.train.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from sparsemm.train.losses import sr_loss
from sparsemm.words.bias import sentence_bias
from sparsemm.words.spine import SparseWordVectors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SRTrainConfig:
    epochs: int = 20  # passes over all (image, caption) pairs
    batch_size: int = 256  # in-batch negatives for InfoNCE
    lr: float = 1e-3  # Adam
    weight_decay: float = 0.0
    seed: int = 0  # weights init and per-epoch shuffles
    checkpoint_every: int = 1  # epochs between checkpoints

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.checkpoint_every < 1:
            raise SparsemmError("epochs and checkpoint_every must be at least 1")
        if self.batch_size < 2:
            raise SparsemmError("batch_size must be at least 2 (InfoNCE needs in-batch negatives)")
        if self.lr <= 0 or self.weight_decay < 0:
            raise SparsemmError("lr must be positive and weight_decay non-negative")


def data_fingerprint(*arrays: np.ndarray | sp.csr_matrix | None) -> str:
    """sha256 over the training inputs, so a resume on other data is refused."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none")
        elif sp.issparse(a):
            m = sp.csr_matrix(a)
            for part in (m.data, m.indices, m.indptr):
                h.update(np.ascontiguousarray(part).tobytes())
        else:
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# extra_loss(sr_out, idx, items) -> (named parts to log, weighted term added to the loss)
ExtraLoss = Callable[
    [dict[str, torch.Tensor], np.ndarray, torch.Tensor],
    tuple[dict[str, torch.Tensor], torch.Tensor],
]


def train_sr(
    image_emb: np.ndarray,
    text_emb: np.ndarray,
    pair_item: np.ndarray,
    bias: sp.csr_matrix | None,
    config: SRConfig,
    out_dir: str | Path,
    train: SRTrainConfig | None = None,
    resume: bool = False,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[SRModel, list[dict[str, float]]]:
    """Train SR on pairs (image_emb[pair_item[j]], text_emb[j]) with caption bias ``bias[j]``.

    image_emb (n_items, k_img), text_emb (n_pairs, k_txt), pair_item (n_pairs,) int,
    bias (n_pairs, d) or None (the "no SPINE bias" ablation: TopK mask only).
    Writes ``out_dir/{config.json, model.safetensors, history.json}`` and periodic checkpoints
    in ``out_dir/checkpoint``; ``resume=True`` continues from the last one.
    ``on_epoch_end(epoch, record)`` is called after each epoch's checkpoint.
    """
    train = train or SRTrainConfig()
    torch.manual_seed(train.seed)
    model = SRModel(config)
    history = fit_sr(
        model,
        model,
        image_emb,
        text_emb,
        pair_item,
        bias,
        out_dir,
        train,
        settings={"config": dataclasses.asdict(config), "train": dataclasses.asdict(train)},
        resume=resume,
        progress=progress,
        on_epoch_end=on_epoch_end,
    )
    model.save_pretrained(out_dir)
    write_json(
        Path(out_dir) / "history.json", {"train": dataclasses.asdict(train), "history": history}
    )
    return model, history


def fit_sr(
    model: torch.nn.Module,
    sr: SRModel,
    image_emb: np.ndarray,
    text_emb: np.ndarray,
    pair_item: np.ndarray,
    bias: sp.csr_matrix | None,
    out_dir: str | Path,
    train: SRTrainConfig,
    settings: Mapping[str, object],
    resume: bool = False,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
    extra_loss: ExtraLoss | None = None,
    desc: str = "SR",
) -> list[dict[str, float]]:
    """The SR training loop shared by :func:`train_sr` and its variants; returns the history.

    ``model`` holds every trained parameter (``sr`` itself, or ``sr`` plus extra heads);
    ``settings`` (JSON) and a fingerprint of the inputs are stored in each checkpoint and
    must match on resume. ``extra_loss`` adds a weighted term to the SR objective; its parts
    and the ``total`` are logged. Leaves ``model`` in eval mode; the caller saves it.
    """
    config: SRConfig = sr.config
    out = Path(out_dir)
    n_pairs = len(text_emb)
    if len(pair_item) != n_pairs:
        raise SparsemmError("pair_item must have one entry per text embedding")
    if bias is not None and bias.shape != (n_pairs, config.latent_dim):
        raise SparsemmError(
            f"bias has shape {bias.shape}, expected ({n_pairs}, {config.latent_dim}); the SPINE "
            "hidden size must equal the SR latent_dim"
        )
    if n_pairs < 2:
        raise SparsemmError("SR training needs at least 2 (image, caption) pairs")
    if image_emb.shape[1] != config.image_dim or text_emb.shape[1] != config.text_dim:
        raise SparsemmError(
            f"embedding dims ({image_emb.shape[1]}, {text_emb.shape[1]}) do not match the "
            f"config ({config.image_dim}, {config.text_dim})"
        )

    opt = torch.optim.Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    start_epoch, history = 0, []
    fingerprint = data_fingerprint(image_emb, text_emb, np.asarray(pair_item), bias)
    if resume and has_checkpoint(out):
        state = load_checkpoint(out, model, opt)
        if any(state.get(k) != v for k, v in settings.items()) or state.get("data") != fingerprint:
            raise SparsemmError(
                f"the checkpoint in {out} was made with other settings or data; use the same "
                "ones, another output folder, or start over without --resume"
            )
        start_epoch, history = int(state["epoch"]), list(state["history"])
        log.info("resuming %s training at epoch %d/%d", desc, start_epoch + 1, train.epochs)
    elif resume:
        log.info("no checkpoint in %s; starting from scratch", out)

    img_t = torch.from_numpy(np.ascontiguousarray(image_emb, dtype=np.float32))
    txt_t = torch.from_numpy(np.ascontiguousarray(text_emb, dtype=np.float32))
    item_t = torch.from_numpy(np.asarray(pair_item, dtype=np.int64))
    bias_csr = sp.csr_matrix(bias, dtype=np.float32) if bias is not None else None

    model.train()
    for epoch in range(start_epoch, train.epochs):
        perm = np.random.default_rng([train.seed, epoch]).permutation(n_pairs)
        sums: dict[str, float] = {}
        n_batches = 0
        batches = range(0, n_pairs, train.batch_size)
        bar = tqdm(
            batches,
            desc=f"{desc} epoch {epoch + 1}/{train.epochs}",
            disable=not progress,
            leave=False,
        )
        for s in bar:
            idx = perm[s : s + train.batch_size]
            if len(idx) < 2:
                continue
            items = item_t[idx]
            b = torch.from_numpy(bias_csr[idx].toarray()) if bias_csr is not None else None
            out_b = sr(img_t[items], txt_t[idx], b)
            losses = sr_loss(
                out_b,
                img_t[items],
                txt_t[idx],
                config.tau,
                config.contrastive_weight,
                config.recon_weight,
                groups=items,
            )
            objective = losses["loss"]
            if extra_loss is not None:
                parts, added = extra_loss(out_b, idx, items)
                objective = objective + added
                losses = {**losses, **parts, "total": objective}
            opt.zero_grad()
            objective.backward()
            opt.step()
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach())
            n_batches += 1
            bar.set_postfix(loss=f"{float(objective.detach()):.3f}")
        record = {"epoch": epoch + 1, **{k: v / max(n_batches, 1) for k, v in sums.items()}}
        history.append(record)
        log.info(
            "%s epoch %d: %s",
            desc,
            epoch + 1,
            ", ".join(f"{k}={v:.4f}" for k, v in record.items() if k != "epoch"),
        )
        if (epoch + 1) % train.checkpoint_every == 0 or epoch + 1 == train.epochs:
            state = {"epoch": epoch + 1, "history": history, **settings, "data": fingerprint}
            save_checkpoint(out, model, opt, state)
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, record)
    model.eval()
    return history


def sr_pairs_from_collection(
    collection: Collection,
    item_mask: np.ndarray,
    sparse_vectors: SparseWordVectors | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, sp.csr_matrix | None]:
    """Training pairs (image_emb, text_emb, pair_item, bias) for the items in ``item_mask``.

    Every caption of a selected item is one pair with that item's image embedding (or
    caption view); ``pair_item`` indexes the returned image_emb rows. ``bias`` is the SPINE
    sentence bias of each caption, or None for the no-bias ablation.
    """
    image_all = collection.image_embeddings()
    text_all = collection.text_embeddings()
    items = np.flatnonzero(item_mask)
    if len(items) == 0:
        raise SparsemmError("no items selected for SR training")
    rows, pair_item = collection.caption_rows(item_mask)
    if len(rows) < 2:
        raise SparsemmError("SR training needs captions: the selected items have fewer than 2")
    bias = None
    if sparse_vectors is not None:
        bias = sentence_bias([collection.texts[r]["text"] for r in rows], sparse_vectors)
    return (
        np.ascontiguousarray(image_all[items]),
        np.ascontiguousarray(text_all[rows]),
        pair_item,
        bias,
    )
