"""Training loop for the linear alignment baseline (:mod:`sparsemm_experiments.models.lit`).

Same pairs, batches, optimiser and InfoNCE as SR (:mod:`sparsemm.train.sr`), so the dense and
sparse models of a comparison have seen exactly the same data. Resumable (checkpoint per
``checkpoint_every`` epochs, refused on other settings or data), deterministic for a seed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from sparsemm.io import write_json
from sparsemm.train.checkpoint import save_checkpoint
from sparsemm.train.loop import fit_epochs, pair_tensors
from sparsemm.train.losses import info_nce
from sparsemm.train.sr import SRTrainConfig, data_fingerprint
from sparsemm_experiments.models.lit import AlignConfig, LinearAligner


def train_aligner(
    image_emb: np.ndarray,
    text_emb: np.ndarray,
    pair_item: np.ndarray,
    config: AlignConfig,
    out_dir: str | Path,
    train: SRTrainConfig | None = None,
    resume: bool = False,
    progress: bool = True,
) -> tuple[LinearAligner, list[dict[str, float]]]:
    """Train on pairs (image_emb[pair_item[j]], text_emb[j]) with symmetric InfoNCE.

    image_emb (n_items, image_dim), text_emb (n_pairs, text_dim), pair_item (n_pairs,) int.
    Captions of one item in a batch are not each other's negatives (as in SR). Writes
    ``out_dir/{config.json, model.safetensors, history.json}`` and ``out_dir/checkpoint``.
    """
    train = train or SRTrainConfig()
    img_t, txt_t, item_t = pair_tensors(
        image_emb, text_emb, pair_item, config.image_dim, config.text_dim, "alignment"
    )
    torch.manual_seed(train.seed)
    model = LinearAligner(config)
    out = Path(out_dir)
    settings = {"config": dataclasses.asdict(config), "train": dataclasses.asdict(train)}
    fingerprint = data_fingerprint(image_emb, text_emb, np.asarray(pair_item))

    def batch_loss(idx: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        items = item_t[idx]
        zi, zt = model(img_t[items], txt_t[idx])
        loss = info_nce(zi, zt, config.tau, groups=items)
        return loss, {"nce": loss}

    history = fit_epochs(
        model,
        len(text_emb),
        batch_loss,
        out,
        train,
        {**settings, "data": fingerprint},
        resume=resume,
        progress=progress,
        desc="align",
        save=save_checkpoint,  # this module's name: tests stop a run after a checkpoint
    )
    model.save_pretrained(out)
    write_json(out / "history.json", {"train": dataclasses.asdict(train), "history": history})
    return model, history
