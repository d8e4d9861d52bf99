from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fakes import BERT_SPECIAL, tiny_bert  # noqa: E402
from sparsemm.errors import SparsemmError  # noqa: E402
from sparsemm_experiments.models.vdr import (  # noqa: E402
    VDRModel,
    elu1p,
    explain_pair,
    load_published_vdr,
    masked_max_pool,
    resparsify,
    sparsify,
    top_tokens,
    topk_mask,
    vocab_mask,
)

SPECIAL = [*BERT_SPECIAL, "[unused0]"]
WORDS = "a photo of cat dog red blue car tree on the man pizza plate . , ! 42 ##s".split()


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"), WORDS, special=SPECIAL, max_positions=64)


def _model(bert_dir: Path, **kw: object) -> VDRModel:
    kw = {"text_top_k": 4, "image_top_k": 3, "max_length": 16, **kw}
    m = VDRModel.from_bert(bert_dir, image_dim=kw.pop("image_dim", 8), **kw)  # type: ignore[arg-type]
    torch.manual_seed(1)
    with torch.no_grad():  # non-trivial biases, so the tests see them
        m.text_bias.normal_(0, 0.5)
        assert m.image_bias is not None
        m.image_bias.normal_(0, 0.5)
    return m.eval()


# ------------------------------------------------------------------------ pieces


def test_elu1p_values() -> None:
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0, float("-inf")])
    expected = [math.exp(-2.0), math.exp(-0.5), 1.0, 1.5, 4.0, 0.0]
    assert torch.allclose(elu1p(x), torch.tensor(expected), atol=1e-6)


def test_masked_max_pool_ignores_masked_positions() -> None:
    x = torch.tensor([[[1.0, 5.0], [9.0, 9.0], [3.0, 2.0]], [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]])
    mask = torch.tensor([[True, False, True], [False, False, False]])
    out = masked_max_pool(x, mask)
    assert out[0].tolist() == [3.0, 5.0]
    assert torch.isinf(out[1]).all() and (out[1] < 0).all()
    assert elu1p(out[1]).tolist() == [0.0, 0.0]  # an empty set encodes to zeros
    assert masked_max_pool(x, None)[0].tolist() == [9.0, 9.0]


def test_topk_or_bow_mask_hand_made() -> None:
    full = torch.tensor([[0.1, 0.5, 0.3, 0.05, 0.2], [0.9, 0.8, 0.7, 0.6, 0.5]])
    bow = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert topk_mask(full, 2).tolist() == [
        [False, True, True, False, False],
        [True, True, False, False, False],
    ]
    out = sparsify(full, 2, bow)
    expected = [[0.0, 0.5, 0.3, 0.05, 0.0], [0.9, 0.8, 0.0, 0.0, 0.0]]
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-7)
    assert sparsify(full, 2).tolist()[0] == pytest.approx([0.0, 0.5, 0.3, 0.0, 0.0])


def test_vocab_mask_rules() -> None:
    toks = ["[PAD]", "[unused3]", "[CLS]", ".", "dog", "##s", "é", "42", "!"]
    special = ["[PAD]", "[CLS]"]
    assert vocab_mask(toks, "alnum", special=special).tolist() == [
        False,
        False,
        False,
        False,
        True,
        True,
        False,
        True,
        False,
    ]
    assert vocab_mask(toks, "special", special=special).tolist() == [
        False,
        False,
        False,
        True,
        True,
        True,
        True,
        True,
        True,
    ]
    assert vocab_mask(toks, "shift", shift=4).tolist() == [False] * 4 + [True] * 5
    with pytest.raises(SparsemmError):
        vocab_mask(toks, "nope")


def test_resparsify_keeps_topk_plus_bow() -> None:
    codes = sp.csr_matrix(np.array([[0.1, 0.0, 0.5, 0.3, 0.2], [0.0, 0.4, 0.0, 0.0, 0.0]]))
    bow = sp.csr_matrix(np.array([[1, 0, 0, 0, 0], [0, 0, 1, 0, 0]], dtype=np.float32))
    out = resparsify(codes, 1, bow).toarray()
    np.testing.assert_allclose(out, [[0.1, 0, 0.5, 0, 0], [0, 0.4, 0, 0, 0]], atol=1e-7)
    assert resparsify(codes, 2).toarray()[0].tolist() == pytest.approx([0, 0, 0.5, 0.3, 0])


def test_explanation_contributions_sum_to_score() -> None:
    rng = np.random.default_rng(0)
    tokens = [f"t{i}" for i in range(50)]
    q = sp.random(1, 50, density=0.3, random_state=1, format="csr", dtype=np.float32)
    x = rng.random(50).astype(np.float32) * (rng.random(50) < 0.4)
    ex = explain_pair(q, x, tokens)
    assert ex.score == pytest.approx(float((q.toarray() @ x)[0]), rel=1e-6)
    assert sum(c.contribution for c in ex.contributions) == pytest.approx(ex.score, rel=1e-6)
    assert all(c.contribution == pytest.approx(c.query * c.item) for c in ex.contributions)
    assert [c.contribution for c in ex.contributions] == sorted(
        (c.contribution for c in ex.contributions), reverse=True
    )
    assert {c.token for c in ex.contributions} == {
        tokens[j] for j in np.flatnonzero((q.toarray()[0] != 0) & (x != 0))
    }
    top = top_tokens(x, tokens, 3)
    assert [v for _, v in top] == sorted(x[x > 0], reverse=True)[:3]
    with pytest.raises(SparsemmError):
        explain_pair(q, x[:10], tokens)


# ------------------------------------------------------------------------- model


def _reference_text(model: VDRModel, texts: list[str], k: int) -> np.ndarray:
    """VDR's text code computed step by step from the BERT parts (float32)."""
    enc = model.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model.text(**enc).last_hidden_state
        logits = model.ln_text(h) @ model.text.embeddings.word_embeddings.weight.T  # (n, L, V)
        logits = logits + model.text_bias
        logits[..., ~model.valid] = float("-inf")
        logits[~enc["attention_mask"].bool()] = float("-inf")
        full = elu1p(logits.max(dim=1).values)
        full = full / full.norm(dim=1, keepdim=True)
        out = np.zeros(full.shape, dtype=np.float32)
        for i, row in enumerate(full):
            keep = set(row.topk(k).indices.tolist())
            keep |= {t for t in enc["input_ids"][i].tolist() if model.valid[t]}
            idx = sorted(keep)
            out[i, idx] = row[idx].numpy()
    return out


def test_text_codes_match_step_by_step_reference(bert_dir: Path) -> None:
    model = _model(bert_dir)
    texts = ["a photo of a cat on the tree.", "pizza", "the red car, dogs!"]
    codes = model.encode_text(texts, batch_size=2)
    assert codes.shape == (3, model.config.vocab_size)
    np.testing.assert_allclose(codes.toarray(), _reference_text(model, texts, 4), atol=1e-6)
    # invalid tokens ([CLS], [SEP], punctuation, [unused0]) are never active
    tokens = model.tokens
    active = {tokens[j] for j in codes.indices}
    assert not active & {"[CLS]", "[SEP]", "[PAD]", "[unused0]", ".", ",", "!"}
    # the BoW entry: every valid token of the text is active, whatever its value
    bow = model.text_bow(texts)
    assert (bow.multiply(codes) > 0).sum() == bow.nnz
    assert {tokens[j] for j in bow[1].indices} == {"pizza"}
    no_bow = model.encode_text(texts, bow=False)
    assert (np.diff(no_bow.indptr) == 4).all()


def test_image_codes_max_pool_over_real_patches(bert_dir: Path) -> None:
    model = _model(bert_dir)
    rng = np.random.default_rng(0)
    patches = rng.normal(size=(4, 5, 8)).astype(np.float32)
    mask = np.ones((4, 5), dtype=bool)
    mask[0, 3:] = False
    codes = model.encode_image(patches, mask, batch_size=3)
    assert (np.diff(codes.indptr) == 3).all()
    # padding patches do not matter: item 0 equals its 3 real patches alone
    alone = model.encode_image(patches[:1, :3])
    np.testing.assert_allclose(codes[0].toarray(), alone.toarray(), atol=1e-6)
    with torch.no_grad():
        x = model.ln_image(model.image_adapter(torch.from_numpy(patches[1:2])))
        logits = x @ model.projection().T + model.image_bias[model.valid_ids()]
        full = torch.nn.functional.normalize(elu1p(logits.max(dim=1).values), dim=1)[0]
    dense = codes[1].toarray()[0][model.valid_ids().numpy()]
    top = full.topk(3).indices.numpy()
    np.testing.assert_allclose(dense[top], full[top].numpy(), atol=1e-6)
    with pytest.raises(SparsemmError, match="patches"):
        model.encode_image(patches[:, :, :4])


def test_save_load_round_trip(bert_dir: Path, tmp_path: Path) -> None:
    model = _model(bert_dir, vocab_filter="special")
    model.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "config.json").is_file()
    assert (tmp_path / "m" / "model.safetensors").is_file()
    loaded = VDRModel.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    assert loaded.tokens == model.tokens
    assert torch.equal(loaded.valid, model.valid)
    texts = ["a dog on the plate", "blue tree"]
    a, b = model.encode_text(texts), loaded.encode_text(texts)
    assert (a != b).nnz == 0
    p = np.random.default_rng(1).normal(size=(2, 3, 8)).astype(np.float32)
    assert (model.encode_image(p) != loaded.encode_image(p)).nnz == 0
    raw = json.loads((tmp_path / "m" / "config.json").read_text())
    assert raw["model_type"] == "vdr" and raw["text"]["hidden_size"] == 16


def test_calibrate_maps_kth_logit_to_one(bert_dir: Path) -> None:
    model = _model(bert_dir, text_top_k=5, image_top_k=5)
    texts = ["a photo of a cat", "the man on the car", "pizza on a plate"]
    patches = np.random.default_rng(0).normal(size=(3, 4, 8)).astype(np.float32)
    off = model.calibrate(texts, patches, rank=5)
    assert set(off) == {"text", "image"}
    with torch.no_grad():
        ids, attn = model.tokenize(texts)
        pooled = model.text_pooled(ids, attn)
        kth = pooled.topk(5, dim=1).values[:, -1].mean()
    assert float(kth) == pytest.approx(0.0, abs=1e-4)


def test_config_errors(bert_dir: Path) -> None:
    with pytest.raises(SparsemmError, match="text_top_k"):
        VDRModel.from_bert(bert_dir, text_top_k=10_000)
    with pytest.raises(SparsemmError, match="vocab_filter"):
        VDRModel.from_bert(bert_dir, vocab_filter="words")
    text_only = VDRModel.from_bert(bert_dir, image_dim=None, text_top_k=3)
    with pytest.raises(SparsemmError, match="no image side"):
        text_only.encode_image(np.zeros((1, 2, 8), dtype=np.float32))
    with pytest.raises(SparsemmError):
        VDRModel.from_bert(bert_dir.parent / "missing")


# ------------------------------------------------------------ published checkpoints


def _published(folder: Path, bert_dir: Path, shared: bool, fmt: str = "safetensors") -> dict:
    """A checkpoint laid out like the authors' text-to-text VDR retrievers."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    state = {}
    for name, seed in (("encoder_q", 0), ("encoder_p", 1)):
        if shared and name == "encoder_p":
            break
        bert = transformers.BertModel.from_pretrained(str(bert_dir), add_pooling_layer=False)
        torch.manual_seed(seed)
        ln = torch.nn.LayerNorm(16)
        with torch.no_grad():
            ln.weight.normal_(1, 0.1)
            ln.bias.normal_(0, 0.1)
            for p in bert.parameters():
                p.add_(0.01 * torch.randn_like(p))
        state.update({f"{name}.bert_model.{k}": v for k, v in bert.state_dict().items()})
        state.update({f"{name}.ln.{k}": v for k, v in ln.state_dict().items()})
    enc = {
        "type": "vdr",
        "model_id": str(bert_dir),
        "max_len": 12,
        "norm": False,
        "shift_vocab_num": 6,
        "pooling": "max",
        "topk": 5,
    }
    cfg = {"encoder_q": enc, "encoder_p": dict(enc), "shared_encoder": shared}
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = {k: v.contiguous() for k, v in state.items()}
    if fmt == "safetensors":
        save_file(tensors, str(folder / "model.safetensors"))
    else:
        torch.save(tensors, str(folder / "pytorch_model.bin"))
    return tensors


def _their_encoding(state: dict, prefix: str, bert_dir: Path, texts: list[str]) -> np.ndarray:
    """The published encoder's computation, written out: pad to max_len, pool every position,
    vocabulary = ids >= shift, no normalisation, mask = top-k OR bag-of-words."""
    bert = transformers.BertModel.from_pretrained(str(bert_dir), add_pooling_layer=False)
    bert.load_state_dict(
        {
            k[len(prefix + "bert_model.") :]: v
            for k, v in state.items()
            if ".bert_model." in k and k.startswith(prefix)
        }
    )
    bert.eval()
    ln = torch.nn.LayerNorm(16)
    ln.load_state_dict({"weight": state[prefix + "ln.weight"], "bias": state[prefix + "ln.bias"]})
    tok = transformers.BertTokenizerFast.from_pretrained(str(bert_dir))
    enc = tok(texts, padding="max_length", max_length=12, truncation=True, return_tensors="pt")
    with torch.no_grad():
        h = bert(**enc).last_hidden_state
        w = bert.embeddings.word_embeddings.weight[6:]
        v = elu1p(ln(h) @ w.T).max(dim=1).values  # (n, V - 6)
        out = np.zeros((len(texts), w.shape[0] + 6), dtype=np.float32)
        for i in range(len(texts)):
            keep = set(v[i].topk(5).indices.tolist())
            keep |= {t - 6 for t in enc["input_ids"][i].tolist() if t >= 6}
            for j in keep:
                out[i, j + 6] = float(v[i, j])
    return out


@pytest.mark.parametrize(("shared", "fmt"), [(False, "safetensors"), (True, "bin")])
def test_load_published_vdr_reproduces_their_encoding(
    bert_dir: Path, tmp_path: Path, shared: bool, fmt: str
) -> None:
    state = _published(tmp_path / "ckpt", bert_dir, shared, fmt)
    model = load_published_vdr(tmp_path / "ckpt")
    assert model.config.shared_text is shared and model.config.vocab_filter == "shift"
    texts = ["a photo of a cat", "the man on the red car."]
    q = model.encode_text(texts, tower="query")
    np.testing.assert_allclose(
        q.toarray(), _their_encoding(state, "encoder_q.", bert_dir, texts), atol=1e-5
    )
    d = model.encode_text(texts, tower="document")
    ref_d = _their_encoding(state, "encoder_q." if shared else "encoder_p.", bert_dir, texts)
    np.testing.assert_allclose(d.toarray(), ref_d, atol=1e-5)


def test_load_published_refuses_cross_modal_and_missing(bert_dir: Path, tmp_path: Path) -> None:
    _published(tmp_path / "ckpt", bert_dir, True)
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    cfg["encoder_p"]["type"] = "vdr_cm_image"
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SparsemmError, match="cross-modal"):
        load_published_vdr(tmp_path / "ckpt")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(SparsemmError, match="encoder_q"):
        load_published_vdr(tmp_path / "empty")


def test_query_images_are_coded_like_items_of_a_collection_of_images(
    bert_dir: Path, tmp_path: Path
) -> None:
    """VDRCodeModel.encode_query_images: the image encoder's spatial features (float16, as
    the collection's cached patches are stored) through the image side; an encoder with no
    spatial features (a caption-proxy collection's) is refused in one line."""
    from sparsemm_experiments.code_models import VDRCodeModel

    _model(bert_dir).save_pretrained(tmp_path / "m")
    coder = VDRCodeModel(tmp_path / "m")
    feats = np.random.default_rng(2).normal(size=(2, 5, 8)).astype(np.float32)

    class Spatial:
        def encode_spatial(self, images: list[str]) -> np.ndarray:
            return feats[: len(images)]

    got = coder.encode_query_images(["a.png", "b.png"], Spatial())
    want = coder.model.encode_image(feats.astype(np.float16), None, top_k=coder.top_k)
    assert got.shape == want.shape and (got != want).nnz == 0
    with pytest.raises(SparsemmError, match="caption views"):
        coder.encode_query_images(["a.png"], object())
