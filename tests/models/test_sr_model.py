from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from sparsemm.errors import SparsemmError
from sparsemm.models.base import topk_mask
from sparsemm.models.sr import SRConfig, SRModel


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


def test_save_keeps_other_files_and_leaves_no_temp(tmp_path) -> None:
    out = tmp_path / "m"
    _model().save_pretrained(out)
    (out / "history.json").write_text("{}")  # what a trainer keeps beside the model
    (out / "checkpoint").mkdir()
    (out / "checkpoint" / "state.json").write_text("{}")
    bigger = SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=33, top_k=3))
    bigger.save_pretrained(out)
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint",
        "config.json",
        "history.json",
        "model.safetensors",
    ]
    assert (out / "checkpoint" / "state.json").is_file()
    assert SRModel.from_pretrained(out).config.latent_dim == 33


def test_a_killed_writers_temp_folder_is_swept_but_a_live_ones_kept(tmp_path) -> None:
    out = tmp_path / "m"
    _model().save_pretrained(out)
    dead = out / ".pretrained.tmp.999999999.abc"  # no such pid
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"half")
    live = out / f".pretrained.tmp.{os.getppid()}.xyz"  # a live process (our parent)
    live.mkdir()
    _model().save_pretrained(out)
    assert not dead.exists() and live.is_dir()


def test_a_committed_but_unmoved_pair_is_the_model(tmp_path) -> None:
    """A kill after the commit rename and before both files moved up: the pending pair
    wins over the (mixed) top-level files, and the next save finishes the move. A kill
    while deleting the pending folder (both files already up) leaves it incomplete: the
    top level is read."""
    import shutil

    from sparsemm.models.base import PENDING_DIR

    out, pending = tmp_path / "m", tmp_path / "m" / PENDING_DIR
    _model().save_pretrained(out)
    SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=25, top_k=3)).save_pretrained(
        tmp_path / "new"
    )
    shutil.copytree(tmp_path / "new", pending)
    shutil.copy(pending / "model.safetensors", out / "model.safetensors")  # one file moved up
    assert SRModel.from_pretrained(out).config.latent_dim == 25  # not the mixed top level
    shutil.copy(pending / "config.json", out / "config.json")  # both up ...
    (pending / "config.json").unlink()  # ... and killed while deleting the pending folder
    assert SRModel.from_pretrained(out).config.latent_dim == 25
    _model().save_pretrained(out)
    assert not pending.exists() and SRModel.from_pretrained(out).config.latent_dim == 20


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([1, 2], "config.json is malformed"),
        ({"model_type": "sr", "top_k": "8"}, "config.json is malformed"),
        ({"model_type": "sr", "latent_dim": 10, "top_k": 30}, "config.json is malformed"),
        ({"model_type": "sr", "training": [1]}, "config.json is malformed"),
        ({"model_type": "vdr"}, "holds a 'vdr' model"),
        ({"model_type": "sr", "colour": 1}, "upgrade sparsemm"),
    ],
)
def test_malformed_configs_are_sparsemm_errors(tmp_path, config, message) -> None:
    import json

    out = tmp_path / "m"
    _model().save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(SparsemmError, match=message):
        SRModel.from_pretrained(out)


def test_training_record_round_trips_and_is_checked(tmp_path) -> None:
    from sparsemm.models.base import check_encoders, encoder_record

    manifest = {
        "encoder": {"name": "efficientnet", "dim": 1280, "model": "lite0"},
        "text_encoder": {"name": "minilm", "dim": 384, "model": "all-MiniLM-L6-v2"},
    }
    model = _model()
    model.training_info = encoder_record(manifest, tmp_path / "col")
    model.save_pretrained(tmp_path / "m")
    loaded = SRModel.from_pretrained(tmp_path / "m")
    assert loaded.training_info == model.training_info
    assert loaded.training_info["text_encoder"] == manifest["text_encoder"]
    check_encoders(loaded.training_info, manifest, "m", "col")  # same encoders
    check_encoders(None, manifest, "m", "col")  # no record: accepted
    local = {
        **manifest,
        "text_encoder": {**manifest["text_encoder"], "model": "/w/all-MiniLM-L6-v2"},
    }
    check_encoders(loaded.training_info, local, "m", "col")  # a local copy of the same model
    other = {**manifest, "text_encoder": {"name": "minilm", "dim": 384, "model": "e5-small"}}
    with pytest.raises(SparsemmError, match=r"texts: trained on minilm all-MiniLM-L6-v2 \(384-d\)"):
        check_encoders(loaded.training_info, other, "m", "col")
    one = {"encoder": {"name": "minilm", "dim": 384, "model": "all-MiniLM-L6-v2"}}
    with pytest.raises(SparsemmError, match="images: trained on efficientnet") as err:
        check_encoders(loaded.training_info, one, "m", "col")
    assert "texts:" not in str(err.value)  # the text side matches
    tables = {"encoder": {"name": "precomputed", "dim": 8, "model": "/a/train.npy"}}
    record = encoder_record(tables)
    check_encoders(record, {"encoder": {**tables["encoder"], "model": "/b/test.npy"}}, "m", "c")
