"""A BERT sentence encoder's forward pass in plain torch, for a handful of query texts.

Importing sentence-transformers (which imports transformers and scikit-learn) takes
several seconds: most of a cold ``sparsemm search``. A query is a few words, so
:class:`BertLite` embeds it from the same files (``config.json``, ``model.safetensors``,
``tokenizer.json`` read by the ``tokenizers`` library) with the same arithmetic: the BERT
encoder (Devlin et al., 2019: embeddings, then post-LayerNorm self-attention and GELU
feed-forward blocks), padding masked out of attention, and mean pooling over the real
tokens, as sentence-transformers' ``Pooling(mean)`` does. The texts of a call are packed
rather than padded outside attention (see :meth:`BertLite.encode`). The tests check it against
sentence-transformers on the packaged all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError


def lite_supported(folder: Path) -> bool:
    """True for a sentence-transformers folder this module reproduces exactly: a BERT with
    absolute positions and GELU, mean pooling only, a ``tokenizer.json``."""
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        pool = json.loads((folder / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    pooling_modes = {k for k, v in pool.items() if k.startswith("pooling_mode") and v}
    return (
        cfg.get("model_type") == "bert"
        and cfg.get("position_embedding_type", "absolute") == "absolute"
        and cfg.get("hidden_act") == "gelu"
        and pooling_modes == {"pooling_mode_mean_tokens"}
        and kinds in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"])
        and (folder / "tokenizer.json").is_file()
        and (folder / "model.safetensors").is_file()
    )


class BertLite:
    """Mean-pooled BERT embeddings of texts, ``encode(texts) -> (n, hidden)`` float32
    (unit length when the folder's pipeline ends in a Normalize module)."""

    def __init__(self, folder: str | Path) -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        folder = Path(folder)
        if not lite_supported(folder):
            raise SparsemmError(f"{folder} is not a mean-pooled BERT sentence encoder")
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        st_cfg = folder / "sentence_bert_config.json"
        max_len = int(cfg.get("max_position_embeddings", 512))
        if st_cfg.is_file():
            max_len = int(
                json.loads(st_cfg.read_text(encoding="utf-8")).get("max_seq_length", max_len)
            )
        self.hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        # a Normalize module after pooling: sentence-transformers returns unit vectors
        self.normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_len)
        self.tokenizer.enable_padding(pad_id=int(cfg.get("pad_token_id", 0)))
        weights = load_file(str(folder / "model.safetensors"))
        # checkpoints saved from BertForX carry a "bert." prefix
        self.w: dict[str, Any] = {k.removeprefix("bert."): v.float() for k, v in weights.items()}
        # one (3h, h) projection for query, key and value: one matrix product, not three
        for i in range(self.layers):
            p = f"encoder.layer.{i}.attention.self"
            for part in ("weight", "bias"):
                self.w[f"{p}.qkv.{part}"] = torch.cat(
                    [self.w.pop(f"{p}.{name}.{part}") for name in ("query", "key", "value")]
                )

    def _norm(self, x: Any, name: str) -> Any:
        import torch.nn.functional as F

        return F.layer_norm(
            x, (self.hidden,), self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps
        )

    def _linear(self, x: Any, name: str) -> Any:
        import torch.nn.functional as F

        return F.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` -> ``(n, hidden)`` float32.

        The texts are packed, not padded: the linear layers, LayerNorms and GELUs (nearly
        all the arithmetic) run over the real tokens only, and only attention, which
        needs a text's tokens side by side, scatters them into a padded batch and back.
        A query's texts differ in length (an include clause and one-word exclusions), so
        packing skips the padding rows that a padded batch would multiply through every
        layer; the embeddings are the same.
        """
        import torch

        texts = list(texts)
        if not texts:
            return np.zeros((0, self.hidden), np.float32)
        enc = self.tokenizer.encode_batch(texts)
        lens = [sum(e.attention_mask) for e in enc]
        n, length = len(enc), max(lens)
        ids = torch.tensor(
            [i for e, m in zip(enc, lens, strict=True) for i in e.ids[:m]], dtype=torch.long
        )
        types = torch.tensor(
            [i for e, m in zip(enc, lens, strict=True) for i in e.type_ids[:m]], dtype=torch.long
        )
        pos = torch.cat([torch.arange(m) for m in lens])  # (T,) position within its text
        owner = torch.repeat_interleave(torch.arange(n), torch.tensor(lens))  # (T,) text
        slot = owner * length + pos  # (T,) place in the padded (n * L) layout
        lens_t = torch.tensor(lens, dtype=torch.float32)
        h, dh, heads = self.hidden, self.hidden // self.heads, self.heads
        w = self.w
        with torch.no_grad():
            x = (
                w["embeddings.word_embeddings.weight"][ids]
                + w["embeddings.position_embeddings.weight"][pos]
                + w["embeddings.token_type_embeddings.weight"][types]
            )
            x = self._norm(x, "embeddings.LayerNorm")  # (T, h)
            # padding keys get the lowest score, so softmax gives them no weight
            real = torch.arange(length)[None, :] < lens_t[:, None]  # (n, L)
            bias = (~real).float()[:, None, None, :] * torch.finfo(torch.float32).min
            scale = 1.0 / math.sqrt(dh)
            padded = torch.zeros(n * length, 3 * h)
            for i in range(self.layers):
                p = f"encoder.layer.{i}"
                padded[slot] = self._linear(x, f"{p}.attention.self.qkv")  # (T, 3h)
                qkv = padded.view(n, length, 3, heads, dh).permute(2, 0, 3, 1, 4)
                q, k, v = qkv[0], qkv[1], qkv[2]  # (n, heads, L, dh)
                att = torch.softmax(q @ k.transpose(-1, -2) * scale + bias, dim=-1)
                ctx = (att @ v).transpose(1, 2).reshape(n * length, h)[slot]  # (T, h)
                x = self._norm(
                    self._linear(ctx, f"{p}.attention.output.dense") + x,
                    f"{p}.attention.output.LayerNorm",
                )
                inner = torch.nn.functional.gelu(self._linear(x, f"{p}.intermediate.dense"))
                x = self._norm(
                    self._linear(inner, f"{p}.output.dense") + x, f"{p}.output.LayerNorm"
                )
            pooled = torch.zeros(n, h).index_add_(0, owner, x) / lens_t.clamp(min=1.0)[:, None]
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=1)
        out: np.ndarray = pooled.numpy().astype(np.float32)
        return out
