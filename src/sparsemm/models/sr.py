"""SR: lightweight sparse disentangled representations over frozen dense embeddings.

Method of "Answering Multimodal Exclusion Queries with Lightweight Sparse Disentangled
Representations" (the SR paper). A linear encoder maps a frozen backbone embedding
E_k (n, k) to E_d = E_k W_e + b_e (n, d); during training the latent is masked by
``1[e_S > 0] OR TopK(E_d)``, where e_S is the caption's SPINE sentence bias, so concept
dimension j of the code lines up with SPINE dimension j; SR = mask * E_d. A linear decoder
maps SR back to k dims. Loss = reconstruction (both modalities) + lambda * symmetric InfoNCE
over the SR codes with temperature tau.

At inference an item has no caption, so the mask is TopK(E_d) alone (``inference_mask``
"topk"); text queries may OR in their own sentence bias ("topk_or_bias"). A search codes
with :class:`sparsemm.models.sr_lite.SRLite`, the same encode in numpy (no torch import),
which also holds the config.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from sparsemm.models.base import PretrainedMixin, topk_mask
from sparsemm.models.sr_lite import MODALITIES, SRConfig, check_encode_args, stack_codes

__all__ = ["MODALITIES", "SRConfig", "SRModel"]


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
        a = check_encode_args(self.config, x, modality, bias, top_k, mask)
        self.eval()
        blocks = []
        for s in range(0, len(a.x), batch_size):
            z = self.latent(torch.from_numpy(a.x[s : s + batch_size]), modality)
            if a.mask == "all":
                sr = z.numpy()
            else:
                m = topk_mask(z, a.k)
                if a.use_bias:
                    assert bias is not None
                    dense = sp.csr_matrix(bias[s : s + batch_size]).toarray()
                    m = m | torch.from_numpy(dense > 0)
                sr = (z * m).numpy()
            blocks.append(sp.csr_matrix(sr))
        return stack_codes(blocks, self.config.latent_dim)

    @torch.no_grad()
    def reconstruct(self, codes: sp.csr_matrix, modality: str) -> np.ndarray:
        """Decoder output (n, k) for sparse codes (n, d)."""
        dense = torch.from_numpy(np.asarray(codes.todense(), dtype=np.float32))
        return self.decode(dense, modality).numpy()
