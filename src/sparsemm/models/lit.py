"""A linear contrastive alignment of two frozen backbones: the dense baseline for unaligned
image and text encoders.

LiT ("LiT: Zero-Shot Transfer with Locked-image text Tuning", Zhai et al., CVPR 2022) keeps a
pre-trained image tower frozen and trains the text side contrastively so both land in one
space. Here *both* backbones stay frozen (EfficientNet-Lite0 for images, MiniLM for captions
in the offline demo) and only a linear head per modality is trained with the same symmetric
InfoNCE loss SR uses. The result is the dense counterpart of SR on exactly the same features
and pairs: dense vs sparse then differ in the representation only, not in what was seen.

    z_img = normalize(W_i x_img)   (n, dim)
    z_txt = normalize(W_t x_txt)   (n, dim)
    score = z_img . z_txt
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparsemm.errors import SparsemmError
from sparsemm.models.base import PretrainedMixin


@dataclass(frozen=True)
class AlignConfig:
    image_dim: int  # input width of the image backbone's features
    text_dim: int  # input width of the text backbone's features
    dim: int = 512  # shared space width (SR uses d=1000 sparse; a dense space needs fewer)
    tau: float = 0.05  # InfoNCE temperature, the same as SR's so the losses match

    def __post_init__(self) -> None:
        if min(self.image_dim, self.text_dim, self.dim) < 1:
            raise SparsemmError("image_dim, text_dim and dim must be positive")
        if not (0 < self.tau < float("inf")):  # NaN too
            raise SparsemmError(f"tau (--tau) must be a positive number, got {self.tau}")


class LinearAligner(PretrainedMixin, nn.Module):
    """Two linear heads into one unit-sphere space (see the module docstring)."""

    config_class = AlignConfig
    model_type = "linear_align"

    def __init__(self, config: AlignConfig) -> None:
        super().__init__()
        self.config = config
        self.image_proj = nn.Linear(config.image_dim, config.dim, bias=False)
        self.text_proj = nn.Linear(config.text_dim, config.dim, bias=False)

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """image (n, image_dim), text (m, text_dim) -> unit rows (n, dim), (m, dim)."""
        return (
            F.normalize(self.image_proj(image), dim=-1),
            F.normalize(self.text_proj(text), dim=-1),
        )

    @torch.no_grad()
    def _project(self, x: np.ndarray, layer: nn.Linear, width: int, what: str) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != width:
            raise SparsemmError(
                f"{what} features must be (n, {width}) for this aligner, got {x.shape}; were "
                "they made by the backbone the aligner was trained on?"
            )
        out = F.normalize(layer(torch.from_numpy(x)), dim=-1)
        return out.numpy().astype(np.float32)

    def encode_image(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """(n, image_dim) backbone features -> (n, dim) unit vectors in the shared space."""
        parts = [
            self._project(x[s : s + batch_size], self.image_proj, self.config.image_dim, "image")
            for s in range(0, len(x), batch_size)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, self.config.dim), np.float32)

    def encode_text_features(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """(n, text_dim) backbone features -> (n, dim) unit vectors in the shared space."""
        parts = [
            self._project(x[s : s + batch_size], self.text_proj, self.config.text_dim, "text")
            for s in range(0, len(x), batch_size)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, self.config.dim), np.float32)


class AlignedTextEncoder:
    """A text encoder (the project's encoder protocol) whose output is in an aligner's space:
    ``base`` embeds the texts, the aligner's text head projects them. ``base`` stays
    reachable for models that need the raw backbone features (SR's text encoder)."""

    def __init__(self, base: Any, aligner: LinearAligner) -> None:
        if int(getattr(base, "dim", aligner.config.text_dim)) != aligner.config.text_dim:
            raise SparsemmError(
                f"the text encoder gives {base.dim}-d vectors but the aligner expects "
                f"{aligner.config.text_dim}-d"
            )
        self.base = base
        self.aligner = aligner
        self.dim = aligner.config.dim
        self.name = f"{getattr(base, 'name', 'text')}+linear_align"

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        raw = self.base.encode_text(list(texts), batch_size=batch_size, progress=progress)
        return self.aligner.encode_text_features(raw)
