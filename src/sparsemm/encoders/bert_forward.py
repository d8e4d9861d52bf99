"""The BERT forward pass of :mod:`sparsemm.encoders.bert_lite` as one function over packed
texts, written so that TorchScript compiles it (module-level imports, typed arguments).
It imports torch, so :mod:`sparsemm.encoders.bert_lite` loads it only when it encodes."""

import math
from typing import List  # noqa: UP035 - TorchScript reads typing.List

import torch
import torch.nn.functional as F


def forward(
    ids: torch.Tensor,
    types: torch.Tensor,
    lens: torch.Tensor,
    heads: int,
    eps: float,
    emb: List[torch.Tensor],  # noqa: UP006 - TorchScript reads typing.List
    blocks: List[torch.Tensor],  # noqa: UP006
    normalize: bool,
) -> torch.Tensor:  # pragma: no cover - compiled by TorchScript; tested through BertLite.encode
    """The BERT forward pass over packed texts -> mean-pooled (n, h) embeddings.

    ids/types (T,): the texts' tokens one after another; lens (n,): tokens per text. emb:
    word, position and token-type tables, embedding LayerNorm weight and bias. blocks:
    12 tensors per layer (fused q/k/v weight and bias, attention output dense, its
    LayerNorm, intermediate dense, output dense, its LayerNorm; weight then bias each).
    """
    n = int(lens.shape[0])
    length = int(lens.max())
    h = int(emb[0].shape[1])
    dh = h // heads
    owner = torch.repeat_interleave(torch.arange(n), lens)  # (T,) text of each token
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(int(ids.shape[0])) - starts[owner]  # (T,) position within its text
    slot = owner * length + pos  # (T,) place in the padded (n * L) layout
    x = emb[0][ids] + emb[1][pos] + emb[2][types]
    x = F.layer_norm(x, [h], emb[3], emb[4], eps)
    # padding keys get the lowest float32, so softmax gives them no weight
    real = torch.arange(length).unsqueeze(0) < lens.unsqueeze(1)  # (n, L)
    bias = (~real).to(torch.float32).unsqueeze(1).unsqueeze(1) * -3.4028234663852886e38
    scale = 1.0 / math.sqrt(dh)
    padded = torch.zeros(n * length, 3 * h)
    for i in range(len(blocks) // 12):
        w = blocks[12 * i : 12 * i + 12]
        padded[slot] = F.linear(x, w[0], w[1])  # (T, 3h)
        qkv = padded.view(n, length, 3, heads, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (n, heads, L, dh)
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale + bias, dim=-1)
        ctx = torch.matmul(att, v).transpose(1, 2).reshape(n * length, h)[slot]  # (T, h)
        x = F.layer_norm(F.linear(ctx, w[2], w[3]) + x, [h], w[4], w[5], eps)
        inner = F.gelu(F.linear(x, w[6], w[7]))
        x = F.layer_norm(F.linear(inner, w[8], w[9]) + x, [h], w[10], w[11], eps)
    pooled = torch.zeros(n, h).index_add_(0, owner, x) / lens.clamp(min=1).to(x.dtype).unsqueeze(1)
    if normalize:
        pooled = F.normalize(pooled, dim=1)
    return pooled
