"""The linear aligner's inference side in numpy: a search projects into the aligned space
without importing torch.

The aligner (``sparsemm_experiments.models.lit.LinearAligner``, ``sparsemm train align``) is
trained with torch; at query time it is two matrix products and a row normalisation,
``normalize(x W^T)``. :class:`AlignerLite` reads the same ``config.json`` +
``model.safetensors`` through ``safetensors.numpy`` and computes that. The config and the
aligned text encoder live here too, so neither needs torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.models.base import ArrayModule, PretrainedMixin


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


def check_features(x: np.ndarray, width: int, what: str) -> np.ndarray:
    """``x`` as float32 (n, width), or SparsemmError saying where such features come from."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != width:
        raise SparsemmError(
            f"{what} features must be (n, {width}) for this aligner, got {x.shape}; were "
            "they made by the backbone the aligner was trained on?"
        )
    return x


class AlignerLite(PretrainedMixin, ArrayModule):
    """A linear aligner's two heads (``sparsemm train align``) as numpy arrays."""

    config_class: ClassVar[type] = AlignConfig
    model_type: ClassVar[str] = "linear_align"

    def __init__(self, config: AlignConfig) -> None:
        super().__init__()
        self.config = config
        self.declare("image_proj.weight", config.dim, config.image_dim)
        self.declare("text_proj.weight", config.dim, config.text_dim)

    def _project(self, x: np.ndarray, name: str, width: int, what: str) -> np.ndarray:
        out = check_features(x, width, what) @ self.array(f"{name}.weight").T
        # F.normalize: x / max(||x||, 1e-12)
        norm = np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return (out / norm).astype(np.float32)

    def encode_image(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """(n, image_dim) backbone features -> (n, dim) unit vectors in the shared space."""
        parts = [
            self._project(x[s : s + batch_size], "image_proj", self.config.image_dim, "image")
            for s in range(0, len(x), batch_size)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, self.config.dim), np.float32)

    def encode_text_features(self, x: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """(n, text_dim) backbone features -> (n, dim) unit vectors in the shared space."""
        parts = [
            self._project(x[s : s + batch_size], "text_proj", self.config.text_dim, "text")
            for s in range(0, len(x), batch_size)
        ]
        return np.concatenate(parts) if parts else np.zeros((0, self.config.dim), np.float32)


class AlignedTextEncoder:
    """A text encoder (the project's encoder protocol) whose output is in an aligner's space:
    ``base`` embeds the texts, the aligner's text head projects them. ``base`` stays
    reachable for models that need the raw backbone features (SR's text encoder)."""

    def __init__(self, base: Any, aligner: Any) -> None:
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
        return np.asarray(self.aligner.encode_text_features(raw))
