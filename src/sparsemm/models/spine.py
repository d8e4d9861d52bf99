"""SPINE: sparse interpretable word vectors from dense ones (the model; its training is
:mod:`sparsemm.train.spine`, the word vectors it makes :mod:`sparsemm.words.spine`).

Subramanian, Pruthi, Jhamtani, Berg-Kirkpatrick, Hovy (2018), "SPINE: SParse Interpretable
Neural Embeddings", AAAI. A denoising autoencoder over pre-trained word vectors:

    z     = min(1, max(0, W_e (x + eps) + b_e))     eps ~ N(0, noise_std^2 I), training only
    x_hat = W_d z + b_d

    loss  = recon_weight * MSE(x_hat, x)                                   (RL)
          + asl_weight * sum_h max(0, mean_batch(z_h) - rho*)^2           (ASL, average sparsity)
          + psl_weight * mean(z * (1 - z))                                 (PSL, partial sparsity)

ASL keeps every hidden unit active for at most a share rho* (0.15) of the words; PSL pushes
each activation to exactly 0 or 1. The capped ReLU makes "off" an exact 0, so codes are
truly sparse and a hidden unit reads as a concept (its top words share a meaning).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from sparsemm.errors import SparsemmError
from sparsemm.models.base import PretrainedMixin
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors


@dataclass(frozen=True)
class SpineConfig:
    """Hyper-parameters of the SPINE autoencoder (defaults: the paper, tuned for GloVe 50-d)."""

    input_dim: int = 50  # dimension of the dense input word vectors (GloVe 6B 50-d here)
    hidden_dim: int = 1000  # over-complete code size; the paper uses 1000
    noise_std: float = 0.4  # std of the input noise (denoising AE); 0.4 keeps units alive on GloVe
    rho_star: float = 0.15  # target average activation per hidden unit (ASL), as in the paper
    recon_weight: float = 1.0  # weight of the reconstruction MSE (RL)
    asl_weight: float = 1.0  # weight of the average sparsity loss
    psl_weight: float = 1.0  # weight of the partial sparsity loss

    def __post_init__(self) -> None:
        if self.input_dim < 1 or self.hidden_dim < 1:
            raise SparsemmError("SpineConfig: input_dim and hidden_dim must be positive")
        if not 0.0 < self.rho_star < 1.0:
            raise SparsemmError(f"SpineConfig: rho_star must be in (0, 1), got {self.rho_star}")
        if self.noise_std < 0:
            raise SparsemmError(f"SpineConfig: noise_std must be >= 0, got {self.noise_std}")


def capped_relu(x: torch.Tensor) -> torch.Tensor:
    """min(1, max(0, x)): exact zeros below 0, saturation at 1 (SPINE, Sec. 3)."""
    return x.clamp(min=0.0, max=1.0)


class SPINE(PretrainedMixin, nn.Module):
    """Denoising autoencoder ``(n, input_dim) -> (n, hidden_dim)`` code in [0, 1]."""

    config_class = SpineConfig
    model_type = "spine"

    def __init__(self, config: SpineConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = nn.Linear(config.input_dim, config.hidden_dim)
        self.decoder = nn.Linear(config.hidden_dim, config.input_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (b, d) -> code ``z`` (b, hidden) and reconstruction ``x_hat`` (b, d).

        Noise is added by the training loop, not here, so ``forward`` is deterministic.
        """
        z = capped_relu(self.encoder(x))
        return z, self.decoder(z)

    @torch.no_grad()
    def encode(self, vectors: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """Dense word vectors ``(n, input_dim)`` -> SPINE codes ``(n, hidden_dim)`` float32."""
        arr = np.asarray(vectors, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != self.config.input_dim:
            raise SparsemmError(
                f"SPINE expects (n, {self.config.input_dim}) vectors, got shape {arr.shape}; "
                "use the word vectors the model was trained on"
            )
        was_training = self.training
        self.eval()
        out = np.empty((arr.shape[0], self.config.hidden_dim), dtype=np.float32)
        for start in range(0, arr.shape[0], batch_size):
            batch = torch.from_numpy(np.ascontiguousarray(arr[start : start + batch_size]))
            out[start : start + batch.shape[0]] = self(batch)[0].numpy()
        self.train(was_training)
        return out


def build_sparse_vectors(
    spine: SPINE, word_vectors: WordVectors, batch_size: int = 4096
) -> SparseWordVectors:
    """Encode every word of ``word_vectors`` with ``spine`` (no noise) into CSR codes."""
    blocks = []
    for start in range(0, len(word_vectors), batch_size):
        codes = spine.encode(word_vectors.vectors[start : start + batch_size])
        blocks.append(sp.csr_matrix(codes))
    matrix = (
        sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, spine.config.hidden_dim))
    )
    return SparseWordVectors(word_vectors.words, matrix)
