from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRConfig, SRModel, topk_mask


def _model(**kw: object) -> SRModel:
    torch.manual_seed(0)
    cfg = SRConfig(text_dim=8, image_dim=8, latent_dim=20, top_k=3, **kw)  # type: ignore[arg-type]
    return SRModel(cfg)


def test_topk_mask_selects_k_largest() -> None:
    z = torch.tensor([[0.1, 0.9, 0.5, 0.3], [4.0, 1.0, 2.0, 3.0]])
    m = topk_mask(z, 2)
    assert m.tolist() == [[False, True, True, False], [True, False, False, True]]


def test_training_mask_is_bias_or_topk_exactly() -> None:
    model = _model()
    x = torch.randn(5, 8)
    bias = torch.zeros(5, 20)
    bias[0, [1, 7]] = 0.5
    bias[3, 19] = 0.1
    out = model(x, x, bias)
    z = model.latent(x, "text")
    expected_mask = topk_mask(z, 3) | (bias > 0)
    assert torch.equal(out["sr_text"], z * expected_mask)
    # Dims outside the mask are exactly zero; dims inside keep E_d's value.
    assert torch.all(out["sr_text"][~expected_mask] == 0)
    assert torch.equal(out["sr_text"][expected_mask], z[expected_mask])


def test_inference_is_topk_only_by_default() -> None:
    model = _model()
    x = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32)
    codes = model.encode(x, "image")
    assert codes.shape == (6, 20)
    assert (np.diff(codes.indptr) <= 3).all()
    bias = sp.csr_matrix(np.eye(6, 20, dtype=np.float32))
    assert (model.encode(x, "text", bias=bias) != model.encode(x, "text")).nnz == 0


def test_inference_mask_topk_or_bias_adds_bias_dims() -> None:
    model = _model(inference_mask="topk_or_bias", activation="none")
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    bias = sp.csr_matrix(np.ones((4, 20), dtype=np.float32))
    codes = model.encode(x, "text", bias=bias)
    assert (np.diff(codes.indptr) == 20).all()


def test_save_load_identical(tmp_path) -> None:
    model = _model(shared=False)
    model.save_pretrained(tmp_path / "m")
    loaded = SRModel.from_pretrained(tmp_path / "m")
    x = np.random.default_rng(1).normal(size=(7, 8)).astype(np.float32)
    for mod in ("image", "text"):
        a, b = model.encode(x, mod), loaded.encode(x, mod)
        assert (a != b).nnz == 0


def test_bad_inputs_raise_clear_errors(tmp_path) -> None:
    model = _model()
    with pytest.raises(SparsemmError, match="dimension 8"):
        model.encode(np.zeros((2, 5), np.float32), "image")
    with pytest.raises(SparsemmError, match="NaN"):
        model.encode(np.full((1, 8), np.nan, np.float32), "image")
    with pytest.raises(SparsemmError):
        SRConfig(top_k=0)
    with pytest.raises(SparsemmError, match="not a saved"):
        SRModel.from_pretrained(tmp_path)


def test_corrupt_or_mismatched_weights_are_clear_errors(tmp_path) -> None:
    model = _model()
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(SparsemmError, match="corrupt or does not match"):
        SRModel.from_pretrained(tmp_path / "m")
    model.save_pretrained(tmp_path / "m2")
    _model(shared=False).save_pretrained(tmp_path / "other")
    (tmp_path / "m2" / "model.safetensors").write_bytes(
        (tmp_path / "other" / "model.safetensors").read_bytes()
    )
    with pytest.raises(SparsemmError, match="corrupt or does not match"):
        SRModel.from_pretrained(tmp_path / "m2")
