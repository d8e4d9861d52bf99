"""SR's inference side in numpy: the codes a search needs, without importing torch.

An SR model (:mod:`sparsemm.models.sr`) codes a backbone embedding x (n, k) as
``mask * relu(x W_e^T + b_e)`` with mask = TopK (optionally OR the caption's sentence bias):
one matrix product and a top-k per row. :class:`SRLite` reads the same ``config.json`` +
``model.safetensors`` pair through ``safetensors.numpy`` and computes exactly that, so a
cold ``sparsemm search`` ranks without the second torch takes to import. Training and the
loss stay with the torch model; the tests hold both to the same codes (within 1e-6).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.models.base import ArrayModule, PretrainedMixin

MODALITIES = ("image", "text")
MASKS = ("topk", "topk_or_bias", "all")


@dataclass(frozen=True)
class SRConfig:
    text_dim: int = 384  # k of the text backbone (MiniLM 384, CLIP ViT-B/32 512)
    image_dim: int = 384  # k of the image backbone; equals text_dim for aligned backbones
    latent_dim: int = 1000  # d: concept dimensions, aligned with the SPINE hidden units
    shared: bool = True  # one encoder/decoder for both modalities (backbone already aligned)
    top_k: int = 64  # TopK part of the mask, at training and inference
    activation: str = "relu"  # "relu": non-negative codes, magnitudes mean presence; "none"
    tau: float = 0.05  # InfoNCE temperature
    contrastive_weight: float = 1.0  # lambda in  L = L_rec + lambda * L_nce
    recon_weight: float = 1.0  # weight of the reconstruction term
    inference_mask: str = "topk"  # "topk" | "topk_or_bias" (text with a caption bias)
    inference_top_k: int | None = None  # TopK at inference (None: top_k); set by validation

    def __post_init__(self) -> None:
        if self.activation not in ("relu", "none"):
            raise SparsemmError(f"SR activation must be 'relu' or 'none', not {self.activation!r}")
        if self.inference_mask not in ("topk", "topk_or_bias"):
            raise SparsemmError(f"unknown SR inference_mask {self.inference_mask!r}")
        if not 0 < self.top_k <= self.latent_dim:
            raise SparsemmError(f"top_k must be in 1..latent_dim ({self.latent_dim})")
        if self.shared and self.text_dim != self.image_dim:
            raise SparsemmError("a shared SR encoder needs text_dim == image_dim")
        # "not (x > 0)" refuses NaN too; tau = 0 divides the InfoNCE logits by zero
        if not (0 < self.tau < float("inf")):
            raise SparsemmError(f"tau (--tau) must be a positive number, got {self.tau}")
        for name in ("contrastive_weight", "recon_weight"):
            if not (0 <= getattr(self, name) < float("inf")):
                raise SparsemmError(f"{name} must be a non-negative number")


@dataclass(frozen=True)
class EncodeArgs:
    """The checked arguments of an SR ``encode`` (shared by the torch and numpy models)."""

    x: np.ndarray  # (n, k) float32, finite
    k: int  # TopK at inference
    mask: str  # one of MASKS
    use_bias: bool  # OR the sentence bias into the mask


def check_encode_args(
    config: SRConfig,
    x: np.ndarray,
    modality: str,
    bias: sp.csr_matrix | np.ndarray | None,
    top_k: int | None,
    mask: str | None,
) -> EncodeArgs:
    """Refuse what an SR encode cannot code (SparsemmError saying what to do)."""
    if modality not in MODALITIES:
        raise SparsemmError(f"modality must be one of {MODALITIES}, not {modality!r}")
    k_in = config.image_dim if modality == "image" else config.text_dim
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != k_in:
        raise SparsemmError(
            f"SR model expects {modality} embeddings of dimension {k_in}, got shape "
            f"{x.shape}; was the collection encoded with another encoder?"
        )
    if not np.isfinite(x).all():
        raise SparsemmError("embeddings contain NaN or inf; re-encode those items")
    mask = mask or config.inference_mask
    if mask not in MASKS:
        raise SparsemmError(f"unknown SR mask {mask!r}; use topk, topk_or_bias or all")
    k = top_k or config.inference_top_k or config.top_k
    if not 0 < k <= config.latent_dim:
        raise SparsemmError(f"top_k must be in 1..{config.latent_dim}, got {k}")
    if bias is not None and bias.shape != (len(x), config.latent_dim):
        raise SparsemmError(f"bias must have shape ({len(x)}, {config.latent_dim})")
    return EncodeArgs(x, int(k), mask, bias is not None and mask == "topk_or_bias")


def stack_codes(blocks: list[sp.csr_matrix], latent_dim: int) -> sp.csr_matrix:
    """One float32 CSR (n, d) of per-batch codes, explicit zeros dropped."""
    if not blocks:
        return sp.csr_matrix((0, latent_dim), dtype=np.float32)
    out = sp.vstack(blocks, format="csr").astype(np.float32)
    out.eliminate_zeros()
    return out


def topk_rows(z: np.ndarray, k: int) -> np.ndarray:
    """(n, d) bool mask of each row's k largest entries (all of them when k >= d)."""
    n, d = z.shape
    if k >= d:
        return np.ones((n, d), dtype=bool)
    idx = np.argpartition(-z, k - 1, axis=1)[:, :k]
    m = np.zeros((n, d), dtype=bool)
    np.put_along_axis(m, idx, True, axis=1)
    return m


class SRLite(PretrainedMixin, ArrayModule):
    """An SR model's encoder (and decoder) as numpy arrays: :meth:`encode` gives the codes
    ``SRModel.encode`` gives, from the same model folder."""

    config_class: ClassVar[type] = SRConfig
    model_type: ClassVar[str] = "sr"

    def __init__(self, config: SRConfig) -> None:
        super().__init__()
        self.config = config
        d = config.latent_dim
        # the torch model's nn.Linear weights: (out, in) and (out,)
        for side, k in (("text", config.text_dim),) + (
            () if config.shared else (("image", config.image_dim),)
        ):
            self.declare(f"enc_{side}.weight", d, k)
            self.declare(f"enc_{side}.bias", d)
            self.declare(f"dec_{side}.weight", k, d)
            self.declare(f"dec_{side}.bias", k)

    def _side(self, modality: str) -> str:
        return "image" if modality == "image" and not self.config.shared else "text"

    def latent(self, x: np.ndarray, modality: str) -> np.ndarray:
        """E_d (n, d) float32 from backbone embeddings x (n, k)."""
        side = self._side(modality)
        z = x @ self.array(f"enc_{side}.weight").T + self.array(f"enc_{side}.bias")
        return np.maximum(z, 0.0) if self.config.activation == "relu" else z

    def encode(
        self,
        x: np.ndarray,
        modality: str,
        bias: sp.csr_matrix | np.ndarray | None = None,
        batch_size: int = 4096,
        top_k: int | None = None,
        mask: str | None = None,
    ) -> sp.csr_matrix:
        """Sparse SR codes (n, d) float32 for backbone embeddings x (n, k); the arguments
        are those of :meth:`sparsemm.models.sr.SRModel.encode`."""
        a = check_encode_args(self.config, x, modality, bias, top_k, mask)
        blocks = []
        for s in range(0, len(a.x), batch_size):
            z = self.latent(a.x[s : s + batch_size], modality)
            if a.mask != "all":
                m = topk_rows(z, a.k)
                if a.use_bias:
                    assert bias is not None
                    m |= sp.csr_matrix(bias[s : s + batch_size]).toarray() > 0
                z = z * m
            blocks.append(sp.csr_matrix(z))
        return stack_codes(blocks, self.config.latent_dim)

    def reconstruct(self, codes: sp.csr_matrix, modality: str) -> np.ndarray:
        """Decoder output (n, k) for sparse codes (n, d)."""
        side = self._side(modality)
        dense = np.asarray(codes.todense(), dtype=np.float32)
        return dense @ self.array(f"dec_{side}.weight").T + self.array(f"dec_{side}.bias")

    @classmethod
    def from_model(cls, model: PretrainedMixin) -> SRLite:
        """The numpy side of an in-memory SR model (``SRModel``): same config, its weights
        copied (what ``from_pretrained`` of its saved folder gives)."""
        lite = cls(model.config)
        state = model.state_dict()  # type: ignore[attr-defined]
        lite.load_state_dict({k: v.detach().cpu().numpy() for k, v in state.items()})
        lite.training_info = model.training_info
        return lite
