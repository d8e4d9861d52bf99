from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sparsemm.errors import SparsemmError
from sparsemm.models.spine import SPINE, SpineConfig, build_sparse_vectors, capped_relu
from sparsemm.train.spine import spine_loss, train_spine, training_vocabulary
from sparsemm.words.evaluate import top_words
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors
from sparsemm_experiments.word_quality import sparsity_stats

TOY = {"epochs": 60, "batch_size": 32, "lr": 1e-2, "seed": 0, "progress": False}


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, toy_vectors: WordVectors
) -> tuple[SPINE, Path]:
    out = tmp_path_factory.mktemp("spine")
    model = train_spine(toy_vectors, SpineConfig(input_dim=16, hidden_dim=64), out, **TOY)
    return model, out


def test_capped_relu_and_loss_by_hand() -> None:
    x = torch.tensor([-1.0, 0.0, 0.3, 1.0, 2.5])
    assert capped_relu(x).tolist() == pytest.approx([0.0, 0.0, 0.3, 1.0, 1.0])
    cfg = SpineConfig(input_dim=2, hidden_dim=2, rho_star=0.15, asl_weight=2.0, psl_weight=3.0)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    x_hat = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    z = torch.tensor([[0.5, 0.0], [1.0, 0.1]])
    parts = spine_loss(x, z, x_hat, cfg)
    recon = 1.0 / 4  # one squared error of 1 over 4 entries
    asl = (0.75 - 0.15) ** 2 + 0.0  # unit means 0.75 and 0.05; only the first exceeds rho*
    psl = (0.5 * 0.5 + 0.0 + 0.0 + 0.1 * 0.9) / 4
    assert parts["recon"].item() == pytest.approx(recon)
    assert parts["asl"].item() == pytest.approx(asl)
    assert parts["psl"].item() == pytest.approx(psl)
    assert parts["loss"].item() == pytest.approx(recon + 2 * asl + 3 * psl)


def test_training_reduces_loss_and_reaches_sparsity(
    trained: tuple[SPINE, Path], toy_vectors: WordVectors
) -> None:
    model, out = trained
    history = json.loads((out / "train_log.json").read_text())["history"]
    assert len(history) == TOY["epochs"]
    assert history[-1]["loss"] < 0.1 * history[0]["loss"]
    codes = model.encode(toy_vectors.vectors)
    assert codes.shape == (200, 64) and codes.dtype == np.float32
    assert codes.min() >= 0.0 and codes.max() <= 1.0
    stats = sparsity_stats(codes)
    # rho* = 0.15 -> at most ~15% of the activations on; most entries are exactly 0
    assert stats["zero_share"] >= 0.85
    assert 1.0 <= stats["mean_active_dims"] <= 0.15 * 64
    # the codes still carry the input: reconstruction error well below the data variance
    recon = model.decoder(torch.from_numpy(codes)).detach().numpy()
    assert ((recon - toy_vectors.vectors) ** 2).mean() < 0.2 * toy_vectors.vectors.var()


def test_dimensions_are_interpretable_on_clusters(
    trained: tuple[SPINE, Path], toy_vectors: WordVectors
) -> None:
    """Top words of a live dimension come from one cluster (the toy's only 'meaning')."""
    sparse = build_sparse_vectors(trained[0], toy_vectors)
    cluster = {w: i // 20 for i, w in enumerate(toy_vectors.words)}
    purities = []
    for dim in range(sparse.dim):
        words = [w for w, _ in top_words(sparse, dim, 5)]
        if len(words) == 5:
            purities.append(max(np.bincount([cluster[w] for w in words])) / 5)
    assert len(purities) >= 32
    assert np.mean(purities) >= 0.8


def test_encode_is_noise_free_and_checks_shape(trained: tuple[SPINE, Path]) -> None:
    model = trained[0]
    x = np.random.default_rng(1).normal(size=(7, 16)).astype(np.float32)
    np.testing.assert_array_equal(model.encode(x), model.encode(x))
    assert model.training is False
    with pytest.raises(SparsemmError, match=r"\(n, 16\)"):
        model.encode(np.zeros((3, 5), np.float32))


def test_save_load_identical_outputs(trained: tuple[SPINE, Path], tmp_path: Path) -> None:
    model, out = trained
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    model.save_pretrained(tmp_path / "m")
    back = SPINE.from_pretrained(tmp_path / "m")
    assert back.config == model.config
    x = np.random.default_rng(2).normal(size=(11, 16)).astype(np.float32)
    np.testing.assert_array_equal(back.encode(x), model.encode(x))
    np.testing.assert_array_equal(SPINE.from_pretrained(out).encode(x), model.encode(x))


def test_resume_equals_uninterrupted(tmp_path: Path, toy_vectors: WordVectors) -> None:
    cfg = SpineConfig(input_dim=16, hidden_dim=24)
    kw = {"batch_size": 50, "lr": 1e-2, "seed": 3, "progress": False, "checkpoint_every": 2}
    full = train_spine(toy_vectors, cfg, tmp_path / "full", epochs=6, **kw)
    part = tmp_path / "part"
    train_spine(toy_vectors, cfg, part, epochs=4, **kw)  # "interrupted" after epoch 4
    with pytest.raises(SparsemmError, match="resume"):
        train_spine(toy_vectors, cfg, part, epochs=6, **kw)
    resumed = train_spine(toy_vectors, cfg, part, epochs=6, resume=True, **kw)
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    h_full = json.loads((tmp_path / "full" / "train_log.json").read_text())["history"]
    h_part = json.loads((part / "train_log.json").read_text())["history"]
    assert h_full == h_part
    # the checkpoint holds the Adam state too, as safetensors
    optim = load_file(str(part / "checkpoint" / "optim.safetensors"))
    assert any(k.endswith("exp_avg") for k in optim)
    # resuming with different settings is refused
    with pytest.raises(SparsemmError, match="lr"):
        train_spine(toy_vectors, cfg, part, epochs=8, resume=True, **{**kw, "lr": 0.5})


def test_same_seed_same_model(tmp_path: Path, toy_vectors: WordVectors) -> None:
    cfg = SpineConfig(input_dim=16, hidden_dim=8)
    kw = {"epochs": 2, "batch_size": 64, "progress": False}
    a = train_spine(toy_vectors, cfg, tmp_path / "a", seed=5, **kw)
    b = train_spine(toy_vectors, cfg, tmp_path / "b", seed=5, **kw)
    c = train_spine(toy_vectors, cfg, tmp_path / "c", seed=6, **kw)
    assert torch.equal(a.encoder.weight, b.encoder.weight)
    assert not torch.equal(a.encoder.weight, c.encoder.weight)


def test_train_rejects_wrong_dim(tmp_path: Path, toy_vectors: WordVectors) -> None:
    with pytest.raises(SparsemmError, match="input_dim"):
        train_spine(toy_vectors, SpineConfig(input_dim=50), tmp_path, epochs=1)


def test_sparse_word_vectors_save_load(
    trained: tuple[SPINE, Path], toy_vectors: WordVectors, tmp_path: Path
) -> None:
    sparse = build_sparse_vectors(trained[0], toy_vectors, batch_size=33)
    np.testing.assert_array_equal(sparse.matrix.toarray(), trained[0].encode(toy_vectors.vectors))
    sparse.save(tmp_path / "sv")
    back = SparseWordVectors.load(tmp_path / "sv")
    assert back.words == sparse.words
    assert (back.matrix != sparse.matrix).nnz == 0
    assert "animal" in back and len(back) == 200
    np.testing.assert_array_equal(back.row("food"), sparse.matrix[20].toarray().ravel())
    with pytest.raises(SparsemmError, match="not in the SPINE vocabulary"):
        back.row("zebra")
    with pytest.raises(SparsemmError):
        SparseWordVectors.load(tmp_path / "missing")


def test_training_vocabulary(toy_vectors: WordVectors) -> None:
    # frequency order = row order; "the" and "u.s." are never tokens, so they are skipped
    words = ["the", "animal", "u.s.", "food", "sport", "room", "color"]
    glove = WordVectors(words, np.arange(14, dtype=np.float32).reshape(7, 2))
    vocab = training_vocabulary(glove, ["A color of the ROOM, and a zebra"], top_n=2)
    assert vocab.words == ["animal", "food", "room", "color"]
    np.testing.assert_array_equal(vocab.vectors[2], glove.vectors[5])
    assert training_vocabulary(glove, [], top_n=100).words == [
        "animal",
        "food",
        "sport",
        "room",
        "color",
    ]
