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

A search projects with :class:`sparsemm.models.lit_lite.AlignerLite` (the same heads in
numpy, no torch import), which also holds the config and the aligned text encoder.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparsemm.models.base import PretrainedMixin
from sparsemm.models.lit_lite import AlignConfig, AlignedTextEncoder, check_features

__all__ = ["AlignConfig", "AlignedTextEncoder", "LinearAligner"]


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
        x = check_features(x, width, what)
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
