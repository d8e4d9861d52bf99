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

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import write_json
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.train.loop import fit_epochs, pair_tensors
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
        # written as "not (x > 0)" so NaN is refused too
        if not (0 < self.lr < float("inf")) or not (0 <= self.weight_decay < float("inf")):
            raise SparsemmError(
                f"lr must be a positive number and weight_decay a non-negative one (got lr "
                f"{self.lr}, weight_decay {self.weight_decay})"
            )


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
) -> list[dict[str, float]]:
    """The SR training loop of :func:`train_sr`; returns the history.

    ``settings`` (JSON) and a fingerprint of the inputs are stored in each checkpoint and
    must match on resume. Leaves ``sr`` in eval mode; the caller saves it.
    """
    config: SRConfig = sr.config
    n_pairs = len(text_emb)
    if bias is not None and bias.shape != (n_pairs, config.latent_dim):
        raise SparsemmError(
            f"bias has shape {bias.shape}, expected ({n_pairs}, {config.latent_dim}); the SPINE "
            "hidden size must equal the SR latent_dim"
        )
    img_t, txt_t, item_t = pair_tensors(
        image_emb, text_emb, pair_item, config.image_dim, config.text_dim, "SR"
    )
    fingerprint = data_fingerprint(image_emb, text_emb, np.asarray(pair_item), bias)
    bias_csr = sp.csr_matrix(bias, dtype=np.float32) if bias is not None else None

    def batch_loss(idx: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
        return losses["loss"], losses

    return fit_epochs(
        sr,
        n_pairs,
        batch_loss,
        out_dir,
        train,
        {**settings, "data": fingerprint},
        resume=resume,
        progress=progress,
        on_epoch_end=on_epoch_end,
        desc="SR",
        settings=f"--lr {train.lr}, --tau {config.tau}, --lambda {config.contrastive_weight}",
    )


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


def train_sr_on_collection(
    collection: Collection,
    out_dir: str | Path,
    vectors: SparseWordVectors | None,
    split: str = "train",
    latent_dim: int = 1000,
    top_k: int = 64,
    tau: float = 0.05,
    train: SRTrainConfig | None = None,
    resume: bool = False,
    progress: bool = True,
    **config: object,
) -> tuple[SRModel, list[dict[str, float]], int, int]:
    """Train SR on the (image, caption) pairs of a collection ``split`` ("all": every
    captioned item), with the SPINE caption bias of ``vectors`` (None: the no-bias
    ablation), and save it in ``out_dir`` with the collection's encoders as its record, so
    index and search refuse it on a collection from other encoders.

    ``config`` holds further :class:`SRConfig` fields (``activation``,
    ``contrastive_weight``, ``shared``). Returns (model, history, items, captions).
    """
    from sparsemm.models.base import encoder_record

    if vectors is not None and vectors.dim != latent_dim:
        raise SparsemmError(
            f"the SPINE vectors have {vectors.dim} dims but the latent size is {latent_dim}; "
            "they must match (dimension j of SR is SPINE dimension j)"
        )
    mask = collection.split_mask(split)
    image, text, pair_item, bias = sr_pairs_from_collection(collection, mask, vectors)
    shared = bool(config.pop("shared", True)) and image.shape[1] == text.shape[1]
    sr_config = SRConfig(
        text_dim=text.shape[1],
        image_dim=image.shape[1],
        latent_dim=latent_dim,
        # two backbones (different dims) always need one encoder/decoder per modality
        shared=shared,
        top_k=top_k,
        tau=tau,
        **config,  # type: ignore[arg-type]
    )
    model, history = train_sr(
        image, text, pair_item, bias, sr_config, out_dir, train, resume=resume, progress=progress
    )
    # Saved again with the record, as one atomic change of config.json + weights: a kill
    # before this leaves the new model without a record (accepted everywhere), never a
    # record of another training run.
    model.training_info = encoder_record(collection.manifest, collection.root)
    model.save_pretrained(out_dir)
    return model, history, len(image), len(text)
