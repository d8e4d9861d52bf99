"""The numpy inference side of the trained models (SRLite, AlignerLite) against the torch
models they stand in for at query time, and the ArrayModule save/load they share with the
photo concept model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("torch")

import torch

from sparsemm.errors import SparsemmError
from sparsemm.models.base import WEIGHTS_FILE
from sparsemm.models.lit_lite import AlignerLite
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.models.sr_lite import SRLite, topk_rows
from sparsemm_experiments.models.lit import AlignConfig, LinearAligner

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _sr(tmp_path: Path, **cfg: object) -> tuple[SRModel, SRLite]:
    torch.manual_seed(0)
    model = SRModel(SRConfig(**cfg))  # type: ignore[arg-type]
    model.save_pretrained(tmp_path / "sr")
    return model, SRLite.from_pretrained(tmp_path / "sr")


CONFIGS = [
    {"text_dim": 24, "image_dim": 24, "latent_dim": 40, "top_k": 6},
    {"text_dim": 16, "image_dim": 32, "latent_dim": 50, "top_k": 9, "shared": False},
    {"text_dim": 24, "image_dim": 24, "latent_dim": 40, "top_k": 5, "activation": "none"},
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("modality", ["text", "image"])
def test_sr_lite_codes_equal_the_torch_model_on_random_inputs(
    tmp_path: Path, cfg: dict, modality: str
) -> None:
    model, lite = _sr(tmp_path, **cfg)
    k_in = model.config.image_dim if modality == "image" else model.config.text_dim
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, k_in)).astype(np.float32)
    bias = sp.random(300, model.config.latent_dim, density=0.05, random_state=2, format="csr")
    for kwargs in (
        {},
        {"top_k": 3},
        {"mask": "all"},
        {"mask": "topk_or_bias", "bias": bias},
        {"batch_size": 7},
    ):
        want = model.encode(x, modality, **kwargs)
        got = lite.encode(x, modality, **kwargs)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.abs(got.toarray() - want.toarray()).max() <= 1e-6, kwargs
        # the same active dimensions, not just close values
        assert np.array_equal(got.toarray() != 0, want.toarray() != 0), kwargs
    codes = lite.encode(x[:20], modality)
    assert np.allclose(
        lite.reconstruct(codes, modality), model.reconstruct(codes, modality), atol=1e-5
    )


def test_sr_lite_from_a_model_in_memory_and_bad_input(tmp_path: Path) -> None:
    model, saved = _sr(tmp_path, **CONFIGS[0])
    lite = SRLite.from_model(model)
    x = np.random.default_rng(3).normal(size=(5, 24)).astype(np.float32)
    assert np.array_equal(lite.encode(x, "text").toarray(), saved.encode(x, "text").toarray())
    with pytest.raises(SparsemmError, match="dimension 24"):
        lite.encode(x[:, :10], "text")
    with pytest.raises(SparsemmError, match="NaN"):
        lite.encode(np.full((1, 24), np.nan, np.float32), "text")
    with pytest.raises(SparsemmError, match="modality"):
        lite.encode(x, "audio")
    assert lite.encode(x[:0], "text").shape == (0, 40)


def test_topk_rows_keeps_each_rows_k_largest() -> None:
    z = np.random.default_rng(4).normal(size=(50, 30)).astype(np.float32)
    m = topk_rows(z, 4)
    assert (m.sum(axis=1) == 4).all()
    assert np.array_equal(np.sort(np.where(m, z, -np.inf), axis=1)[:, -4:], np.sort(z)[:, -4:])
    assert topk_rows(z, 30).all()


def test_an_array_model_writes_the_file_its_torch_model_writes(tmp_path: Path) -> None:
    model, lite = _sr(tmp_path, **CONFIGS[1])
    lite.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / WEIGHTS_FILE).read_bytes() == (
        tmp_path / "sr" / WEIGHTS_FILE
    ).read_bytes()
    back = SRModel.from_pretrained(tmp_path / "again")
    for k, v in model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)


def test_an_array_model_refuses_weights_of_another_shape(tmp_path: Path) -> None:
    _sr(tmp_path, **CONFIGS[0])
    import json

    cfg = json.loads((tmp_path / "sr" / "config.json").read_text())
    cfg["latent_dim"] = 41
    (tmp_path / "sr" / "config.json").write_text(json.dumps(cfg))
    # the torch model's message, shortened to one line: the first mismatch and a count
    with pytest.raises(SparsemmError, match=r"does not match config\.json") as err:
        SRLite.from_pretrained(tmp_path / "sr")
    msg = str(err.value)
    assert "(size mismatch for enc_text.weight" in msg and "(and 2 more)" in msg
    assert "\n" not in msg
    cfg["latent_dim"] = 10**12  # nothing allocated before the shapes are compared
    (tmp_path / "sr" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SparsemmError, match=r"does not match config\.json"):
        SRLite.from_pretrained(tmp_path / "sr")


def test_an_array_model_refuses_non_finite_weights(tmp_path: Path) -> None:
    model, _ = _sr(tmp_path, **CONFIGS[0])
    with torch.no_grad():
        model.enc_text.weight[0, 0] = float("nan")
    lite = SRLite.from_model(model)
    with pytest.raises(SparsemmError, match="NaN or inf"):
        lite.save_pretrained(tmp_path / "bad")


def test_aligner_lite_equals_the_torch_aligner(tmp_path: Path) -> None:
    torch.manual_seed(0)
    aligner = LinearAligner(AlignConfig(image_dim=20, text_dim=12, dim=8))
    aligner.save_pretrained(tmp_path / "align")
    lite = AlignerLite.from_pretrained(tmp_path / "align")
    rng = np.random.default_rng(5)
    img = rng.normal(size=(40, 20)).astype(np.float32)
    txt = rng.normal(size=(40, 12)).astype(np.float32)
    img[0] = 0.0  # a zero row stays zero (no division by zero)
    assert np.abs(lite.encode_image(img) - aligner.encode_image(img)).max() <= 1e-6
    assert np.abs(lite.encode_text_features(txt) - aligner.encode_text_features(txt)).max() <= 1e-6
    with pytest.raises(SparsemmError, match="features must be"):
        lite.encode_image(txt)
