"""CLIP/BLIP encoders on tiny randomly initialised models saved to and loaded from disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparsemm.encoders.base import get_encoder
from sparsemm.encoders.hf import BLIPEncoder, CLIPEncoder
from sparsemm.errors import SparsemmError

transformers = pytest.importorskip("transformers", reason="transformers not installed")
torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

WORDS = "[PAD] [UNK] [CLS] [SEP] a photo of cat dog red blue car tree on the".split()
TEXTS = ["a photo of a cat", "dog", "a red car on the tree", "blue", "zebra cat"]
PROJ = 24


def _tokenizer(tmp: Path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tk.save(str(tmp / "tokenizer-src.json"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp / "tokenizer-src.json"),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        model_max_length=16,
    )


def _tiny(kind: str) -> dict:
    text = dict(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,  # CLIP pools the state at [SEP]
    )
    if kind == "blip":
        text.update(sep_token_id=3, encoder_hidden_size=32)
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    return {"text_config": text, "vision_config": vision}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hf")
    tok = _tokenizer(tmp)
    torch.manual_seed(0)
    clip = transformers.CLIPModel(transformers.CLIPConfig(**_tiny("clip"), projection_dim=PROJ))
    clip_ip = transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    blip = transformers.BlipForImageTextRetrieval(
        transformers.BlipConfig(**_tiny("blip"), image_text_hidden_size=PROJ, projection_dim=PROJ)
    )
    blip_ip = transformers.BlipImageProcessor(size={"height": 32, "width": 32})
    out = {}
    for name, model, ip in (("clip", clip, clip_ip), ("blip", blip, blip_ip)):
        folder = tmp / name
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        ip.save_pretrained(folder)
        out[name] = folder
    rng = np.random.default_rng(0)
    images = []
    for i, shape in enumerate([(40, 50, 3), (32, 32, 3), (64, 48, 3), (20, 36)]):
        path = tmp / f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8)).save(path)
        images.append(path)
    out["images"] = tmp
    return out


def _images(folders) -> list[Path]:
    return sorted(folders["images"].glob("img*.png"))


@pytest.fixture(scope="module")
def encoders(folders):
    return {
        "clip": CLIPEncoder.from_pretrained(folders["clip"], device="cpu"),
        "blip": get_encoder("blip", model=str(folders["blip"]), device="cpu"),
    }


@pytest.mark.parametrize("name", ["clip", "blip"])
def test_shapes_norms_determinism(encoders, folders, name: str) -> None:
    enc = encoders[name]
    assert enc.name == name and enc.dim == PROJ
    t = enc.encode_text(TEXTS, batch_size=2)
    assert t.shape == (len(TEXTS), PROJ) and t.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(t, enc.encode_text(TEXTS, batch_size=2))
    images = _images(folders)
    v = enc.encode_image(images, batch_size=3)
    assert v.shape == (len(images), PROJ) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(v, enc.encode_image(images, batch_size=3))
    raw = enc.encode_text(TEXTS[:2], normalize=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), t[:2], atol=1e-5)
    assert enc.encode_text([]).shape == (0, PROJ)
    assert enc.encode_image([]).shape == (0, PROJ)


@pytest.mark.parametrize("name", ["clip", "blip"])
def test_batched_equals_one_by_one(encoders, folders, name: str) -> None:
    enc = encoders[name]
    batched = enc.encode_text(TEXTS, batch_size=len(TEXTS))
    single = np.concatenate([enc.encode_text([t], batch_size=1) for t in TEXTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    images = _images(folders)
    batched = enc.encode_image(images, batch_size=len(images))
    single = np.concatenate([enc.encode_image([p], batch_size=1) for p in images])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    # a PIL image gives the same embedding as its file
    with Image.open(images[0]) as img:
        np.testing.assert_allclose(enc.encode_image([img]), batched[:1], atol=1e-6)


def test_clip_matches_reference_forward(encoders, folders) -> None:
    enc = encoders["clip"]
    images = [Image.open(p).convert("RGB") for p in _images(folders)]
    tok = transformers.AutoTokenizer.from_pretrained(folders["clip"])
    ip = transformers.AutoImageProcessor.from_pretrained(folders["clip"])
    inputs = tok(TEXTS, padding=True, return_tensors="pt")
    pixels = ip(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = enc.model_(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=pixels,
        )
    np.testing.assert_allclose(enc.encode_text(TEXTS), out.text_embeds.numpy(), atol=1e-5)
    np.testing.assert_allclose(enc.encode_image(images), out.image_embeds.numpy(), atol=1e-5)


def test_blip_matches_itc_scores(encoders, folders) -> None:
    enc = encoders["blip"]
    image = Image.open(_images(folders)[0]).convert("RGB")
    tok = transformers.AutoTokenizer.from_pretrained(folders["blip"])
    ip = transformers.AutoImageProcessor.from_pretrained(folders["blip"])
    inputs = tok(TEXTS, padding=True, return_tensors="pt")
    pixels = ip(images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        scores = enc.model_(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=pixels,
            use_itm_head=False,
        ).itm_score  # (1 image, n texts) cosine similarities of the ITC embeddings
    ours = enc.encode_image([image]) @ enc.encode_text(TEXTS).T
    np.testing.assert_allclose(ours, scores.numpy(), atol=1e-5)


def test_components_constructor(folders) -> None:
    model = transformers.CLIPModel.from_pretrained(folders["clip"])
    tok = transformers.AutoTokenizer.from_pretrained(folders["clip"])
    ip = transformers.AutoImageProcessor.from_pretrained(folders["clip"])
    enc = CLIPEncoder(model, tok, ip, device="cpu", model_id="tiny-clip")
    assert enc.model_id == "tiny-clip" and enc.dim == PROJ
    assert enc.encode_text(["cat"]).shape == (1, PROJ)


def test_bad_images_and_paths(encoders, folders, tmp_path) -> None:
    enc = encoders["clip"]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    with pytest.raises(SparsemmError, match=r"broken\.jpg"):
        enc.encode_image([broken])
    with pytest.raises(SparsemmError, match=r"missing\.png"):
        enc.encode_image([tmp_path / "missing.png"])
    with pytest.raises(SparsemmError, match="PIL images or file paths"):
        enc.encode_image([np.zeros((4, 4, 3))])
    with pytest.raises(SparsemmError, match="not found"):
        CLIPEncoder.from_pretrained(tmp_path / "no-such-model")
    with pytest.raises(SparsemmError, match="could not load"):
        BLIPEncoder.from_pretrained(tmp_path)  # exists but holds no model
