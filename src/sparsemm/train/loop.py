"""The resumable epoch loop over (image, caption) pairs of SR and the aligner.

What the trainers share (:func:`sparsemm.train.sr.fit_sr`, and the aligner's
``sparsemm_experiments.train.lit.train_aligner``): Adam over all parameters, one permutation
of the pairs per epoch seeded by ``(seed, epoch)``, batches of ``batch_size`` pairs (a last
batch of one pair is skipped: InfoNCE needs a negative), the per-epoch mean of each loss
term as a history record, and a checkpoint every ``checkpoint_every`` epochs and after the
last, holding the epoch, the history and the run's settings and data fingerprint. Resuming
replays exactly what an uninterrupted run would have done; a checkpoint of other settings or
data is refused. What differs, the loss of one batch, is the caller's ``batch_loss``.

A run that diverges stops at the first batch whose loss is NaN or inf (and before a
checkpoint of non-finite weights): :func:`stop_if_diverged` raises one SparsemmError naming
the settings, and the last good checkpoint is left as it was (nothing is written after it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from sparsemm.errors import SparsemmError
from sparsemm.io import check_output_dir
from sparsemm.models.base import nonfinite_tensors
from sparsemm.train.checkpoint import (
    CKPT_DIR,
    checkpoint_due,
    resume_checkpoint,
    save_checkpoint,
)

if TYPE_CHECKING:
    from sparsemm.train.sr import SRTrainConfig

log = logging.getLogger(__name__)

# batch_loss(idx) -> (objective to minimise, named terms averaged into the history record)
BatchLoss = Callable[[np.ndarray], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def stop_if_diverged(
    loss: torch.Tensor | float,
    desc: str,
    where: str,
    settings: str,
    out_dir: str | Path,
    last_good: str | None,
) -> None:
    """Raise SparsemmError when ``loss`` is NaN or inf: the run diverged at ``where``.

    ``settings`` names the values to change (e.g. ``"--lr 0.001, --tau 0.05"``);
    ``last_good`` describes the last checkpoint this run wrote (``"epoch 3"``; ``""``: one
    exists; None: none yet). Nothing is saved after it, so the model folder and the
    checkpoint stay as they were.
    """
    value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    if np.isfinite(value):
        return
    at = f" ({last_good})" if last_good else ""
    kept = (
        f"the last good checkpoint{at} is kept in {Path(out_dir) / CKPT_DIR}"
        if last_good is not None
        else "no checkpoint was written"
    )
    raise SparsemmError(
        f"{desc} training diverged at {where}: the loss is {value} with {settings}; {kept} "
        "and no model was saved; lower the learning rate or fix that setting and run again"
    )


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of ``n`` training pairs in ``epoch`` (0-based), from ``(seed, epoch)`` only."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def pair_tensors(
    image_emb: np.ndarray,
    text_emb: np.ndarray,
    pair_item: np.ndarray,
    image_dim: int,
    text_dim: int,
    what: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Checked training pairs (image_emb[pair_item[j]], text_emb[j]) as tensors.

    Returns image (n_items, image_dim) float32, text (n_pairs, text_dim) float32 and
    pair_item (n_pairs,) int64; ``what`` names the model in the errors.
    """
    n_pairs = len(text_emb)
    if len(pair_item) != n_pairs:
        raise SparsemmError("pair_item must have one entry per text embedding")
    if n_pairs < 2:
        raise SparsemmError(f"{what} training needs at least 2 (image, caption) pairs")
    if image_emb.shape[1] != image_dim or text_emb.shape[1] != text_dim:
        raise SparsemmError(
            f"embedding dims ({image_emb.shape[1]}, {text_emb.shape[1]}) do not match the "
            f"config ({image_dim}, {text_dim})"
        )
    return (
        torch.from_numpy(np.ascontiguousarray(image_emb, dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(text_emb, dtype=np.float32)),
        torch.from_numpy(np.asarray(pair_item, dtype=np.int64)),
    )


def fit_epochs(
    model: torch.nn.Module,
    n_pairs: int,
    batch_loss: BatchLoss,
    out_dir: str | Path,
    train: SRTrainConfig,
    expected: Mapping[str, object],
    resume: bool = False,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
    desc: str = "SR",
    save: Callable[..., Path] = save_checkpoint,
    settings: str | None = None,
) -> list[dict[str, float]]:
    """Train ``model`` (every parameter) for ``train.epochs`` over ``n_pairs`` pairs.

    ``expected`` (JSON: settings and data fingerprint) goes into each checkpoint in
    ``out_dir/checkpoint`` and must match on resume. ``on_epoch_end(epoch, record)`` runs
    after the epoch's checkpoint. ``save`` writes a checkpoint (``save_checkpoint``'s
    signature). ``settings`` names the run's settings in the error of a diverged run
    (default: the learning rate). Returns the history (one record per epoch); leaves
    ``model`` in eval mode.
    """
    out = check_output_dir(out_dir)  # a wrong -o fails now, not after the first epoch
    opt = torch.optim.Adam(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    start_epoch, history = 0, []
    state = resume_checkpoint(out, model, opt, expected, resume)
    last_good: str | None = None
    if state is not None:
        start_epoch, history = int(state["epoch"]), list(state["history"])
        last_good = f"epoch {start_epoch}"
        log.info("resuming %s training at epoch %d/%d", desc, start_epoch + 1, train.epochs)
    settings = settings or f"--lr {train.lr}"

    model.train()
    for epoch in range(start_epoch, train.epochs):
        perm = epoch_permutation(train.seed, epoch, n_pairs)
        sums: dict[str, float] = {}
        n_batches = 0
        bar = tqdm(
            range(0, n_pairs, train.batch_size),
            desc=f"{desc} epoch {epoch + 1}/{train.epochs}",
            disable=not progress,
            leave=False,
        )
        for b, s in enumerate(bar):
            idx = perm[s : s + train.batch_size]
            if len(idx) < 2:
                continue
            objective, terms = batch_loss(idx)
            where = f"epoch {epoch + 1}, batch {b + 1}"
            stop_if_diverged(objective, desc, where, settings, out, last_good)
            opt.zero_grad()
            objective.backward()
            opt.step()
            for k, v in terms.items():
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
        if nonfinite_tensors(model.state_dict()):  # the last step overflowed
            stop_if_diverged(float("nan"), desc, f"epoch {epoch + 1}", settings, out, last_good)
        if checkpoint_due(epoch + 1, train.checkpoint_every, train.epochs):
            save(out, model, opt, {"epoch": epoch + 1, "history": history, **expected})
            last_good = f"epoch {epoch + 1}"
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, record)
    model.eval()
    return history
