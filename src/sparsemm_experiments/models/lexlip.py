"""LexLIP: lexicon-weighted image and text towers over a BERT vocabulary.

Model of "LexLIP: Lexicon-Bottlenecked Language-Image Pre-Training for Large-Scale Image-Text
Sparse Retrieval" (Luo et al., ICCV 2023). Both towers end in an MLM-style *lexicon head*
(Linear -> GELU -> LayerNorm, then scores against the frozen BERT word embeddings of the
lexicon pieces plus a bias, as BERT's tied MLM decoder). Per position t the head gives
logits ``l_t`` (V,); the item's lexicon weights are

    a = max_t log(1 + ReLU(l_t))          (V,)   saturating, non-negative, max-pooled

so every dimension is a word piece and ``a`` is sparse where the logits are negative. The
dense path of the paper's "Dense" variant is a linear projection of the [CLS] state.

Here (offline, CPU): the text tower is all-MiniLM-L6-v2 (HF ``BertModel``; its word
embeddings, position embeddings and lower ``frozen_layers`` layers stay frozen, the upper
layers train). The image tower is a small transformer over *patch features*: EfficientNet
7x7 spatial features (49 x 1280) of real images, or, on the COCO caption-proxy where there
are no pixels, the frozen MiniLM embeddings of the item's 5-7 captions (an unordered set).
The lexicon may be the full BERT vocabulary or the word pieces of a training corpus
(``vocab_ids``; the CPU-scaled default keeps the pieces seen at least twice in the training
captions, about 4k for COCO), because the head's V x 384 projection dominates the cost.

Pre-training pieces (LexLIP Sec. 3.2, after LexMAE, Shen et al. 2023): the *lexicon
bottleneck* turns max-pooled logits into a lexicon-importance distribution
``p = softmax(max_t l_t)`` and a continuous bag-of-words vector ``b = p @ E`` (E: the frozen
word embeddings of the lexicon pieces), which replaces [CLS] at the input of a weak (shallow)
masked-language decoder (:class:`WeakDecoder`). Training lives in
:mod:`sparsemm_experiments.train.lexlip`.

Saving: ``config.json`` + ``model.safetensors``. With ``text_init="minilm"`` the frozen
backbone tensors are not stored (they are reloaded from the MiniLM folder); a sha256 of them
is kept in the file's metadata and checked on load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from sparsemm.errors import SparsemmError, require_extra
from sparsemm.io import atomic_open, read_json, write_json
from sparsemm.models.base import DIGEST_KEY, check_weights, weights_file_bytes

logger = logging.getLogger(__name__)

IMAGE_INPUTS = ("captions", "efficientnet")
TEXT_INITS = ("minilm", "random")
MODEL_TYPE = "lexlip"


@dataclass(frozen=True)
class LexLIPConfig:
    text_init: str = "minilm"  # "minilm": pretrained MiniLM; "random": tiny test towers
    text_model: str | None = None  # BERT folder (weights + tokenizer); None = packaged MiniLM
    vocab_size: int = 30522  # BERT vocabulary size (the tokenizer's)
    hidden: int = 384  # text width = word-embedding width = the heads' output space
    text_layers: int = 6  # layers of the text backbone (MiniLM-L6)
    text_heads: int = 12  # only used by text_init="random"
    text_intermediate: int = 1536  # only used by text_init="random"
    frozen_layers: int = 5  # lower text layers kept frozen (CPU budget); embeddings always frozen
    max_text_len: int = 16  # pieces incl. [CLS]/[SEP]; 90% of COCO captions fit (95%: 18)
    lexicon_size: int = 29523  # lexicon columns = len(vocab_ids); default: all real pieces
    image_input: str = "captions"  # patch kind: "captions" (proxy) or "efficientnet"
    image_dim: int = 384  # width of one input patch (384 caption embedding, 1280 EfficientNet)
    image_positions: int = 0  # learned positions (49 for a 7x7 map); 0 = unordered set
    image_hidden: int = 256  # image tower width (small: 49 patches x 2 layers on one core)
    image_layers: int = 2  # transformer layers of the image tower
    image_heads: int = 4
    dense_dim: int = 256  # [CLS] projection of the Dense variant
    decoder_layers: int = 1  # weak decoder depth (weak on purpose: the bottleneck must carry)
    decoder_heads: int = 6
    dropout: float = 0.1  # new layers (BERT's own dropout is kept)
    enc_mask_rate: float = 0.3  # LexLIP: encoder-side MLM mask rate
    dec_mask_rate: float = 0.5  # LexLIP: decoder-side mask rate (aggressive, weak decoder)
    tau: float = 0.05  # contrastive temperature (both phases)
    flops_weight: float = 0.002  # lambda of the FLOPs sparsity regulariser (phase 2)
    dense_weight: float = 1.0  # weight of the dense [CLS] contrastive term
    identity_weight: float = 1.0  # phase 1: visible pieces predict themselves (lexical prior
    # a pretrained BERT MLM head has; MiniLM ships none)
    momentum: float = 0.99  # m of the momentum encoders (phase 2)
    queue_size: int = 1024  # feature-queue length (paper 11,520; scaled to our batch/data)
    item_top_k: int | None = None  # keep only the top-k weights per item at inference
    query_top_k: int | None = None  # same for query texts
    seed: int = 0  # initialisation of new layers

    def __post_init__(self) -> None:
        if self.text_init not in TEXT_INITS:
            raise SparsemmError(f"text_init must be one of {TEXT_INITS}, not {self.text_init!r}")
        if self.image_input not in IMAGE_INPUTS:
            raise SparsemmError(
                f"image_input must be one of {IMAGE_INPUTS}, not {self.image_input!r}"
            )
        if not 0 <= self.frozen_layers <= self.text_layers:
            raise SparsemmError(f"frozen_layers must be in 0..{self.text_layers}")
        for name in ("enc_mask_rate", "dec_mask_rate"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise SparsemmError(f"{name} must be in (0, 1)")
        if not 0.0 <= self.momentum < 1.0:
            raise SparsemmError("momentum must be in [0, 1)")
        weights = min(self.flops_weight, self.dense_weight, self.identity_weight)
        if not (self.tau > 0 and weights >= 0):  # NaN too
            raise SparsemmError(
                "tau must be positive; flops_weight, dense_weight, identity_weight >= 0"
            )
        if self.max_text_len < 4 or self.lexicon_size < 2 or self.queue_size < 1:
            raise SparsemmError("max_text_len >= 4, lexicon_size >= 2, queue_size >= 1 needed")
        if self.image_hidden % self.image_heads or self.hidden % self.decoder_heads:
            raise SparsemmError("image_hidden / hidden must be divisible by the head counts")
        for name in ("item_top_k", "query_top_k"):
            v = getattr(self, name)
            if v is not None and not 0 < v <= self.lexicon_size:
                raise SparsemmError(f"{name} must be in 1..{self.lexicon_size} or None")


# ----------------------------------------------------------------------------- backbone


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load reports (unused pooler weights) for the duration."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)
        if bars:
            hf_logging.enable_progress_bar()


def text_model_path(config: LexLIPConfig) -> Path:
    """The BERT folder of ``config``: ``text_model`` or the packaged all-MiniLM-L6-v2."""
    if config.text_model is not None:
        path = Path(config.text_model).expanduser()
        if not path.is_dir():
            raise SparsemmError(f"text model folder not found: {path}")
        return path
    from sparsemm.encoders.minilm import default_model_path

    return default_model_path()


def load_tokenizer(config: LexLIPConfig) -> Any:
    """The BERT word-piece tokenizer of ``config`` (fast tokenizer, local files only)."""
    try:
        from transformers import BertTokenizerFast  # type: ignore[attr-defined]
    except ImportError:
        require_extra("transformers", "offline")
    with quiet_transformers():
        tok = BertTokenizerFast.from_pretrained(str(text_model_path(config)), local_files_only=True)
    if len(tok) != config.vocab_size:
        raise SparsemmError(
            f"the tokenizer has {len(tok)} pieces but the config says vocab_size "
            f"{config.vocab_size}; use the tokenizer the model was built with"
        )
    return tok


def _build_bert(config: LexLIPConfig) -> Any:
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        require_extra("transformers", "offline")
    if config.text_init == "minilm":
        with quiet_transformers():
            bert = BertModel.from_pretrained(
                str(text_model_path(config)), add_pooling_layer=False, local_files_only=True
            )
        got = (bert.config.hidden_size, bert.config.num_hidden_layers, bert.config.vocab_size)
        want = (config.hidden, config.text_layers, config.vocab_size)
        if got != want:
            raise SparsemmError(
                f"the text model has (hidden, layers, vocab) = {got}, the config {want}; "
                "build the config from the model (LexLIPConfig(hidden=..., text_layers=...))"
            )
        return bert
    bc = BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden,
        num_hidden_layers=config.text_layers,
        num_attention_heads=config.text_heads,
        intermediate_size=config.text_intermediate,
        max_position_embeddings=max(64, config.max_text_len),
    )
    return BertModel(bc, add_pooling_layer=False)


def default_lexicon(tokenizer: Any) -> np.ndarray:
    """Ids of every real word piece: the vocabulary minus special and [unused*] tokens."""
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.get_vocab()
    ids = [i for tok, i in vocab.items() if i not in special and not tok.startswith("[unused")]
    return np.array(sorted(ids), dtype=np.int64)


def corpus_lexicon(texts: Sequence[str], tokenizer: Any, min_count: int = 2) -> np.ndarray:
    """Ids of the word pieces seen at least ``min_count`` times in ``texts`` (sorted)."""
    if min_count < 1:
        raise SparsemmError("min_count must be at least 1")
    allowed = set(default_lexicon(tokenizer).tolist())
    counts: dict[int, int] = {}
    for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
    keep = sorted(i for i, c in counts.items() if c >= min_count and i in allowed)
    if len(keep) < 2:
        raise SparsemmError("the corpus lexicon has fewer than 2 word pieces; lower min_count")
    return np.array(keep, dtype=np.int64)


# -------------------------------------------------------------------------------- pieces


def saturate(x: torch.Tensor) -> torch.Tensor:
    """log(1 + ReLU(x)): the saturating non-negative activation of the lexicon weights."""
    return torch.log1p(F.relu(x))


def max_pool(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(n, L, V) logits, (n, L) bool valid positions -> (n, V) max over valid positions.

    A row with no valid position gives -inf (saturated to 0).
    """
    return logits.masked_fill(~mask[:, :, None], float("-inf")).amax(dim=1)


def pool_rows(flat_logits: torch.Tensor, rows: torch.Tensor, n: int) -> torch.Tensor:
    """Max-pool packed logits: (m, V) at positions of rows ``rows`` (m,) -> (n, V).

    Same as :func:`max_pool` on the padded layout, without computing padded positions.
    """
    out = flat_logits.new_full((n, flat_logits.shape[1]), float("-inf"))
    index = rows[:, None].expand(-1, flat_logits.shape[1])
    return out.scatter_reduce(0, index, flat_logits, reduce="amax", include_self=True)


def lexicon_weights(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """LexLIP's lexicon representation a = max_t log(1 + ReLU(l_t)), (n, V).

    log1p(ReLU) is monotone, so pooling the logits first is the same and cheaper.
    """
    return saturate(max_pool(logits, mask))


def flops_loss(weights: torch.Tensor) -> torch.Tensor:
    """FLOPs regulariser (Paria et al., ICLR 2020): sum_v (mean_i |a_iv|)^2 over a batch."""
    return (weights.abs().mean(dim=0) ** 2).sum()


class LexiconHead(nn.Module):
    """MLM-style head: Linear -> GELU -> LayerNorm (width ``out_hidden``), then scores
    against the word embeddings of the lexicon pieces plus a per-piece bias.

    The projection is the frozen word-embedding matrix itself (BERT ties its MLM decoder to
    the input embeddings), passed in at call time and shared by both towers, so dimension v
    keeps meaning word piece v: a tower can only raise "dog" by moving towards the
    embedding of "dog". Only the transform and the bias train.
    """

    def __init__(self, in_dim: int, out_hidden: int, n_terms: int) -> None:
        super().__init__()
        self.transform = nn.Linear(in_dim, out_hidden)
        self.norm = nn.LayerNorm(out_hidden, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(n_terms))

    def hidden(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(F.gelu(self.transform(h)))

    def forward(self, h: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """(..., in_dim) states, words (V, out_hidden) -> (..., V) logits."""
        return self.hidden(h) @ words.T + self.bias


def _extended_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n, L) 1/0 -> (n, 1, 1, L) additive attention mask for HF BERT layers."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def _run_bert_layer(layer: nn.Module, h: torch.Tensor, ext: torch.Tensor) -> torch.Tensor:
    out = layer(h, attention_mask=ext)
    return out[0] if isinstance(out, tuple) else out


class TextLower(nn.Module):
    """The frozen part of the text backbone: embeddings + the lower ``frozen_layers`` layers.

    Always in eval mode (no dropout), so its outputs can be cached.
    """

    embeddings: Any  # HF BertEmbeddings

    def __init__(self, bert: Any, n_frozen: int) -> None:
        super().__init__()
        self.embeddings = bert.embeddings
        self.layers = nn.ModuleList(list(bert.encoder.layer)[:n_frozen])
        for p in self.parameters():
            p.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> TextLower:
        return super().train(False)

    @property
    def word_embeddings(self) -> torch.Tensor:
        w: torch.Tensor = self.embeddings.word_embeddings.weight
        return w

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(n, L) ids and 0/1 mask -> (n, L, hidden) states after the frozen layers."""
        h = self.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        ext = _extended_mask(mask, h.dtype)
        for layer in self.layers:
            h = _run_bert_layer(layer, h, ext)
        return h


class TextTop(nn.Module):
    """The trained part of the text tower: upper layers, lexicon head, dense [CLS] path.

    ``mask_state`` (h,) stands in for the cached lower-layer state of a masked position
    (phase-1 MLM on cached states; see :mod:`sparsemm_experiments.train.lexlip`).
    """

    def __init__(
        self,
        bert: Any,
        n_frozen: int,
        n_terms: int,
        dense: int,
        mask_state: torch.Tensor,
    ):
        super().__init__()
        hidden = int(bert.config.hidden_size)
        self.layers = nn.ModuleList(list(bert.encoder.layer)[n_frozen:])
        self.mask_state = nn.Parameter(mask_state.clone())
        self.head = LexiconHead(hidden, hidden, n_terms)
        self.dense = nn.Linear(hidden, dense)

    def forward(
        self,
        states: torch.Tensor,
        mask: torch.Tensor,
        eligible: torch.Tensor,
        words: torch.Tensor,
        masked: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """states (n, L, h) from :class:`TextLower`, mask (n, L) 0/1, eligible (n, L) bool
        positions that enter the lexicon, words (V', h) lexicon embeddings, ``masked``
        (n, L) bool positions whose state is replaced by ``mask_state``. Returns hidden,
        dense, and the lexicon logits packed at the eligible positions: ``flat_logits``
        (m, V'), ``flat_rows`` (m,) row of each."""
        if masked is not None:
            states = torch.where(masked[:, :, None], self.mask_state.to(states.dtype), states)
        ext = _extended_mask(mask, states.dtype)
        h = states
        for layer in self.layers:
            h = _run_bert_layer(layer, h, ext)
        rows = torch.arange(h.shape[0])[:, None].expand(-1, h.shape[1])[eligible]
        return {
            "hidden": h,
            "dense": self.dense(h[:, 0]),
            "flat_logits": self.head(h[eligible], words),
            "flat_rows": rows,
        }


class ImageTower(nn.Module):
    """Transformer over patch features -> lexicon logits per position and a dense [CLS].

    Input patches (n, P, image_dim) with a (n, P) bool mask (caption sets vary in size).
    Linear + LayerNorm project the patches, a learned [CLS] is prepended, learned position
    embeddings are added when ``image_positions`` > 0, then pre-norm transformer layers.
    """

    def __init__(self, config: LexLIPConfig) -> None:
        super().__init__()
        c = config
        self.proj = nn.Linear(c.image_dim, c.image_hidden)
        self.proj_norm = nn.LayerNorm(c.image_hidden)
        self.cls = nn.Parameter(torch.randn(1, 1, c.image_hidden) * 0.02)
        self.pos: nn.Parameter | None = None
        if c.image_positions > 0:
            self.pos = nn.Parameter(torch.randn(1, c.image_positions + 1, c.image_hidden) * 0.02)
        self.layers = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(
                    c.image_hidden,
                    c.image_heads,
                    dim_feedforward=4 * c.image_hidden,
                    dropout=c.dropout,
                    activation="gelu",
                    batch_first=True,
                    norm_first=True,
                )
                for _ in range(c.image_layers)
            ]
        )
        self.norm = nn.LayerNorm(c.image_hidden)
        self.head = LexiconHead(c.image_hidden, c.hidden, c.lexicon_size)
        self.dense = nn.Linear(c.image_hidden, c.dense_dim)

    def forward(
        self, patches: torch.Tensor, mask: torch.Tensor, words: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """patches (n, P, d), mask (n, P), words (V', h) -> hidden (n, 1+P, h), logits
        (n, 1+P, V'), mask, dense."""
        n = patches.shape[0]
        x = self.proj_norm(self.proj(patches))
        x = torch.cat([self.cls.expand(n, -1, -1), x], dim=1)
        if self.pos is not None:
            if x.shape[1] > self.pos.shape[1]:
                raise SparsemmError(
                    f"{x.shape[1] - 1} patches but the model knows {self.pos.shape[1] - 1} "
                    "positions; use the patch layout it was trained with"
                )
            x = x + self.pos[:, : x.shape[1]]
        full = torch.cat([torch.ones(n, 1, dtype=torch.bool), mask], dim=1)
        pad = ~full
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        x = self.norm(x)
        return {
            "hidden": x,
            "logits": self.head(x, words),
            "mask": full,
            "dense": self.dense(x[:, 0]),
        }


class WeakDecoder(nn.Module):
    """Shallow masked-language decoder fed by a lexicon bottleneck (LexMAE / LexLIP).

    Input: the bottleneck vector b (n, h) in place of [CLS], then the frozen word
    embeddings of the (heavily masked) caption plus the decoder's own positions.
    Predictions use the text tower's lexicon head (passed in), so the decoder only mixes.
    """

    def __init__(self, config: LexLIPConfig, position_init: torch.Tensor | None) -> None:
        super().__init__()
        h = config.hidden
        self.pos = nn.Parameter(torch.randn(1, config.max_text_len, h) * 0.02)
        if position_init is not None:
            with torch.no_grad():
                self.pos.copy_(position_init[None, : config.max_text_len])
        self.norm = nn.LayerNorm(h, eps=1e-12)
        self.layers = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(
                    h,
                    config.decoder_heads,
                    dim_feedforward=2 * h,  # narrow on purpose: weak, and cheap on a CPU
                    dropout=config.dropout,
                    activation="gelu",
                    batch_first=True,
                )
                for _ in range(config.decoder_layers)
            ]
        )

    def forward(
        self, bottleneck: torch.Tensor, token_emb: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """bottleneck (n, h), token_emb (n, L, h) of the masked caption, mask (n, L) 0/1 ->
        (n, L, h) decoder states (position 0 holds the bottleneck)."""
        x = torch.cat([bottleneck[:, None], token_emb[:, 1:]], dim=1)
        x = self.norm(x + self.pos[:, : x.shape[1]])
        pad = ~mask.bool()
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        return x


# --------------------------------------------------------------------------------- model


def _topk_rows(x: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep each row's k largest entries (others 0); None keeps everything."""
    if k is None or k >= x.shape[1]:
        return x
    idx = x.topk(k, dim=1).indices
    return torch.zeros_like(x).scatter_(1, idx, x.gather(1, idx))


def _to_csr(x: torch.Tensor) -> sp.csr_matrix:
    m = sp.csr_matrix(x.detach().numpy().astype(np.float32))
    m.eliminate_zeros()
    return m


class LexLIPModel(nn.Module):
    """LexLIP image/text towers with lexicon heads, dense paths and the weak decoder.

    ``vocab_ids`` (V',) are the BERT ids of the lexicon columns (default: every real word
    piece). Build with ``LexLIPModel(config, vocab_ids)``; ``from_pretrained(dir)`` restores.
    """

    model_type: ClassVar[str] = MODEL_TYPE
    vocab_ids: torch.Tensor  # (V',) int64 buffer: BERT id of each lexicon column

    def __init__(self, config: LexLIPConfig, vocab_ids: np.ndarray | None = None) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = load_tokenizer(config)
        if vocab_ids is None:
            vocab_ids = default_lexicon(self.tokenizer)
        vocab_ids = np.asarray(vocab_ids, dtype=np.int64)
        if vocab_ids.ndim != 1 or len(vocab_ids) != config.lexicon_size:
            raise SparsemmError(
                f"vocab_ids must list lexicon_size={config.lexicon_size} ids, got shape "
                f"{vocab_ids.shape}; pass LexLIPConfig(lexicon_size=len(vocab_ids))"
            )
        if len(np.unique(vocab_ids)) != len(vocab_ids) or (
            vocab_ids.min() < 0 or vocab_ids.max() >= config.vocab_size
        ):
            raise SparsemmError("vocab_ids must be distinct ids of the tokenizer's vocabulary")
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(config.seed)
        try:
            bert = _build_bert(config)
            self.register_buffer("vocab_ids", torch.from_numpy(vocab_ids.copy()))
            self.text_lower = TextLower(bert, config.frozen_layers)
            self.text_top = TextTop(
                bert,
                config.frozen_layers,
                config.lexicon_size,
                config.dense_dim,
                self._mask_state_init(),
            )
            self.image = ImageTower(config)
            positions = bert.embeddings.position_embeddings.weight.detach()
            self.decoder = WeakDecoder(config, positions.clone())
        finally:
            torch.random.set_rng_state(gen_state)
        self.eval()

    def lexicon_embeddings(self) -> torch.Tensor:
        """(V', h) frozen word embeddings of the lexicon pieces: both heads' projection."""
        return self.text_lower.word_embeddings[self.vocab_ids]

    def _mask_state_init(self) -> torch.Tensor:
        """The lower layers' state of [MASK] in "[CLS] [MASK] [SEP]" (mask_state's init)."""
        tok = self.tokenizer
        ids = torch.tensor([[tok.cls_token_id, tok.mask_token_id, tok.sep_token_id]])
        with torch.no_grad():
            return self.text_lower(ids, torch.ones_like(ids))[0, 1].clone()

    # -- text ---------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Texts -> (ids (n, L), mask (n, L)) padded to the longest, at most max_text_len."""
        if isinstance(texts, str) or any(not isinstance(t, str) for t in texts):
            raise SparsemmError("LexLIP expects a list of strings")
        enc = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.config.max_text_len,
            return_tensors="pt",
        )
        return enc["input_ids"].long(), enc["attention_mask"].long()

    def lexicon_mask(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(n, L) bool: positions pooled into the text lexicon (not [CLS]/[SEP]/padding)."""
        special = torch.tensor(
            [self.tokenizer.cls_token_id, self.tokenizer.sep_token_id], dtype=ids.dtype
        )
        return mask.bool() & ~torch.isin(ids, special)

    def text_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(n, L, h) states after the frozen lower layers (no gradient)."""
        with torch.no_grad():
            states: torch.Tensor = self.text_lower(ids, mask)
        return states

    def text_forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        top: nn.Module | None = None,
        states: torch.Tensor | None = None,
        masked: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Full text tower: hidden, dense (n, D), packed logits (see :class:`TextTop`),
        ``eligible`` (n, L), ``pooled`` (n, V') max-pooled logits and ``lexicon`` (n, V').

        ``top`` replaces the trained upper part (a momentum copy); ``states`` reuses the
        output of :meth:`text_states` for the same ``ids`` (e.g. cached); ``masked`` marks
        positions whose state is replaced by the learned mask state.
        """
        if states is None:
            states = self.text_states(ids, mask)
        eligible = self.lexicon_mask(ids, mask)
        words = self.lexicon_embeddings()
        out: dict[str, torch.Tensor] = (top or self.text_top)(states, mask, eligible, words, masked)
        out["eligible"] = eligible
        out["pooled"] = pool_rows(out["flat_logits"], out["flat_rows"], ids.shape[0])
        out["lexicon"] = saturate(out["pooled"])
        return out

    def image_forward(
        self, patches: torch.Tensor, mask: torch.Tensor, tower: nn.Module | None = None
    ) -> dict[str, torch.Tensor]:
        """Image tower: hidden, logits (n, 1+P, V'), pooled and lexicon (n, V'), dense."""
        out: dict[str, torch.Tensor] = (tower or self.image)(
            patches, mask, self.lexicon_embeddings()
        )
        out["pooled"] = max_pool(out["logits"], out["mask"])
        out["lexicon"] = saturate(out["pooled"])
        return out

    # -- bottleneck ---------------------------------------------------------------------
    def bottleneck(self, pooled_logits: torch.Tensor) -> torch.Tensor:
        """Continuous bag-of-words b = softmax(max-pooled logits) @ E_lexicon, (n, hidden)."""
        emb = self.lexicon_embeddings()  # (V', h), frozen
        # A row with no pooled position is all -inf: clamp so it becomes uniform, not NaN.
        return torch.softmax(pooled_logits.clamp(min=-1e4), dim=-1) @ emb

    def decode_logits(
        self,
        bottleneck: torch.Tensor,
        masked_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Weak-decoder logits for a masked caption given the bottleneck: (n, L, V'), or
        (m, V') at the (n, L) bool ``positions`` only (the head is the costly part)."""
        tok = F.embedding(masked_ids, self.text_lower.word_embeddings)
        states = self.decoder(bottleneck, tok, mask)
        if positions is not None:
            states = states[positions]
        logits: torch.Tensor = self.text_top.head(states, self.lexicon_embeddings())
        return logits

    @property
    def mask_token_id(self) -> int:
        return int(self.tokenizer.mask_token_id)

    def lexicon_targets(self, ids: torch.Tensor) -> torch.Tensor:
        """Map BERT ids (any shape) to lexicon columns; -100 where not in the lexicon."""
        lut = torch.full((self.config.vocab_size,), -100, dtype=torch.long)
        lut[self.vocab_ids] = torch.arange(len(self.vocab_ids))
        return lut[ids]

    # -- inference ----------------------------------------------------------------------
    @property
    def terms(self) -> list[str]:
        """The word piece of each lexicon column."""
        toks: list[str] = self.tokenizer.convert_ids_to_tokens(self.vocab_ids.tolist())
        return toks

    @torch.no_grad()
    def encode_text(
        self, texts: Sequence[str], batch_size: int = 64, top_k: int | None = None
    ) -> tuple[sp.csr_matrix, np.ndarray]:
        """Texts -> (lexicon weights CSR (n, V') float32, dense (n, D) float32 unit rows).

        ``top_k`` (default ``config.query_top_k``) keeps each row's k largest weights.
        Texts are batched by length so short captions are not padded to long ones.
        """
        texts = list(texts)
        k = top_k if top_k is not None else self.config.query_top_k
        self.eval()
        n = len(texts)
        lengths = [len(t) for t in texts]
        order = np.argsort(lengths, kind="stable")
        lex_parts: list[sp.csr_matrix] = []
        dense = np.zeros((n, self.config.dense_dim), dtype=np.float32)
        for s in range(0, n, batch_size):
            rows = order[s : s + batch_size]
            ids, mask = self.tokenize([texts[i] for i in rows])
            out = self.text_forward(ids, mask)
            lex_parts.append(_to_csr(_topk_rows(out["lexicon"], k)))
            dense[rows] = F.normalize(out["dense"], dim=1).numpy()
        if not lex_parts:
            return sp.csr_matrix((0, self.config.lexicon_size), dtype=np.float32), dense
        lex = sp.vstack(lex_parts, format="csr")
        inverse = np.empty(n, dtype=np.int64)
        inverse[order] = np.arange(n)
        return sp.csr_matrix(lex[inverse], dtype=np.float32), dense

    @torch.no_grad()
    def encode_items(
        self,
        patches: np.ndarray,
        mask: np.ndarray | None = None,
        batch_size: int = 64,
        top_k: int | None = None,
    ) -> tuple[sp.csr_matrix, np.ndarray]:
        """Patch features (n, P, image_dim) + (n, P) bool mask -> (lexicon CSR, dense unit).

        ``top_k`` (default ``config.item_top_k``) keeps each row's k largest weights.
        """
        patches = np.asarray(patches)
        if patches.ndim != 3 or patches.shape[2] != self.config.image_dim:
            raise SparsemmError(
                f"LexLIP expects item patches of shape (n, P, {self.config.image_dim}), got "
                f"{patches.shape}; build them with sparsemm_experiments.train.lexlip.item_patches"
            )
        if mask is None:
            mask = np.ones(patches.shape[:2], dtype=bool)
        if mask.shape != patches.shape[:2]:
            raise SparsemmError(f"mask must have shape {patches.shape[:2]}, got {mask.shape}")
        if not np.isfinite(patches).all():
            raise SparsemmError("item patch features contain NaN or inf; re-encode those items")
        k = top_k if top_k is not None else self.config.item_top_k
        self.eval()
        lex_parts: list[sp.csr_matrix] = []
        dense = np.zeros((len(patches), self.config.dense_dim), dtype=np.float32)
        for s in range(0, len(patches), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(patches[s : s + batch_size], np.float32))
            m = torch.from_numpy(np.ascontiguousarray(mask[s : s + batch_size], bool))
            out = self.image_forward(x, m)
            lex_parts.append(_to_csr(_topk_rows(out["lexicon"], k)))
            dense[s : s + batch_size] = F.normalize(out["dense"], dim=1).numpy()
        if not lex_parts:
            return sp.csr_matrix((0, self.config.lexicon_size), dtype=np.float32), dense
        return sp.vstack(lex_parts, format="csr").astype(np.float32), dense

    # -- persistence --------------------------------------------------------------------
    def _pretrained_backbone(self) -> bool:
        return self.config.text_init == "minilm"

    def backbone_digest(self) -> str:
        """sha256 over the frozen backbone tensors (names, shapes and bytes)."""
        h = hashlib.sha256()
        for name, t in sorted(self.text_lower.state_dict().items()):
            h.update(name.encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """State to store: everything except a pretrained frozen backbone (reloaded)."""
        state = self.state_dict()
        if self._pretrained_backbone():
            state = {k: v for k, v in state.items() if not k.startswith("text_lower.")}
        return {k: v.detach().contiguous() for k, v in state.items()}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`trainable_state` (raises SparsemmError on a mismatch)."""
        missing, unexpected = self.load_state_dict(state, strict=False)
        allowed = {k for k in self.state_dict() if k.startswith("text_lower.")}
        bad_missing = [k for k in missing if not (self._pretrained_backbone() and k in allowed)]
        if bad_missing or unexpected:
            raise SparsemmError(
                f"LexLIP weights do not match the config (missing {bad_missing[:3]}, "
                f"unexpected {list(unexpected)[:3]}); re-create the model"
            )

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (atomic) into ``out_dir``; config.json
        holds the weights' SHA-256, checked with their finiteness on load."""
        out = Path(out_dir)
        meta = {"model_type": MODEL_TYPE}
        if self._pretrained_backbone():
            meta["backbone_sha256"] = self.backbone_digest()
        data, digest = weights_file_bytes(self.trainable_state(), meta, MODEL_TYPE, out)
        out.mkdir(parents=True, exist_ok=True)
        with atomic_open(out / "model.safetensors", "wb") as fh:
            fh.write(data)
        config = {"model_type": MODEL_TYPE, **dataclasses.asdict(self.config)}
        write_json(out / "config.json", {**config, DIGEST_KEY: digest})
        return out

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> LexLIPModel:
        """Load a model written by :meth:`save_pretrained` (eval mode)."""
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load as load_bytes

        d = Path(model_dir)
        if not (d / "config.json").is_file() or not (d / "model.safetensors").is_file():
            raise SparsemmError(
                f"{d} is not a saved LexLIP model (needs config.json and model.safetensors); "
                "train one with `sparsemm train lexlip`"
            )
        raw = read_json(d / "config.json")
        if not isinstance(raw, dict):
            raise SparsemmError(
                f"{d}/config.json is malformed (a JSON object was expected, got "
                f"{type(raw).__name__}); re-create the model"
            )
        mtype = raw.pop("model_type", None)
        want = raw.pop(DIGEST_KEY, None)
        if mtype != MODEL_TYPE:
            raise SparsemmError(f"{d} holds a {mtype!r} model, not {MODEL_TYPE!r}")
        fields = {f.name for f in dataclasses.fields(LexLIPConfig)}
        unknown = set(raw) - fields
        if unknown:
            raise SparsemmError(
                f"{d}/config.json has fields this sparsemm does not know: {sorted(unknown)}; "
                "upgrade sparsemm"
            )
        config = LexLIPConfig(**raw)
        try:
            with safe_open(str(d / "model.safetensors"), framework="pt") as fh:
                meta = fh.metadata() or {}
            data = (d / "model.safetensors").read_bytes()
            state = load_bytes(data)
        except (OSError, SafetensorError, ValueError) as exc:
            raise SparsemmError(
                f"{d}/model.safetensors is corrupt ({exc}); re-create the model"
            ) from exc
        check_weights(d, want, hashlib.sha256(data).hexdigest(), state)
        if "vocab_ids" not in state:
            raise SparsemmError(f"{d}/model.safetensors has no vocab_ids; re-create the model")
        model = cls(config, state["vocab_ids"].numpy())
        want = meta.get("backbone_sha256")
        if want is not None and want != model.backbone_digest():
            raise SparsemmError(
                f"the text backbone found for {d} differs from the one the model was trained "
                "on (sha256 mismatch); install the same all-MiniLM-L6-v2 or set text_model"
            )
        try:
            model.load_trainable_state(state)
        except RuntimeError as exc:
            raise SparsemmError(
                f"{d}/model.safetensors does not match config.json ({exc}); re-create the model"
            ) from exc
        model.eval()
        return model

    def n_parameters(self, trainable_only: bool = True) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def expected_flops(item_codes: sp.csr_matrix, query_codes: sp.csr_matrix) -> float:
    """Mean multiplications per (query, item) pair of an inverted index:
    sum_v p_item(v) p_query(v), p(v) = share of rows with a non-zero on v (Paria et al.)."""
    pi = np.asarray((sp.csr_matrix(item_codes) != 0).mean(axis=0)).ravel()
    pq = np.asarray((sp.csr_matrix(query_codes) != 0).mean(axis=0)).ravel()
    return float(pi @ pq)
