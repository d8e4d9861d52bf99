"""CLIP and SigLIP for users who have them: a tiny CLIP and SigLIP built here from configs,
the SigLIP encoder against HF's own forward pass, the concept model (SpLiCE codes, zero-shot
probabilities, save/load), and `sparsemm up --encoder clip` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="transformers not installed")
pytest.importorskip("torch")

from PIL import Image

from fakes import tiny_clip
from sparsemm.cli.main import main
from sparsemm.encoders.hf import CLIPEncoder, SigLIPEncoder
from sparsemm.models.clip_concepts import ClipConceptModel, fit_temperature

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _photos(folder: Path, n: int = 6) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        arr = rng.integers(0, 256, size=(40 + 4 * i, 48, 3), dtype=np.uint8)
        arr[: 8 * (i + 1)] = 255 - arr[: 8 * (i + 1)]
        path = folder / f"p{i}.png"
        Image.fromarray(arr).save(path)
        out.append(path)
    return out


def test_siglip_matches_its_own_forward_and_pair_probability(tmp_path: Path) -> None:
    import torch
    import transformers

    folder = tiny_clip(tmp_path / "siglip", kind="siglip")
    enc = SigLIPEncoder.from_pretrained(folder, device="cpu")
    texts = ["a photo of a cat", "dog", "a red car on the tree"]
    images = [Image.open(p).convert("RGB") for p in _photos(tmp_path / "img", 3)]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ip = transformers.AutoImageProcessor.from_pretrained(folder)
    inputs = tok(texts, padding="max_length", return_tensors="pt")
    pixels = ip(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = enc.model_(input_ids=inputs["input_ids"], pixel_values=pixels)
    t, v = enc.encode_text(texts), enc.encode_image(images)
    np.testing.assert_allclose(t, out.text_embeds.numpy(), atol=1e-5)
    np.testing.assert_allclose(v, out.image_embeds.numpy(), atol=1e-5)
    scale, bias = enc.pair_logit()
    np.testing.assert_allclose(scale * t @ v.T + bias, out.logits_per_text.numpy(), atol=1e-4)


def test_concept_model_codes_probabilities_and_round_trip(tmp_path: Path) -> None:
    enc = CLIPEncoder.from_pretrained(tiny_clip(tmp_path / "clip"), device="cpu")
    images = enc.encode_image(_photos(tmp_path / "img"))
    concepts = ["cat", "dog", "car", "tree", "bus", "person", "tabby"]
    model = ClipConceptModel.build(concepts, enc, images, item_top_k=3)
    assert model.config.calibration == "fitted" and model.config.scale > 0
    codes = model.encode_images(images)
    assert codes.shape == (len(images), len(concepts))
    assert (codes.getnnz(axis=1) <= 3).all() and (codes.data >= 0).all()
    p = model.probability(images @ model.concept_emb.numpy().T)
    assert p.shape == (len(images), len(concepts)) and ((p > 0) & (p < 1)).all()
    model.save_pretrained(tmp_path / "m")
    back = ClipConceptModel.from_pretrained(tmp_path / "m")
    np.testing.assert_array_equal(back.encode_images(images).toarray(), codes.toarray())
    assert back.config == model.config
    vocab = back.vocabulary()
    dog = vocab.read("dog").concepts[0]
    assert [vocab.names[u] for u, _ in dog.units] == ["dog"]
    animal = {vocab.names[u] for u, _ in vocab.read("an animal").concepts[0].units}
    assert animal == {"cat", "dog", "tabby"}
    # "cats or dogs": the best of the term and each alternative's concepts, zero-shot
    from sparsemm.query.scorers import ZeroShotScorer
    from sparsemm.query.strategies import ExclusionContext

    scorer = ZeroShotScorer(back, vocab)
    ctx = ExclusionContext(items_dense=images, text_encoder=enc)
    union = scorer.read("cats or dogs")
    assert union.label == "cat or dog"
    assert [c.label for c in union.concepts[0].parts] == ["cat", "dog"]
    p_or = scorer.probability(union, ctx)
    for alt in ("cat", "dog"):
        assert np.all(p_or >= scorer.probability(scorer.read(alt), ctx) - 1e-9)


def test_fit_temperature_separates_present_from_absent() -> None:
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    present = rng.random((300, 20)) < 0.1
    cos = np.where(
        present, rng.normal(0.3, 0.05, present.shape), rng.normal(0.1, 0.05, present.shape)
    )
    scale, bias = fit_temperature(cos, sp.csr_matrix(present.astype(np.float32)))
    assert scale > 10
    p_at = lambda c: 1 / (1 + np.exp(-(scale * c + bias)))  # noqa: E731
    assert p_at(0.35) > 0.5 > p_at(0.05)


def test_up_with_clip_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tiny_clip(tmp_path / "clip")
    photos = tmp_path / "photos"
    _photos(photos)
    out = tmp_path / "out"
    argv = ["up", str(photos), "-o", str(out), "--encoder", "clip", "--encoder-model",
            str(folder), "--no-serve", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "building the clip concept model" in text and "built the index" in text
    manifest = json.loads((out / "collection" / "manifest.json").read_text())
    assert manifest["encoder"]["name"] == "clip" and manifest["text_encoder"]["name"] == "clip"
    assert main([*argv]) == 0  # a re-run reuses the model
    assert "building the clip concept model" not in capsys.readouterr().out
    search = ["search", str(out / "collection"), "a dog but no cat", "--json", "--no-server"]
    assert main(search) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["strategy"] == "match" and got["probabilistic"]
    assert len(got["hits"]) == 6 and all(0.0 <= h["score"] <= 1.0 for h in got["hits"])
    assert got["hits"][0]["evidence"][0]["kind"] == "zero-shot"
    assert main(["up", str(photos), "-o", str(out), "--encoder", "clip", "--train"]) == 2
    assert "--train" in capsys.readouterr().err
