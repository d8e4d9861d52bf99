"""SR training variant: concept dimensions supervised by the captions' words (SR-BoW).

The SR paper ("Answering Multimodal Exclusion Queries with Lightweight Sparse Disentangled
Representations", Prachi, Bhatia, Bedathur, ICTIR 2025) trains its codes with reconstruction
+ InfoNCE, steering dimension j towards SPINE dimension j through the caption bias mask.
Nothing asks a code to say *which objects the captions name*, which is what an exclusion
query needs. SR-BoW adds one term: a linear word head over the (masked, sparse) codes,

    L = L_SR + mu * [BCE(sigmoid(SR_img H + c), y_item) + BCE(sigmoid(SR_txt H + c), y_cap)]

with y_cap the caption's own words and y_item the words of *any* caption of the image, over
the ``vocab_size`` most frequent caption words (singular content tokens). The head is a
training device: the model that comes out is a plain :class:`~sparsemm.models.sr.SRModel`
(same config, same files, loads with ``from_pretrained``); the head and its vocabulary are
saved beside it (``word_head.safetensors``, ``word_vocab.txt``) for inspection.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from sparsemm.errors import SparsemmError
from sparsemm.io import write_json
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.text import term_tokens
from sparsemm.train.sr import SRTrainConfig, fit_sr
from sparsemm.words.vectors import write_words

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WordLossConfig:
    vocab_size: int = 2000  # most frequent caption words the head predicts
    min_count: int = 5  # a word must occur in at least this many training captions
    weight: float = 1.0  # mu: weight of the word-prediction BCE next to the SR loss


def caption_vocabulary(captions: Sequence[str], size: int, min_count: int) -> list[str]:
    """The ``size`` most frequent singular content words (counted once per caption)."""
    counts: Counter[str] = Counter()
    for c in captions:
        counts.update(set(term_tokens(c)))
    words = [w for w, n in counts.most_common() if n >= min_count][:size]
    if not words:
        raise SparsemmError("no caption word is frequent enough for the SR word head")
    return words


def word_targets(captions: Sequence[str], vocab: Sequence[str]) -> sp.csr_matrix:
    """(n_captions, |vocab|) float32 multi-hot of the vocabulary words in each caption."""
    index = {w: j for j, w in enumerate(vocab)}
    rows, cols = [], []
    for i, c in enumerate(captions):
        for j in {index[t] for t in term_tokens(c) if t in index}:
            rows.append(i)
            cols.append(j)
    data = np.ones(len(rows), dtype=np.float32)
    return sp.csr_matrix((data, (rows, cols)), shape=(len(captions), len(vocab)))


class _SRWithHead(nn.Module):
    """SRModel + a linear word head (training only)."""

    def __init__(self, config: SRConfig, n_words: int) -> None:
        super().__init__()
        self.sr = SRModel(config)
        self.head = nn.Linear(config.latent_dim, n_words)


def train_sr_words(
    image_emb: np.ndarray,
    text_emb: np.ndarray,
    pair_item: np.ndarray,
    bias: sp.csr_matrix | None,
    captions: Sequence[str],
    config: SRConfig,
    out_dir: str | Path,
    train: SRTrainConfig | None = None,
    words: WordLossConfig | None = None,
    resume: bool = False,
    progress: bool = True,
) -> tuple[SRModel, list[dict[str, float]]]:
    """Train SR-BoW on pairs (image_emb[pair_item[j]], text_emb[j], captions[j]).

    Same inputs as :func:`sparsemm.train.sr.train_sr` plus each pair's caption text.
    Writes the SR model (``config.json``, ``model.safetensors``), ``word_head.safetensors``,
    ``word_vocab.txt`` and ``history.json`` into ``out_dir``; checkpoints every epoch and
    resumes with ``resume=True``. Deterministic on CPU for a fixed seed.
    """
    train = train or SRTrainConfig()
    words = words or WordLossConfig()
    out = Path(out_dir)
    n = len(text_emb)
    if len(pair_item) != n or len(captions) != n:
        raise SparsemmError("pair_item and captions need one entry per text embedding")
    vocab = caption_vocabulary(captions, words.vocab_size, words.min_count)
    y_cap = word_targets(captions, vocab)
    # Item targets: any caption of the image names the word.
    n_items = int(np.max(pair_item)) + 1
    owner = sp.csr_matrix(
        (np.ones(n, dtype=np.float32), (np.asarray(pair_item), np.arange(n))), shape=(n_items, n)
    )
    y_item = sp.csr_matrix(((owner @ y_cap) > 0).astype(np.float32))

    torch.manual_seed(train.seed)
    model = _SRWithHead(config, len(vocab))
    settings = {
        "config": dataclasses.asdict(config),
        "train": dataclasses.asdict(train),
        "words": dataclasses.asdict(words),
    }

    def word_loss(
        o: dict[str, torch.Tensor], idx: np.ndarray, items: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        yi = torch.from_numpy(y_item[items.numpy()].toarray())
        yt = torch.from_numpy(y_cap[idx].toarray())
        bce = F.binary_cross_entropy_with_logits(
            model.head(o["sr_image"]), yi
        ) + F.binary_cross_entropy_with_logits(model.head(o["sr_text"]), yt)
        # BCE is a mean over |V| outputs; scale by |V| / 100 so mu ~ 1 is a fair weight.
        words_loss = bce * (len(vocab) / 100.0)
        return {"words": words_loss}, words.weight * words_loss

    history = fit_sr(
        model,
        model.sr,
        image_emb,
        text_emb,
        pair_item,
        bias,
        out,
        train,
        settings,
        resume=resume,
        progress=progress,
        extra_loss=word_loss,
        desc="SR-BoW",
    )
    model.sr.save_pretrained(out)
    save_file(
        {k: v.detach().contiguous() for k, v in model.head.state_dict().items()},
        str(out / "word_head.safetensors"),
    )
    write_words(out / "word_vocab.txt", vocab)
    write_json(out / "history.json", {**settings, "history": history})
    return model.sr, history
