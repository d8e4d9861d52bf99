"""SR: lightweight sparse disentangled representations over frozen dense embeddings.

Method of "Answering Multimodal Exclusion Queries with Lightweight Sparse Disentangled
Representations" (the SR paper). A linear encoder maps a frozen backbone embedding
E_k (n, k) to E_d = E_k W_e + b_e (n, d); during training the latent is masked by
``1[e_S > 0] OR TopK(E_d)``, where e_S is the caption's SPINE sentence bias, so concept
dimension j of the code lines up with SPINE dimension j; SR = mask * E_d. A linear decoder
maps SR back to k dims. Loss = reconstruction (both modalities) + lambda * symmetric InfoNCE
over the SR codes with temperature tau.

At inference an item has no caption, so the mask is TopK(E_d) alone (``inference_mask``
"topk"); text queries may OR in their own sentence bias ("topk_or_bias").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from sparsemm.errors import SparsemmError
from sparsemm.models.base import PretrainedMixin, topk_mask

MODALITIES = ("image", "text")


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


class SRModel(PretrainedMixin, nn.Module):
    config_class: ClassVar[type] = SRConfig
    model_type: ClassVar[str] = "sr"

    def __init__(self, config: SRConfig) -> None:
        super().__init__()
        self.config = config
        d = config.latent_dim
        self.enc_text = nn.Linear(config.text_dim, d)
        self.dec_text = nn.Linear(d, config.text_dim)
        # Shared mode registers one encoder/decoder pair (no aliased parameters on disk).
        self.enc_image: nn.Linear | None = None
        self.dec_image: nn.Linear | None = None
        if not config.shared:
            self.enc_image = nn.Linear(config.image_dim, d)
            self.dec_image = nn.Linear(d, config.image_dim)

    def _pair(self, modality: str) -> tuple[nn.Linear, nn.Linear]:
        if modality == "image" and self.enc_image is not None and self.dec_image is not None:
            return self.enc_image, self.dec_image
        return self.enc_text, self.dec_text

    # -- pieces -----------------------------------------------------------------------
    def latent(self, x: torch.Tensor, modality: str) -> torch.Tensor:
        """E_d (n, d) from backbone embeddings x (n, k)."""
        z = self._pair(modality)[0](x)
        return F.relu(z) if self.config.activation == "relu" else z

    def mask(self, latent: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Training mask 1[e_S > 0] OR TopK(E_d); TopK alone when ``bias`` is None."""
        m = topk_mask(latent, self.config.top_k)
        if bias is not None:
            m = m | (bias > 0)
        return m

    def decode(self, sr: torch.Tensor, modality: str) -> torch.Tensor:
        return self._pair(modality)[1](sr)

    def forward(
        self, image: torch.Tensor, text: torch.Tensor, bias: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """Codes and reconstructions for a batch of (image, caption) pairs.

        image (n, k_img), text (n, k_txt), bias (n, d) sentence bias of the caption or None.
        """
        out = {}
        for name, x in (("image", image), ("text", text)):
            z = self.latent(x, name)
            sr = z * self.mask(z, bias)
            out[f"sr_{name}"] = sr
            out[f"rec_{name}"] = self.decode(sr, name)
        return out

    # -- inference ----------------------------------------------------------------------
    @torch.no_grad()
    def encode(
        self,
        x: np.ndarray,
        modality: str,
        bias: sp.csr_matrix | np.ndarray | None = None,
        batch_size: int = 4096,
        top_k: int | None = None,
        mask: str | None = None,
    ) -> sp.csr_matrix:
        """Sparse SR codes (n, d) float32 for backbone embeddings x (n, k).

        ``top_k`` and ``mask`` override the config's inference settings: ``mask`` is "topk",
        "topk_or_bias" (OR the given sentence ``bias`` (n, d) into the mask) or "all" (no
        mask: every non-zero of E_d, only sparse with the ReLU activation).
        """
        if modality not in MODALITIES:
            raise SparsemmError(f"modality must be one of {MODALITIES}, not {modality!r}")
        k_in = self.config.image_dim if modality == "image" else self.config.text_dim
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != k_in:
            raise SparsemmError(
                f"SR model expects {modality} embeddings of dimension {k_in}, got shape "
                f"{x.shape}; was the collection encoded with another encoder?"
            )
        if not np.isfinite(x).all():
            raise SparsemmError("embeddings contain NaN or inf; re-encode those items")
        mask = mask or self.config.inference_mask
        if mask not in ("topk", "topk_or_bias", "all"):
            raise SparsemmError(f"unknown SR mask {mask!r}; use topk, topk_or_bias or all")
        k = top_k or self.config.inference_top_k or self.config.top_k
        if not 0 < k <= self.config.latent_dim:
            raise SparsemmError(f"top_k must be in 1..{self.config.latent_dim}, got {k}")
        use_bias = bias is not None and mask == "topk_or_bias"
        if bias is not None and bias.shape != (len(x), self.config.latent_dim):
            raise SparsemmError(f"bias must have shape ({len(x)}, {self.config.latent_dim})")
        self.eval()
        blocks = []
        for s in range(0, len(x), batch_size):
            z = self.latent(torch.from_numpy(x[s : s + batch_size]), modality)
            if mask == "all":
                sr = z.numpy()
            else:
                m = topk_mask(z, k)
                if use_bias:
                    assert bias is not None
                    block = bias[s : s + batch_size]
                    dense = sp.csr_matrix(block).toarray()
                    m = m | torch.from_numpy(dense > 0)
                sr = (z * m).numpy()
            blocks.append(sp.csr_matrix(sr))
        if not blocks:
            return sp.csr_matrix((0, self.config.latent_dim), dtype=np.float32)
        out = sp.vstack(blocks, format="csr").astype(np.float32)
        out.eliminate_zeros()
        return out

    @torch.no_grad()
    def reconstruct(self, codes: sp.csr_matrix, modality: str) -> np.ndarray:
        """Decoder output (n, k) for sparse codes (n, d)."""
        dense = torch.from_numpy(np.asarray(codes.todense(), dtype=np.float32))
        return self.decode(dense, modality).numpy()
