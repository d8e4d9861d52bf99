"""Training losses. Each returns a dict of named scalar tensors (every component is logged)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def info_nce(
    a: torch.Tensor, b: torch.Tensor, tau: float, groups: torch.Tensor | None = None
) -> torch.Tensor:
    """Symmetric InfoNCE (CLIP, Radford et al. 2021) over cosine similarities / tau.

    a, b (n, d): row i of a and row i of b are a positive pair. ``groups`` (n,) marks rows
    that share an item (several captions of one image in a batch): those off-diagonal pairs
    are not used as negatives.
    """
    a = F.normalize(a, dim=1)
    b = F.normalize(b, dim=1)
    logits = a @ b.T / tau
    if groups is not None:
        same = groups[:, None] == groups[None, :]
        same.fill_diagonal_(False)
        logits = logits.masked_fill(same, float("-inf"))
    target = torch.arange(len(a), device=a.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def reconstruction(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of the squared L2 error ||x - x_hat||^2."""
    return ((x - x_hat) ** 2).sum(dim=1).mean()


def sr_loss(
    out: dict[str, torch.Tensor],
    image: torch.Tensor,
    text: torch.Tensor,
    tau: float,
    contrastive_weight: float,
    recon_weight: float,
    groups: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """SR paper's objective: L_rec(image) + L_rec(text) + lambda * InfoNCE(SR_img, SR_txt)."""
    rec_i = reconstruction(image, out["rec_image"])
    rec_t = reconstruction(text, out["rec_text"])
    nce = info_nce(out["sr_image"], out["sr_text"], tau, groups)
    total = recon_weight * (rec_i + rec_t) + contrastive_weight * nce
    return {"loss": total, "rec_image": rec_i, "rec_text": rec_t, "nce": nce}
