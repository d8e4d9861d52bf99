"""LexLIP model: lexicon weights, bottleneck and decoder shapes, masking, save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fakes import tiny_lexlip_config
from sparsemm.errors import SparsemmError
from sparsemm_experiments.models.lexlip import (
    LexLIPConfig,
    LexLIPModel,
    corpus_lexicon,
    default_lexicon,
    expected_flops,
    flops_loss,
    lexicon_weights,
    load_tokenizer,
    max_pool,
    pool_rows,
    saturate,
)
from sparsemm_experiments.train.lexlip import mask_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


CAPTIONS = [
    "a dog runs on the grass",
    "a black dog with a red ball",
    "two cats sleep on a sofa",
    "a cat and a dog in a kitchen",
    "a red car parked on the street",
    "people ride bikes on the street",
]


def tiny_config(**kw: object) -> LexLIPConfig:
    return tiny_lexlip_config(**{"max_text_len": 12, "image_dim": 8, "queue_size": 8, **kw})


@pytest.fixture(scope="module")
def vocab() -> np.ndarray:
    return corpus_lexicon(CAPTIONS, load_tokenizer(tiny_config()), min_count=1)


@pytest.fixture(scope="module")
def model(vocab: np.ndarray) -> LexLIPModel:
    return LexLIPModel(tiny_config(lexicon_size=len(vocab)), vocab)


def test_saturation_and_max_pool_equal_naive_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=gen)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    got = lexicon_weights(logits, mask)
    for i in range(3):
        for v in range(7):
            vals = [
                float(np.log1p(max(float(logits[i, t, v]), 0.0))) for t in range(5) if mask[i, t]
            ]
            assert float(got[i, v]) == pytest.approx(max(vals) if vals else 0.0, abs=1e-6)
    assert (got >= 0).all()
    # Packed pooling equals the padded one.
    flat = logits[mask]
    rows = torch.arange(3)[:, None].expand(-1, 5)[mask]
    assert torch.equal(saturate(pool_rows(flat, rows, 3)), saturate(max_pool(logits, mask)))


def test_text_lexicon_is_max_over_caption_pieces(model: LexLIPModel) -> None:
    ids, mask = model.tokenize(CAPTIONS[:3])
    out = model.text_forward(ids, mask)
    eligible = model.lexicon_mask(ids, mask)
    # [CLS], [SEP] and padding never enter the lexicon.
    assert not eligible[:, 0].any()
    assert eligible.sum() == out["flat_logits"].shape[0]
    logits = model.text_top.head(out["hidden"], model.lexicon_embeddings())  # padded layout
    assert torch.allclose(out["lexicon"], lexicon_weights(logits, eligible), atol=1e-5)
    assert out["lexicon"].shape == (3, model.config.lexicon_size)
    assert out["dense"].shape == (3, model.config.dense_dim)


def test_bottleneck_and_decoder_shapes(model: LexLIPModel) -> None:
    ids, mask = model.tokenize(CAPTIONS[:4])
    text = model.text_forward(ids, mask)
    b = model.bottleneck(text["pooled"])
    assert b.shape == (4, model.config.hidden)
    emb = model.text_lower.word_embeddings[model.vocab_ids]
    assert torch.allclose(b, torch.softmax(text["pooled"], dim=-1) @ emb, atol=1e-5)
    # A row with no pooled position (all -inf) gives a finite (uniform) bottleneck.
    empty = torch.full((1, model.config.lexicon_size), float("-inf"))
    assert torch.isfinite(model.bottleneck(empty)).all()
    full = model.decode_logits(b, ids, mask)
    assert full.shape == (4, ids.shape[1], model.config.lexicon_size)
    pos = model.lexicon_mask(ids, mask)
    part = model.decode_logits(b, ids, mask, pos)
    assert part.shape == (int(pos.sum()), model.config.lexicon_size)
    model.eval()
    assert torch.allclose(model.decode_logits(b, ids, mask)[pos], part, atol=1e-5)
    patches = torch.randn(2, 5, model.config.image_dim)
    pmask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    image = model.image_forward(patches, pmask)
    assert image["logits"].shape == (2, 6, model.config.lexicon_size)  # [CLS] + 5 patches
    assert model.bottleneck(image["pooled"]).shape == (2, model.config.hidden)
    # Padded patches do not change the result.
    patches2 = patches.clone()
    patches2[0, 3:] = 100.0
    assert torch.allclose(model.image_forward(patches2, pmask)["lexicon"][0], image["lexicon"][0])


@pytest.mark.parametrize("rate", [0.3, 0.5])
def test_mask_tokens_masks_exactly_the_rate_of_eligible_pieces(rate: float) -> None:
    gen = torch.Generator().manual_seed(1)
    n, length = 400, 20
    lengths = torch.randint(2, length + 1, (n,), generator=gen)
    eligible = torch.arange(length)[None, :] < lengths[:, None]
    eligible[:, 0] = False  # like [CLS]
    ids = torch.randint(1000, 2000, (n, length), generator=gen)
    masked, chosen = mask_tokens(ids, eligible, rate, 103, gen)
    assert not (chosen & ~eligible).any()
    n_elig = eligible.sum(dim=1)
    expected = torch.clamp(torch.round(n_elig.float() * rate).long(), min=1)
    assert torch.equal(chosen.sum(dim=1), torch.minimum(expected, n_elig))
    assert (masked[chosen] == 103).all() and torch.equal(masked[~chosen], ids[~chosen])
    share = chosen.sum().item() / eligible.sum().item()
    assert abs(share - rate) < 0.03


def test_flops_loss_and_expected_flops() -> None:
    a = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    assert float(flops_loss(a)) == pytest.approx(2.0**2 + 0.0 + 1.0**2)
    import scipy.sparse as sp

    items = sp.csr_matrix(np.array([[1, 0, 1], [1, 0, 0]], dtype=np.float32))
    queries = sp.csr_matrix(np.array([[1, 1, 0]], dtype=np.float32))
    assert expected_flops(items, queries) == pytest.approx(1.0 * 1.0 + 0.0 * 1.0 + 0.5 * 0.0)


def test_encode_outputs(model: LexLIPModel) -> None:
    lex, dense = model.encode_text(CAPTIONS, batch_size=4)
    assert lex.shape == (len(CAPTIONS), model.config.lexicon_size)
    assert (lex.data > 0).all()
    assert np.allclose(np.linalg.norm(dense, axis=1), 1.0, atol=1e-5)
    # Length-sorted batching returns rows in input order.
    one, _ = model.encode_text([CAPTIONS[3]])
    assert abs(one - lex[3]).max() < 1e-5
    top, _ = model.encode_text(CAPTIONS, top_k=3)
    assert top.getnnz(axis=1).max() <= 3
    patches = np.random.default_rng(0).normal(size=(5, 4, 8)).astype(np.float32)
    ilex, idense = model.encode_items(patches, batch_size=2, top_k=4)
    assert ilex.shape == (5, model.config.lexicon_size) and idense.shape == (5, 8)
    assert ilex.getnnz(axis=1).max() <= 4
    with pytest.raises(SparsemmError, match="patches"):
        model.encode_items(patches[:, :, :3])
    bad = patches.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(SparsemmError, match="NaN"):
        model.encode_items(bad)
    assert len(model.terms) == model.config.lexicon_size
    assert "dog" in model.terms and "[CLS]" not in model.terms


def test_save_load_round_trip(tmp_path, model: LexLIPModel) -> None:
    model.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["model_type"] == "lexlip"
    loaded = LexLIPModel.from_pretrained(tmp_path / "m")
    a, da = model.encode_text(CAPTIONS)
    b, db = loaded.encode_text(CAPTIONS)
    assert abs(a - b).max() == 0 and np.array_equal(da, db)
    patches = np.ones((2, 3, 8), dtype=np.float32)
    assert abs(model.encode_items(patches)[0] - loaded.encode_items(patches)[0]).max() == 0
    with pytest.raises(SparsemmError, match="not a saved LexLIP"):
        LexLIPModel.from_pretrained(tmp_path / "nothing")
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "model_type": "sr"}))
    with pytest.raises(SparsemmError, match="'sr' model"):
        LexLIPModel.from_pretrained(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "lexicon_size": 3}))
    with pytest.raises(SparsemmError):
        LexLIPModel.from_pretrained(tmp_path / "m")


def test_pretrained_backbone_is_not_stored_but_checked(tmp_path, vocab: np.ndarray) -> None:
    cfg = LexLIPConfig(
        lexicon_size=len(vocab), image_dim=8, image_hidden=16, image_layers=1, queue_size=8
    )
    model = LexLIPModel(cfg, vocab)
    assert not any(k.startswith("text_lower.") for k in model.trainable_state())
    # Only the last MiniLM layer (plus the small heads) is trained and stored.
    assert model.n_parameters() < 0.2 * model.n_parameters(trainable_only=False)
    model.save_pretrained(tmp_path / "m")
    size = (tmp_path / "m" / "model.safetensors").stat().st_size
    assert size < 20e6  # the 90 MB backbone is reloaded, not copied
    loaded = LexLIPModel.from_pretrained(tmp_path / "m")
    assert abs(model.encode_text(CAPTIONS[:2])[0] - loaded.encode_text(CAPTIONS[:2])[0]).max() == 0
    with torch.no_grad():
        loaded.text_lower.embeddings.word_embeddings.weight[5, 0] += 1.0
    loaded.save_pretrained(tmp_path / "changed")
    with pytest.raises(SparsemmError, match="backbone"):
        LexLIPModel.from_pretrained(tmp_path / "changed")


def test_lexicons_and_config_validation() -> None:
    tok = load_tokenizer(tiny_config())
    full = default_lexicon(tok)
    assert len(full) == LexLIPConfig().lexicon_size
    assert tok.mask_token_id not in set(full.tolist())
    ids = corpus_lexicon(CAPTIONS, tok, min_count=2)
    pieces = set(tok.convert_ids_to_tokens(ids.tolist()))
    assert {"dog", "a", "on", "street"} <= pieces and "kitchen" not in pieces
    with pytest.raises(SparsemmError):
        LexLIPConfig(enc_mask_rate=0.0)
    with pytest.raises(SparsemmError):
        LexLIPConfig(image_input="pixels")
    with pytest.raises(SparsemmError):
        LexLIPConfig(frozen_layers=7)
    with pytest.raises(SparsemmError, match="lexicon_size"):
        LexLIPModel(tiny_config(lexicon_size=5), ids)
