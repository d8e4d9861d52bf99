"""VDR: vocabulary-space disentangled representations (Zhou et al., ICLR 2024).

Method of "Retrieval-based Disentangled Representation Learning with Natural Language
Supervision" (Zhou, Li, Shang, Jiang, Liu, Chen). Every input is encoded into the |V|-dim
token space of a BERT vocabulary, so each dimension of a code is a word piece:

* text: transformer hidden states H (L, h) -> LayerNorm -> MLM-style projection onto the
  vocabulary with the model's own (tied) word-embedding matrix E (V, h): logits H E^T
  (L, V); special / unused tokens are removed; max-pool over the tokens; elu1p
  (x + 1 for x >= 0, e^x otherwise); L2-normalise (cross-modal setting); top-k sparsify,
  OR'd with the bag-of-words of the tokens present (the *non-parametric entry*).
* image: spatial / patch features P (n_patches, d_img) -> linear adapter to h -> LayerNorm
  -> the same projection E^T -> max-pool over patches -> elu1p -> L2-normalise -> top-k
  (an image has no tokens, so no bag-of-words).

Codes are ``scipy.sparse.csr_matrix`` (n, V) whose column j is token id j of the tokenizer
(invalid tokens are never active), so they go straight into
:class:`sparsemm.index.InvertedIndex` and explain themselves: an item's top tokens (a word
cloud) and, for a query-item pair, the per-token contributions q_j x_j that sum to the
score (:func:`explain_pair`, VDR's "retrieval reasoning").

Internally the vocabulary is *compacted* to the valid token ids (V' <= V), which saves the
logits of the tokens that can never be active.

:func:`load_published_vdr` loads the authors' released text-to-text checkpoints (e.g.
``vsearch/vdr-nq`` on the Hugging Face hub) when a network is available.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from sparsemm.errors import SparsemmError, require_extra
from sparsemm.models.base import PretrainedMixin, topk_mask

logger = logging.getLogger(__name__)

VOCAB_FILTERS = ("alnum", "special", "shift")
TOWERS = ("query", "document")
# BertConfig fields that define the transformer's shape; written into config.json so a
# saved model rebuilds without any hub access.
BERT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",
    "initializer_range",
)
_UNUSED_RE = re.compile(r"^\[unused\d+\]$")
_ALNUM_RE = re.compile(r"[a-z0-9]")


@dataclass(frozen=True)
class VDRConfig:
    text: Mapping[str, Any]  # BertConfig fields of the text transformer (BERT_FIELDS)
    image_dim: int | None = 384  # feature dim of the image side's patches; None: text only
    text_top_k: int = 512  # VDR: 768 text-to-text, 512 cross-modal
    image_top_k: int = 512  # top-k of image codes (VDR cross-modal: 512)
    bow: bool = True  # the non-parametric entry: OR a text's bag-of-words into its mask
    normalize: bool = True  # L2-normalise codes (VDR cross-modal: yes; text-to-text: no)
    max_length: int = 77  # text tokens kept (VDR: 77 cross-modal, 256 text-to-text)
    vocab_filter: str = "alnum"  # which token ids may be active (see vocab_mask)
    vocab_shift: int = 999  # "shift" filter: first valid id (published VDR: 999 for BERT)
    shared_text: bool = True  # one text tower for queries and documents (published t2t: 2)
    pool_padding: bool = False  # max-pool over padding too (reproduces published VDR)

    def __post_init__(self) -> None:
        missing = [f for f in ("vocab_size", "hidden_size") if f not in self.text]
        if missing:
            raise SparsemmError(f"VDR text config lacks {missing}; build it with from_bert()")
        if self.vocab_filter not in VOCAB_FILTERS:
            raise SparsemmError(
                f"vocab_filter must be one of {VOCAB_FILTERS}, not {self.vocab_filter!r}"
            )
        v = int(self.text["vocab_size"])
        sides = ("text_top_k",) + (("image_top_k",) if self.image_dim is not None else ())
        for name in sides:
            k = getattr(self, name)
            if not 0 < k <= v:
                raise SparsemmError(f"{name} must be in 1..{v} (the vocabulary), got {k}")
        if self.image_dim is not None and self.image_dim < 1:
            raise SparsemmError("image_dim must be positive (or None for a text-only model)")
        if self.max_length < 2:
            raise SparsemmError("max_length must be at least 2 tokens")

    @property
    def vocab_size(self) -> int:
        return int(self.text["vocab_size"])

    @property
    def hidden_size(self) -> int:
        return int(self.text["hidden_size"])


# ----------------------------------------------------------------------------- pieces


def elu1p(x: torch.Tensor) -> torch.Tensor:
    """elu1p(x) = x + 1 for x >= 0, e^x otherwise (VDR's activation; positive, smooth)."""
    return F.elu(x) + 1.0


def masked_max_pool(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Max over dim 1 of x (n, L, V) among positions where mask (n, L) is True -> (n, V).

    A row with no allowed position gives -inf everywhere (elu1p maps it to 0).
    """
    if mask is not None:
        x = x.masked_fill(~mask.bool()[:, :, None], float("-inf"))
    return x.max(dim=1).values


def sparsify(full: torch.Tensor, k: int, bow: torch.Tensor | None = None) -> torch.Tensor:
    """VDR's sparse code: ``full * (TopK(full) OR bow)``; full (n, V), bow (n, V) or None."""
    m = topk_mask(full, k)
    if bow is not None:
        m = m | (bow > 0)
    return full * m


def vocab_mask(
    tokens: Sequence[str],
    vocab_filter: str = "alnum",
    shift: int = 999,
    special: Sequence[str] = (),
) -> np.ndarray:
    """(V,) bool: which token ids may be active in a code.

    ``special``: the tokenizer's special tokens ([PAD], [CLS], ...) and ``[unusedN]`` are
    always removed. ``"alnum"`` also removes tokens without an ASCII letter or digit
    (punctuation, symbols, other scripts' single characters - the bag-of-words would
    otherwise switch "." on for nearly every caption); ``"shift"`` keeps ids >= ``shift``
    (the published VDR text checkpoints' rule for the BERT vocabulary).
    """
    if vocab_filter not in VOCAB_FILTERS:
        raise SparsemmError(f"vocab_filter must be one of {VOCAB_FILTERS}, not {vocab_filter!r}")
    sp_set = set(special)
    out = np.zeros(len(tokens), dtype=bool)
    for i, t in enumerate(tokens):
        if vocab_filter == "shift":
            out[i] = i >= shift
            continue
        if t in sp_set or _UNUSED_RE.match(t) or not t:
            continue
        if vocab_filter == "alnum" and not _ALNUM_RE.search(t.removeprefix("##")):
            continue
        out[i] = True
    return out


def resparsify(codes: sp.csr_matrix, k: int, bow: sp.csr_matrix | None = None) -> sp.csr_matrix:
    """Per row, keep the ``k`` largest stored values plus the entries in ``bow``'s row.

    Used to derive codes at a smaller k from codes encoded once at a larger k (exact for
    k <= the encoding k, since the dropped entries were all below the k-th value).
    """
    codes = sp.csr_matrix(codes, dtype=np.float32)
    codes.sort_indices()
    if bow is not None:
        bow = sp.csr_matrix(bow)
        if bow.shape != codes.shape:
            raise SparsemmError(f"bow has shape {bow.shape}, codes {codes.shape}")
    rows, cols, vals = [], [], []
    for i in range(codes.shape[0]):
        lo, hi = codes.indptr[i], codes.indptr[i + 1]
        c, v = codes.indices[lo:hi], codes.data[lo:hi]
        keep = np.zeros(len(v), dtype=bool)
        if len(v):
            keep[np.argsort(-v, kind="stable")[:k]] = True
        if bow is not None:
            keep |= np.isin(c, bow.indices[bow.indptr[i] : bow.indptr[i + 1]])
        rows.append(np.full(int(keep.sum()), i))
        cols.append(c[keep])
        vals.append(v[keep])
    if not rows:
        return sp.csr_matrix(codes.shape, dtype=np.float32)
    out = sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=codes.shape,
        dtype=np.float32,
    )
    out.sort_indices()
    return out


# ----------------------------------------------------------------------- explanations


@dataclass(frozen=True)
class TokenContribution:
    token: str  # the word piece of this dimension
    dim: int  # token id = code column
    query: float  # q_j
    item: float  # x_j
    contribution: float  # q_j * x_j


@dataclass(frozen=True)
class PairExplanation:
    """VDR's retrieval reasoning: score = sum_j q_j x_j over the shared tokens."""

    score: float
    contributions: tuple[TokenContribution, ...]  # largest first; all shared dims

    def top(self, n: int = 10) -> list[TokenContribution]:
        return list(self.contributions[:n])


def _row(code: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) of one code given as a 1-row sparse matrix or a dense (d,) array."""
    if sp.issparse(code):
        r = sp.csr_matrix(code)
        if r.shape != (1, dim):
            raise SparsemmError(f"expected one code of {dim} dims, got shape {r.shape}")
        r.sum_duplicates()
        return r.indices.astype(np.int64), r.data.astype(np.float64)
    a = np.asarray(code, dtype=np.float64).ravel()
    if a.shape != (dim,):
        raise SparsemmError(f"expected one code of {dim} dims, got shape {a.shape}")
    idx = np.flatnonzero(a)
    return idx, a[idx]


def top_tokens(code: Any, tokens: Sequence[str], n: int = 20) -> list[tuple[str, float]]:
    """The ``n`` largest entries of one code as (token, value), largest first (a word cloud)."""
    idx, val = _row(code, len(tokens))
    order = np.argsort(-val, kind="stable")[:n]
    return [(tokens[int(idx[o])], float(val[o])) for o in order]


def explain_pair(query_code: Any, item_code: Any, tokens: Sequence[str]) -> PairExplanation:
    """Per-token contributions q_j x_j of a query-item pair; they sum to the score q . x.

    Pass the codes the score was computed on (unit-normalised ones for a cosine).
    """
    qi, qv = _row(query_code, len(tokens))
    xi, xv = _row(item_code, len(tokens))
    shared, q_pos, x_pos = np.intersect1d(qi, xi, assume_unique=True, return_indices=True)
    contrib = qv[q_pos] * xv[x_pos]
    order = np.argsort(-contrib, kind="stable")
    parts = tuple(
        TokenContribution(
            tokens[int(shared[o])],
            int(shared[o]),
            float(qv[q_pos[o]]),
            float(xv[x_pos[o]]),
            float(contrib[o]),
        )
        for o in order
    )
    return PairExplanation(float(contrib.sum()), parts)


# ------------------------------------------------------------------------------ model


def fast_bf16_available() -> bool:
    """True when this CPU has bfloat16 matrix units (AMX-BF16 or AVX512-BF16, Linux)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        require_extra("transformers", "offline")
    return transformers


def bert_fields(bert_config: Any) -> dict[str, Any]:
    """The BERT_FIELDS of a transformers ``BertConfig`` (or a dict) as a plain dict."""
    src = bert_config if isinstance(bert_config, Mapping) else bert_config.to_dict()
    return {k: src[k] for k in BERT_FIELDS if k in src}


def _build_bert(text: Mapping[str, Any]) -> Any:
    tf = _import_transformers()
    cfg = tf.BertConfig(**dict(text))
    return tf.BertModel(cfg, add_pooling_layer=False)


def load_tokenizer(path: str | Path, local_only: bool = True) -> Any:
    """A fast tokenizer from a folder (no hub access) or, with ``local_only=False``, a name."""
    tf = _import_transformers()
    try:
        return tf.AutoTokenizer.from_pretrained(str(path), local_files_only=local_only)
    except (OSError, ValueError) as exc:
        raise SparsemmError(
            f"could not load a tokenizer from {path} ({exc}); the folder needs vocab.txt or "
            "tokenizer.json"
        ) from exc


class VDRModel(PretrainedMixin, nn.Module):
    """VDR bi-encoder: a BERT text tower (or two) and an image adapter into the vocabulary.

    Build from a pretrained BERT with :meth:`from_bert` / :meth:`from_minilm`; a saved model
    with :meth:`from_pretrained` (config.json + model.safetensors + tokenizer files).
    """

    config_class: ClassVar[type] = VDRConfig
    model_type: ClassVar[str] = "vdr"
    valid: torch.Tensor  # (V,) bool buffer

    def __init__(self, config: VDRConfig, tokenizer: Any = None) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.text: Any = _build_bert(config.text)
        self.ln_text = nn.LayerNorm(h)
        # A second (document) tower only when queries and documents are encoded apart.
        self.text_doc: Any = None
        self.ln_text_doc: nn.LayerNorm | None = None
        if not config.shared_text:
            self.text_doc = _build_bert(config.text)
            self.ln_text_doc = nn.LayerNorm(h)
        # Per-token output biases of the MLM-style heads (BERT's decoder bias), in token-id
        # space; 0 reproduces VDR's plain LN(H) E^T, calibrate() sets a data-derived offset.
        self.text_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.image_adapter: nn.Linear | None = None
        self.ln_image: nn.LayerNorm | None = None
        self.image_bias: nn.Parameter | None = None
        if config.image_dim is not None:
            self.image_adapter = nn.Linear(config.image_dim, h)
            if config.image_dim == h:
                # Identity start: patches already in the text model's hidden space (e.g.
                # MiniLM sentence embeddings) project onto the vocabulary from step 0.
                with torch.no_grad():
                    self.image_adapter.weight.copy_(torch.eye(h))
                    self.image_adapter.bias.zero_()
            self.ln_image = nn.LayerNorm(h)
            self.image_bias = nn.Parameter(torch.zeros(config.vocab_size))
        # valid[j]: token id j may be active; set from the tokenizer by from_bert and stored
        # with the weights (so a saved model needs no tokenizer to know its vocabulary).
        self.register_buffer("valid", torch.ones(config.vocab_size, dtype=torch.bool))
        self.tokenizer = tokenizer
        self._tokens: list[str] | None = None
        # Precision of the (tokens x V') vocabulary projection, the bulk of the compute; a
        # run-time choice, not part of the model: bfloat16 is ~2-3x faster on CPUs with
        # AMX / AVX512-BF16 and moves codes only by rounding (see fast_bf16_available).
        self.head_dtype: torch.dtype = torch.float32

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_bert(
        cls,
        path: str | Path,
        image_dim: int | None = 384,
        local_only: bool = True,
        **overrides: Any,
    ) -> VDRModel:
        """Initialise from a pretrained BERT-family model folder (or hub name).

        The transformer and its word embeddings (the vocabulary projection) start pretrained,
        as VDR requires; ``overrides`` set other :class:`VDRConfig` fields.
        """
        tf = _import_transformers()
        try:
            bert = tf.BertModel.from_pretrained(
                str(path), local_files_only=local_only, add_pooling_layer=False
            )
        except (OSError, ValueError) as exc:
            raise SparsemmError(
                f"could not load a BERT model from {path} ({exc}); pass a local folder with "
                "config.json and model weights"
            ) from exc
        tok = load_tokenizer(path, local_only)
        config = VDRConfig(text=bert_fields(bert.config), image_dim=image_dim, **overrides)
        model = cls(config, tokenizer=tok)
        model.text.load_state_dict(bert.state_dict())
        if model.text_doc is not None:
            model.text_doc.load_state_dict(bert.state_dict())
        model.set_vocabulary()
        return model

    @classmethod
    def from_minilm(cls, image_dim: int | None = 384, **overrides: Any) -> VDRModel:
        """Initialise from the packaged all-MiniLM-L6-v2 (BERT uncased vocabulary, 384-d)."""
        from sparsemm.encoders.minilm import default_model_path

        return cls.from_bert(default_model_path(), image_dim=image_dim, **overrides)

    def set_vocabulary(self) -> None:
        """Set the ``valid`` buffer from the tokenizer and the config's vocab filter."""
        if self.tokenizer is None:
            raise SparsemmError("this VDR model has no tokenizer; load it with from_pretrained")
        tokens = self.tokens
        special = list(getattr(self.tokenizer, "all_special_tokens", []))
        mask = vocab_mask(tokens, self.config.vocab_filter, self.config.vocab_shift, special)
        self.valid.copy_(torch.from_numpy(mask))

    @property
    def tokens(self) -> list[str]:
        """Token string of every code dimension (column j = token id j)."""
        if self._tokens is None:
            if self.tokenizer is None:
                raise SparsemmError("this VDR model has no tokenizer; load it with from_pretrained")
            v = self.config.vocab_size
            n = min(v, len(self.tokenizer))
            toks = list(self.tokenizer.convert_ids_to_tokens(list(range(n))))
            self._tokens = [str(t) if t is not None else f"[id{i}]" for i, t in enumerate(toks)] + [
                f"[id{i}]" for i in range(n, v)
            ]
        return self._tokens

    def save_pretrained(self, out_dir: str | Path) -> Path:
        out = super().save_pretrained(out_dir)
        if self.tokenizer is not None:
            tmp = Path(tempfile.mkdtemp(prefix=".tokenizer.", dir=out))
            try:
                self.tokenizer.save_pretrained(str(tmp))
                for name in os.listdir(tmp):
                    os.replace(tmp / name, out / name)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return out

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> VDRModel:
        model = super().from_pretrained(model_dir)
        d = Path(model_dir)
        if any((d / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
            model.tokenizer = load_tokenizer(d)
        else:
            logger.warning("%s has no tokenizer files: texts cannot be encoded", d)
        return model

    # -- vocabulary ----------------------------------------------------------------------
    def valid_ids(self) -> torch.Tensor:
        """(V',) token ids that may be active (the compact vocabulary, ascending)."""
        return self.valid.nonzero().squeeze(1)

    def compact_index(self) -> torch.Tensor:
        """(V,) long: position of each token id in the compact vocabulary, -1 if invalid."""
        ids = self.valid_ids()
        out = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=ids.device)
        out[ids] = torch.arange(len(ids), device=ids.device)
        return out

    def projection(self, tower: str = "query") -> torch.Tensor:
        """(V', h) rows of the tower's tied word-embedding matrix for the valid tokens (head
        dtype); the image side reads the query tower's."""
        bert = self._tower(tower)[0]
        emb = bert.embeddings.word_embeddings.weight
        return emb[self.valid_ids()].to(self.head_dtype)

    def _vocab_logits(
        self,
        x: torch.Tensor,
        proj: torch.Tensor,
        mask: torch.Tensor | None,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """max over dim 1 of x (n, L, h) @ proj^T, plus the per-token bias -> float32 (n, V').

        The bias is constant over positions, so it is added after the max-pool.
        """
        logits = x.to(proj.dtype) @ proj.T  # (n, L, V')
        pooled = masked_max_pool(logits, mask).float()
        return pooled if bias is None else pooled + bias[self.valid_ids()]

    # -- forward pieces (compact vocabulary space) ------------------------------------------
    def _tower(self, tower: str) -> tuple[Any, nn.LayerNorm]:
        if tower not in TOWERS:
            raise SparsemmError(f"tower must be one of {TOWERS}, not {tower!r}")
        if tower == "document" and self.text_doc is not None and self.ln_text_doc is not None:
            return self.text_doc, self.ln_text_doc
        return self.text, self.ln_text

    def text_pooled(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        tower: str = "query",
        proj: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Max-pooled vocabulary logits (n, V') of token ids (n, L)."""
        bert, ln = self._tower(tower)
        hidden = bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=torch.zeros_like(input_ids),
        ).last_hidden_state  # (n, L, h)
        proj = self.projection(tower) if proj is None else proj
        mask = None if self.config.pool_padding else attention_mask
        return self._vocab_logits(ln(hidden), proj, mask, self.text_bias)

    def image_pooled(
        self,
        patches: torch.Tensor,
        patch_mask: torch.Tensor | None = None,
        proj: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Max-pooled vocabulary logits (n, V') of patch features (n, P, d_img)."""
        if self.image_adapter is None or self.ln_image is None:
            raise SparsemmError("this VDR model has no image side (image_dim is None)")
        proj = self.projection() if proj is None else proj
        x = self.ln_image(self.image_adapter(patches))
        return self._vocab_logits(x, proj, patch_mask, self.image_bias)

    def activate(self, pooled: torch.Tensor) -> torch.Tensor:
        """elu1p, then L2-normalisation when the config says so: the dense VDR vector."""
        full = elu1p(pooled)
        return F.normalize(full, dim=1) if self.config.normalize else full

    def bow(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(n, V') {0, 1} bag-of-words of the valid tokens present (the non-parametric entry)."""
        pos = self.compact_index()[input_ids]  # (n, L), -1 for invalid tokens
        keep = (pos >= 0) & attention_mask.bool()
        out = torch.zeros(input_ids.shape[0], int(self.valid.sum()), device=input_ids.device)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None].expand_as(pos)
        out[rows[keep], pos[keep]] = 1.0
        return out

    def tokenize(
        self, texts: Sequence[str], max_length: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) (n, L); padded to the batch's longest text, or to
        max_length with ``pool_padding`` (the published models pool over padding too)."""
        if self.tokenizer is None:
            raise SparsemmError("this VDR model has no tokenizer; load it with from_pretrained")
        texts = list(texts)
        if any(not isinstance(t, str) for t in texts):
            raise SparsemmError("VDR encodes a list of strings")
        enc = self.tokenizer(
            texts,
            padding="max_length" if self.config.pool_padding else True,
            truncation=True,
            max_length=max_length or self.config.max_length,
            return_tensors="pt",
        )
        return enc["input_ids"], enc["attention_mask"]

    @torch.no_grad()
    def calibrate(
        self,
        texts: Sequence[str] | None = None,
        patches: np.ndarray | None = None,
        patch_mask: np.ndarray | None = None,
        rank: int | None = None,
        batch_size: int = 64,
    ) -> dict[str, float]:
        """Data-dependent init of the head biases: a sample's mean ``rank``-th largest pooled
        logit (default: the side's top-k) is mapped to elu1p(0) = 1.

        Without it, LN(H) E^T of a pretrained MiniLM is positive for most of the ~27k tokens,
        so an L2-normalised VDR vector keeps under 10% of its mass in its top 512 tokens and
        the dense vectors in VDR's loss compare backgrounds. After the shift, tokens below
        the k-th decay exponentially. Returns the offsets (logged in run reports).
        """
        self.eval()
        out: dict[str, float] = {}
        proj = self.projection()
        if texts:
            self.text_bias.zero_()
            texts = list(texts)
            pooled = []
            for s in range(0, len(texts), batch_size):
                ids, attn = self.tokenize(texts[s : s + batch_size])
                pooled.append(self.text_pooled(ids, attn, "query", proj))
            k = int(rank or self.config.text_top_k)
            off = float(torch.cat(pooled).topk(k, dim=1).values[:, -1].mean())
            self.text_bias.fill_(-off)
            out["text"] = off
        if patches is not None and len(patches):
            if self.image_bias is None:
                raise SparsemmError("this VDR model has no image side (image_dim is None)")
            self.image_bias.zero_()
            pooled = []
            for s in range(0, len(patches), batch_size):
                x = torch.from_numpy(np.asarray(patches[s : s + batch_size], dtype=np.float32))
                m = None if patch_mask is None else torch.from_numpy(patch_mask[s : s + batch_size])
                pooled.append(self.image_pooled(x, m, proj))
            k = int(rank or self.config.image_top_k)
            off = float(torch.cat(pooled).topk(k, dim=1).values[:, -1].mean())
            self.image_bias.fill_(-off)
            out["image"] = off
        return out

    # -- inference -------------------------------------------------------------------------
    def _to_csr(self, sparse: torch.Tensor, ids: torch.Tensor) -> sp.csr_matrix:
        """Compact (n, V') tensor -> csr (n, V) in token-id space."""
        rows, cols = sparse.nonzero(as_tuple=True)
        vals = sparse[rows, cols].float().numpy()
        out = sp.csr_matrix(
            (vals, (rows.numpy(), ids[cols].numpy())),
            shape=(sparse.shape[0], self.config.vocab_size),
            dtype=np.float32,
        )
        out.sort_indices()
        return out

    @torch.no_grad()
    def encode_text(
        self,
        texts: Sequence[str],
        top_k: int | None = None,
        bow: bool | None = None,
        tower: str = "query",
        batch_size: int = 64,
        progress: bool = False,
    ) -> sp.csr_matrix:
        """Sparse VDR codes (n, V) of texts: TopK(full) OR (bow and BoW(text)).

        ``top_k`` (default ``config.text_top_k``) and ``bow`` (default ``config.bow``)
        override the config for this call.
        """
        k = int(top_k or self.config.text_top_k)
        use_bow = self.config.bow if bow is None else bool(bow)
        self.eval()
        ids = self.valid_ids()
        proj = self.projection(tower)
        blocks = []
        texts = list(texts)
        # Batches of similar length waste little compute on padding; rows are put back after.
        order = np.argsort([len(t) for t in texts], kind="stable")
        starts = range(0, len(texts), max(1, batch_size))
        for s in tqdm(starts, desc="VDR text", disable=not progress, leave=False):
            input_ids, attn = self.tokenize([texts[i] for i in order[s : s + batch_size]])
            full = self.activate(self.text_pooled(input_ids, attn, tower, proj))
            b = self.bow(input_ids, attn) if use_bow else None
            blocks.append(self._to_csr(sparsify(full, k, b), ids))
        if not blocks:
            return sp.csr_matrix((0, self.config.vocab_size), dtype=np.float32)
        out = sp.csr_matrix(sp.vstack(blocks, format="csr"))
        return sp.csr_matrix(out[np.argsort(order, kind="stable")])

    @torch.no_grad()
    def text_bow(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Binary bag-of-words codes (n, V) of texts (valid tokens only): VDR's BoW entry."""
        ids = self.valid_ids()
        blocks = []
        texts = list(texts)
        for s in range(0, len(texts), 256):
            input_ids, attn = self.tokenize(texts[s : s + 256])
            blocks.append(self._to_csr(self.bow(input_ids, attn), ids))
        if not blocks:
            return sp.csr_matrix((0, self.config.vocab_size), dtype=np.float32)
        return sp.csr_matrix(sp.vstack(blocks, format="csr"))

    @torch.no_grad()
    def encode_image(
        self,
        patches: np.ndarray,
        patch_mask: np.ndarray | None = None,
        top_k: int | None = None,
        batch_size: int = 64,
        progress: bool = False,
    ) -> sp.csr_matrix:
        """Sparse VDR codes (n, V) of patch features (n, P, d_img) (mask (n, P): real patches)."""
        cfg = self.config
        if cfg.image_dim is None:
            raise SparsemmError("this VDR model has no image side (image_dim is None)")
        if patches.ndim != 3 or patches.shape[2] != cfg.image_dim:
            raise SparsemmError(
                f"VDR image side expects patches of shape (n, P, {cfg.image_dim}), got "
                f"{patches.shape}; were they made by another backbone?"
            )
        if patch_mask is not None and patch_mask.shape != patches.shape[:2]:
            raise SparsemmError(f"patch_mask must have shape {patches.shape[:2]}")
        k = int(top_k or cfg.image_top_k)
        self.eval()
        ids = self.valid_ids()
        proj = self.projection()
        blocks = []
        starts = range(0, len(patches), max(1, batch_size))
        for s in tqdm(starts, desc="VDR image", disable=not progress, leave=False):
            x = torch.from_numpy(np.asarray(patches[s : s + batch_size], dtype=np.float32))
            if not torch.isfinite(x).all():
                raise SparsemmError("patch features contain NaN or inf; re-encode those items")
            m = None if patch_mask is None else torch.from_numpy(patch_mask[s : s + batch_size])
            full = self.activate(self.image_pooled(x, m, proj))
            blocks.append(self._to_csr(sparsify(full, k), ids))
        if not blocks:
            return sp.csr_matrix((0, cfg.vocab_size), dtype=np.float32)
        return sp.csr_matrix(sp.vstack(blocks, format="csr"))

    # -- explanations ----------------------------------------------------------------------
    def top_tokens(self, code: Any, n: int = 20) -> list[tuple[str, float]]:
        """An item's (or query's) ``n`` strongest tokens with their values (word cloud)."""
        return top_tokens(code, self.tokens, n)

    def explain(self, query_code: Any, item_code: Any) -> PairExplanation:
        """Per-token contributions of a query-item pair, summing to their score q . x."""
        return explain_pair(query_code, item_code, self.tokens)


# ------------------------------------------------------------- published checkpoints


def _infer_bert_fields(state: Mapping[str, torch.Tensor], prefix: str, raw: Mapping) -> dict:
    """BERT_FIELDS of a BERT encoder from its weights (names ``prefix`` + BertModel keys)."""
    try:
        vocab, hidden = state[f"{prefix}embeddings.word_embeddings.weight"].shape
        max_pos = state[f"{prefix}embeddings.position_embeddings.weight"].shape[0]
        types = state[f"{prefix}embeddings.token_type_embeddings.weight"].shape[0]
        inter = state[f"{prefix}encoder.layer.0.intermediate.dense.weight"].shape[0]
    except KeyError as exc:
        raise SparsemmError(f"not a BERT encoder under {prefix!r}: missing {exc}") from exc
    layer_re = re.compile(re.escape(prefix) + r"encoder\.layer\.(\d+)\.")
    layers = 1 + max(int(m.group(1)) for k in state if (m := layer_re.match(k)))
    heads = int(raw.get("num_attention_heads") or max(1, hidden // 64))
    return {
        "vocab_size": int(vocab),
        "hidden_size": int(hidden),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": int(inter),
        "hidden_act": str(raw.get("hidden_act", "gelu")),
        "hidden_dropout_prob": float(raw.get("hidden_dropout_prob", 0.1)),
        "attention_probs_dropout_prob": float(raw.get("attention_probs_dropout_prob", 0.1)),
        "max_position_embeddings": int(max_pos),
        "type_vocab_size": int(types),
        "layer_norm_eps": float(raw.get("layer_norm_eps", 1e-12)),
        "pad_token_id": int(raw.get("pad_token_id", 0)),
        "initializer_range": float(raw.get("initializer_range", 0.02)),
    }


def _read_published_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    st = sorted(folder.glob("*.safetensors"))
    if st:
        out: dict[str, torch.Tensor] = {}
        for f in st:
            out.update(load_file(str(f)))
        return out
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if bins:
        out = {}
        for f in bins:
            # weights_only=True: plain tensors only, never arbitrary pickled objects.
            out.update(torch.load(str(f), map_location="cpu", weights_only=True))
        return out
    raise SparsemmError(f"{folder} holds no model.safetensors or pytorch_model.bin")


def _download(repo: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        require_extra("huggingface_hub", "offline")
    try:
        path = snapshot_download(
            repo,
            revision=revision,
            allow_patterns=["*.json", "*.safetensors", "*.bin", "*.txt"],
        )
    except Exception as exc:  # network, auth or missing repo: all user-fixable
        raise SparsemmError(
            f"could not download {repo!r} from the Hugging Face hub ({exc}); connect to the "
            "internet or pass a local folder holding the checkpoint"
        ) from exc
    return Path(path)


def load_published_vdr(
    source: str | Path,
    revision: str | None = None,
    tokenizer: str | Path | None = None,
) -> VDRModel:
    """Load an authors' text-to-text VDR checkpoint (``vsearch/vdr-nq`` style) as a VDRModel.

    ``source`` is a local folder or a hub repo id (downloaded, needs a network). The folder
    holds the authors' ``config.json`` (``encoder_q`` / ``encoder_p`` dicts of type ``vdr``
    with ``model_id``, ``max_len``, ``norm``, ``shift_vocab_num``, ``topk``; and
    ``shared_encoder``) and their weights (``encoder_q.bert_model.*``, ``encoder_q.ln.*``,
    likewise ``encoder_p``), as safetensors or a ``weights_only`` torch file. The transformer
    shape is read off the weights; the tokenizer comes from ``tokenizer``, the folder, or the
    encoder's ``model_id``. Their encoding is reproduced exactly: vocabulary = ids >=
    ``shift_vocab_num``, texts padded to ``max_len`` and max-pooled over every position.
    Cross-modal checkpoints (a ViT image tower over a fixed token subset) are refused.
    """
    src = Path(source).expanduser()
    folder = src if src.is_dir() else _download(str(source), revision)
    from sparsemm.io import read_json

    raw = read_json(folder / "config.json")
    enc_q = raw.get("encoder_q")
    if not isinstance(enc_q, Mapping):
        raise SparsemmError(f"{folder}/config.json has no 'encoder_q': not a VDR retriever")
    enc_p = raw.get("encoder_p") if isinstance(raw.get("encoder_p"), Mapping) else None
    kinds = {str(e.get("type", "vdr")) for e in (enc_q, enc_p) if e is not None}
    if kinds != {"vdr"}:
        raise SparsemmError(
            f"encoder types {sorted(kinds)} are not supported: only text-to-text VDR "
            "checkpoints (type 'vdr') load; cross-modal ones use a ViT image tower and a "
            "fixed token subset that sparsemm does not implement"
        )
    if str(enc_q.get("pooling", "max")) != "max":
        raise SparsemmError("only max-pooled VDR checkpoints are supported")
    state = _read_published_weights(folder)
    shared = bool(raw.get("shared_encoder", False)) or enc_p is None
    if not shared and not any(k.startswith("encoder_p.") for k in state):
        shared = True
    text = _infer_bert_fields(state, "encoder_q.bert_model.", enc_q)
    top_k = int(enc_q.get("topk") or 768)
    config = VDRConfig(
        text=text,
        image_dim=None,
        text_top_k=min(top_k, text["vocab_size"]),
        image_top_k=min(512, text["vocab_size"]),
        bow=True,
        normalize=bool(enc_q.get("norm", False)),
        max_length=int(enc_q.get("max_len", 256)),
        vocab_filter="shift",
        vocab_shift=int(enc_q.get("shift_vocab_num", 999)),
        shared_text=shared,
        pool_padding=True,
    )
    tok_src: Any = tokenizer
    if tok_src is None:
        has_tok = any((folder / f).is_file() for f in ("tokenizer.json", "vocab.txt"))
        tok_src = folder if has_tok else enc_q.get("model_id", "bert-base-uncased")
    local = Path(str(tok_src)).expanduser().is_dir()
    tok = load_tokenizer(Path(str(tok_src)).expanduser() if local else tok_src, local)
    model = VDRModel(config, tokenizer=tok)
    mine: dict[str, torch.Tensor] = {}
    towers = [("encoder_q.", "text.", "ln_text.")]
    if not shared:
        towers.append(("encoder_p.", "text_doc.", "ln_text_doc."))
    for theirs, bert_name, ln_name in towers:
        for k, v in state.items():
            if k.startswith(theirs + "bert_model."):
                name = k[len(theirs + "bert_model.") :]
                if name.startswith("pooler.") or name.endswith("position_ids"):
                    continue
                mine[bert_name + name] = v
            elif k.startswith(theirs + "ln."):
                mine[ln_name + k[len(theirs + "ln.") :]] = v
    # Their heads have no output bias: ours stays 0, which is their computation.
    mine["text_bias"] = torch.zeros(config.vocab_size)
    expected = set(model.state_dict()) - {"valid"}
    missing = sorted(expected - set(mine))
    if missing:
        raise SparsemmError(
            f"the checkpoint in {folder} lacks {len(missing)} weights (e.g. {missing[:3]}); "
            "is it a VDR text-to-text retriever?"
        )
    model.load_state_dict({**mine, "valid": model.valid}, strict=True)
    model.set_vocabulary()
    model.eval()
    logger.info(
        "loaded published VDR from %s (%d layers, hidden %d, %s towers)",
        folder,
        text["num_hidden_layers"],
        text["hidden_size"],
        "shared" if shared else "two",
    )
    return model
