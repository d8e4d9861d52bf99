from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.train.sr import SRTrainConfig, train_sr


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    img = rng.normal(size=(40, 12)).astype(np.float32)
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    pair_item = np.repeat(np.arange(40), 3)
    txt = img[pair_item] + 0.2 * rng.normal(size=(120, 12)).astype(np.float32)
    bias = sp.random(120, 30, density=0.05, random_state=seed, format="csr", dtype=np.float32)
    return img, txt, pair_item, bias


CFG = SRConfig(text_dim=12, image_dim=12, latent_dim=30, top_k=6)


def test_loss_falls_and_codes_stay_sparse(tmp_path) -> None:
    img, txt, pi, bias = _data()
    model, hist = train_sr(
        img, txt, pi, bias, CFG, tmp_path, SRTrainConfig(epochs=8, batch_size=32), progress=False
    )
    assert hist[-1]["loss"] < 0.8 * hist[0]["loss"]
    assert hist[-1]["nce"] < hist[0]["nce"]
    codes = model.encode(img, "image")
    assert codes.getnnz(axis=1).max() <= 6
    assert (tmp_path / "model.safetensors").is_file()
    assert (tmp_path / "history.json").is_file()


class _Interrupt(Exception):
    pass


def test_resume_equals_uninterrupted(tmp_path) -> None:
    img, txt, pi, bias = _data()
    tc = SRTrainConfig(epochs=4, batch_size=32)
    full, _ = train_sr(img, txt, pi, bias, CFG, tmp_path / "full", tc, progress=False)

    def crash_after_2(epoch: int, record: dict) -> None:
        if epoch == 2:
            raise _Interrupt

    part = tmp_path / "part"
    with pytest.raises(_Interrupt):
        train_sr(img, txt, pi, bias, CFG, part, tc, progress=False, on_epoch_end=crash_after_2)
    assert not (part / "model.safetensors").exists()
    resumed, hist = train_sr(img, txt, pi, bias, CFG, part, tc, resume=True, progress=False)
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4]
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


def test_resume_with_other_settings_is_refused(tmp_path) -> None:
    img, txt, pi, bias = _data()
    train_sr(img, txt, pi, bias, CFG, tmp_path, SRTrainConfig(epochs=1), progress=False)
    with pytest.raises(SparsemmError, match="other settings"):
        train_sr(
            img,
            txt,
            pi,
            bias,
            CFG,
            tmp_path,
            SRTrainConfig(epochs=1, lr=0.5),
            resume=True,
            progress=False,
        )


def test_deterministic_for_seed(tmp_path) -> None:
    img, txt, pi, bias = _data()
    tc = SRTrainConfig(epochs=2, batch_size=32, seed=3)
    a, _ = train_sr(img, txt, pi, bias, CFG, tmp_path / "a", tc, progress=False)
    b, _ = train_sr(img, txt, pi, bias, CFG, tmp_path / "b", tc, progress=False)
    assert (a.encode(img, "image") != b.encode(img, "image")).nnz == 0
    loaded = SRModel.from_pretrained(tmp_path / "a")
    assert (loaded.encode(img, "text") != a.encode(img, "text")).nnz == 0


def test_no_bias_ablation_trains(tmp_path) -> None:
    img, txt, pi, _ = _data()
    _, hist = train_sr(
        img, txt, pi, None, CFG, tmp_path, SRTrainConfig(epochs=3, batch_size=32), progress=False
    )
    assert hist[-1]["loss"] < hist[0]["loss"]


def test_resume_on_other_data_is_refused(tmp_path) -> None:
    img, txt, pi, bias = _data()
    train_sr(img, txt, pi, bias, CFG, tmp_path, SRTrainConfig(epochs=1), progress=False)
    with pytest.raises(SparsemmError, match="other settings or data"):
        train_sr(
            img, txt, pi, None, CFG, tmp_path, SRTrainConfig(epochs=1), resume=True, progress=False
        )


def test_train_config_validation() -> None:
    with pytest.raises(SparsemmError, match="batch_size"):
        SRTrainConfig(batch_size=1)
    with pytest.raises(SparsemmError):
        SRTrainConfig(epochs=0)


def test_cli_records_the_training_collections_encoders(tmp_path) -> None:
    import json

    from sparsemm.cli.main import main
    from sparsemm.data.collection import write_collection

    img, txt, pi, _ = _data()
    items = [{"id": f"i{i}", "captions": [f"c{i}"] * 3, "split": "train"} for i in range(40)]
    write_collection(
        tmp_path / "col",
        items,
        {"name": "efficientnet", "dim": 12, "model": "lite0"},
        image_emb=img,
        text_emb=txt,
        texts=[{"item": int(i), "text": f"c{i}"} for i in pi],
        text_encoder={"name": "minilm", "dim": 12, "model": "all-MiniLM-L6-v2"},
    )
    out = tmp_path / "sr"
    (out / "config.json").parent.mkdir()
    argv = ["train", "sr", str(tmp_path / "col"), "-o", str(out), "--no-bias", "--latent-dim"]
    argv += ["30", "--top-k", "6", "--epochs", "2", "--batch-size", "32", "--no-progress"]
    assert main(argv) == 0
    record = SRModel.from_pretrained(out).training_info
    assert record == {
        "image_encoder": {"name": "efficientnet", "dim": 12, "model": "lite0"},
        "text_encoder": {"name": "minilm", "dim": 12, "model": "all-MiniLM-L6-v2"},
        "collection": str((tmp_path / "col").resolve()),
    }
    assert json.loads((out / "config.json").read_text())["training"] == record
    assert (out / "history.json").is_file() and (out / "checkpoint").is_dir()
    # train_sr itself (the Python API) records nothing: a model saved without a record
    # replaces the record of the previous one, never keeps a stale one
    train_sr(img, txt, pi, None, CFG, out, SRTrainConfig(epochs=1), progress=False)
    assert SRModel.from_pretrained(out).training_info is None
