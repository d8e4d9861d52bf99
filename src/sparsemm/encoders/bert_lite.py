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
import logging
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError

logger = logging.getLogger(__name__)


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
        self.tokenizer.no_padding()  # texts are packed (encode), never padded
        weights = load_file(str(folder / "model.safetensors"))
        # checkpoints saved from BertForX carry a "bert." prefix
        # only the forward pass's tensors are kept (the fused q/k/v replace their parts)
        w: dict[str, Any] = {k.removeprefix("bert."): v.float() for k, v in weights.items()}
        self.emb = [
            w[f"embeddings.{name}"]
            for name in (
                "word_embeddings.weight",
                "position_embeddings.weight",
                "token_type_embeddings.weight",
                "LayerNorm.weight",
                "LayerNorm.bias",
            )
        ]
        self.blocks: list[Any] = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            # one (3h, h) projection for query, key and value: one matrix product, not three
            for part in ("weight", "bias"):
                self.blocks.append(
                    torch.cat(
                        [w[f"{p}.attention.self.{q}.{part}"] for q in ("query", "key", "value")]
                    )
                )
            for name in (
                "attention.output.dense",
                "attention.output.LayerNorm",
                "intermediate.dense",
                "output.dense",
                "output.LayerNorm",
            ):
                self.blocks += [w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"]]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` -> ``(n, hidden)`` float32.

        The texts are packed, not padded: the linear layers, LayerNorms and GELUs (nearly
        all the arithmetic) run over the real tokens only, and only attention, which
        needs a text's tokens side by side, scatters them into a padded batch and back.
        A query's texts differ in length (an include clause and one-word exclusions), so
        packing skips the padding rows that a padded batch would multiply through every
        layer; the embeddings are the same. The forward pass is one TorchScript call
        (:func:`forward_function`), which runs without Python's GIL.
        """
        import torch

        texts = list(texts)
        if not texts:
            return np.zeros((0, self.hidden), np.float32)
        enc = self.tokenizer.encode_batch(texts)  # no padding: each text's own tokens
        lens = [len(e.ids) for e in enc]
        ids = torch.from_numpy(np.concatenate([np.asarray(e.ids, np.int64) for e in enc]))
        types = torch.from_numpy(np.concatenate([np.asarray(e.type_ids, np.int64) for e in enc]))
        with torch.no_grad():
            pooled = forward_function()(
                ids,
                types,
                torch.tensor(lens, dtype=torch.long),
                self.heads,
                self.eps,
                self.emb,
                self.blocks,
                self.normalize,
            )
        out: np.ndarray = pooled.numpy().astype(np.float32)
        return out


_FORWARD: Any = None
_FORWARD_LOCK = threading.Lock()


def forward_function() -> Any:
    """:func:`sparsemm.encoders.bert_forward.forward` compiled by TorchScript, once per
    process (under 0.1 s). A scripted call runs its graph without taking Python's GIL
    between operators: in a server, the query encoder's worker thread computes while
    request threads run Python, instead of queueing for the GIL after each of the ~100
    operators of a pass. If TorchScript is unavailable (a torch without ``torch.jit``), the
    same function runs eagerly: the same arithmetic."""
    global _FORWARD
    if _FORWARD is not None:  # every encode call asks: no lock once compiled
        return _FORWARD
    with _FORWARD_LOCK:
        if _FORWARD is None:
            import torch

            from sparsemm.encoders.bert_forward import forward as _forward

            try:
                with warnings.catch_warnings():
                    # torch 2.13 marks torch.jit as deprecated; it still compiles and runs
                    # (pinned in constraints.txt), and the fallback below keeps working
                    warnings.simplefilter("ignore", DeprecationWarning)
                    _FORWARD = torch.jit.script(_forward)
            except Exception as exc:  # any scripting failure: run the same function eagerly
                logger.warning("TorchScript unavailable (%s); query encoding runs eagerly", exc)
                _FORWARD = _forward
        return _FORWARD
