"""SR-BoW: SR with a caption word-prediction head (training smoke tests)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.train.sr import SRTrainConfig
from sparsemm.train.sr_variants import (
    WordLossConfig,
    caption_vocabulary,
    train_sr_words,
    word_targets,
)

WORDS = ["dog", "cat", "car", "tree", "ball", "kite"]


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    n_items = 30
    present = rng.random((n_items, len(WORDS))) < 0.35
    present[np.arange(n_items), rng.integers(0, len(WORDS), n_items)] = True
    img = present.astype(np.float32) + 0.05 * rng.normal(size=present.shape).astype(np.float32)
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    pair_item = np.repeat(np.arange(n_items), 2)
    caps = [
        " and ".join(f"a {w}" for w, p in zip(WORDS, present[i], strict=True) if p)
        for i in pair_item
    ]
    txt = img[pair_item] + 0.1 * rng.normal(size=(len(pair_item), len(WORDS))).astype(np.float32)
    bias = sp.random(len(pair_item), 16, density=0.1, random_state=seed, format="csr")
    return img, txt, pair_item, bias.astype(np.float32), caps


def test_vocabulary_and_targets() -> None:
    caps = ["two dogs and a cat", "a dog", "a car"]
    vocab = caption_vocabulary(caps, size=2, min_count=1)
    assert vocab[0] == "dog" and len(vocab) == 2
    y = word_targets(caps, ["dog", "car"]).toarray()
    assert y.tolist() == [[1, 0], [1, 0], [0, 1]]
    with pytest.raises(SparsemmError, match="frequent"):
        caption_vocabulary(caps, size=5, min_count=10)


def test_train_sr_words_learns_and_saves_a_plain_sr(tmp_path) -> None:
    img, txt, pi, bias, caps = _data()
    cfg = SRConfig(text_dim=len(WORDS), image_dim=len(WORDS), latent_dim=16, top_k=4)
    model, hist = train_sr_words(
        img,
        txt,
        pi,
        bias,
        caps,
        cfg,
        tmp_path,
        SRTrainConfig(epochs=6, batch_size=16),
        WordLossConfig(vocab_size=10, min_count=1),
        progress=False,
    )
    assert hist[-1]["words"] < hist[0]["words"]
    assert hist[-1]["total"] < hist[0]["total"]
    for name in ("model.safetensors", "config.json", "word_head.safetensors", "word_vocab.txt"):
        assert (tmp_path / name).is_file()
    loaded = SRModel.from_pretrained(tmp_path)
    a = model.encode(img, "image").toarray()
    assert np.allclose(a, loaded.encode(img, "image").toarray())
    assert (np.count_nonzero(a, axis=1) <= 4).all()
    # Resuming a finished run with the same settings changes nothing.
    again, hist2 = train_sr_words(
        img,
        txt,
        pi,
        bias,
        caps,
        cfg,
        tmp_path,
        SRTrainConfig(epochs=6, batch_size=16),
        WordLossConfig(vocab_size=10, min_count=1),
        resume=True,
        progress=False,
    )
    assert len(hist2) == 6
    assert np.allclose(again.encode(img, "image").toarray(), a)
    with pytest.raises(SparsemmError, match="other settings"):
        train_sr_words(
            img,
            txt,
            pi,
            bias,
            caps,
            cfg,
            tmp_path,
            SRTrainConfig(epochs=6, batch_size=16),
            WordLossConfig(vocab_size=10, min_count=1, weight=3.0),
            resume=True,
            progress=False,
        )
