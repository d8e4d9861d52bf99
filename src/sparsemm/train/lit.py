"""Training loop for the linear alignment baseline (:mod:`sparsemm.models.lit`).

Same pairs, batches, optimiser and InfoNCE as SR (:mod:`sparsemm.train.sr`), so the dense and
sparse models of a comparison have seen exactly the same data. Resumable (checkpoint per
``checkpoint_every`` epochs, refused on other settings or data), deterministic for a seed.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from sparsemm.errors import SparsemmError
from sparsemm.io import write_json
from sparsemm.models.lit import AlignConfig, LinearAligner
from sparsemm.train.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from sparsemm.train.losses import info_nce
from sparsemm.train.sr import SRTrainConfig, data_fingerprint

log = logging.getLogger(__name__)


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
    n_pairs = len(text_emb)
    if len(pair_item) != n_pairs:
        raise SparsemmError("pair_item must have one entry per text embedding")
    if n_pairs < 2:
        raise SparsemmError("alignment training needs at least 2 (image, caption) pairs")
    if image_emb.shape[1] != config.image_dim or text_emb.shape[1] != config.text_dim:
        raise SparsemmError(
            f"embedding dims ({image_emb.shape[1]}, {text_emb.shape[1]}) do not match the "
            f"config ({config.image_dim}, {config.text_dim})"
        )
    torch.manual_seed(train.seed)
    model = LinearAligner(config)
    opt = torch.optim.Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    out = Path(out_dir)
    settings = {"config": dataclasses.asdict(config), "train": dataclasses.asdict(train)}
    fingerprint = data_fingerprint(image_emb, text_emb, np.asarray(pair_item))
    start_epoch, history = 0, []
    if resume and has_checkpoint(out):
        state = load_checkpoint(out, model, opt)
        if any(state.get(k) != v for k, v in settings.items()) or state.get("data") != fingerprint:
            raise SparsemmError(
                f"the checkpoint in {out} was made with other settings or data; use the same "
                "ones, another output folder, or start over without --resume"
            )
        start_epoch, history = int(state["epoch"]), list(state["history"])

    img_t = torch.from_numpy(np.ascontiguousarray(image_emb, dtype=np.float32))
    txt_t = torch.from_numpy(np.ascontiguousarray(text_emb, dtype=np.float32))
    item_t = torch.from_numpy(np.asarray(pair_item, dtype=np.int64))
    model.train()
    for epoch in range(start_epoch, train.epochs):
        perm = np.random.default_rng([train.seed, epoch]).permutation(n_pairs)
        total, n_batches = 0.0, 0
        bar = tqdm(
            range(0, n_pairs, train.batch_size),
            desc=f"align epoch {epoch + 1}/{train.epochs}",
            disable=not progress,
            leave=False,
        )
        for s in bar:
            idx = perm[s : s + train.batch_size]
            if len(idx) < 2:
                continue
            items = item_t[idx]
            zi, zt = model(img_t[items], txt_t[idx])
            loss = info_nce(zi, zt, config.tau, groups=items)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach())
            n_batches += 1
        history.append({"epoch": epoch + 1, "nce": total / max(n_batches, 1)})
        log.info("align epoch %d: nce=%.4f", epoch + 1, history[-1]["nce"])
        if (epoch + 1) % train.checkpoint_every == 0 or epoch + 1 == train.epochs:
            save_checkpoint(
                out,
                model,
                opt,
                {"epoch": epoch + 1, "history": history, **settings, "data": fingerprint},
            )
    model.eval()
    model.save_pretrained(out)
    write_json(out / "history.json", {"train": dataclasses.asdict(train), "history": history})
    return model, history
