from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fakes import tiny_bert  # noqa: E402
from sparsemm.errors import SparsemmError  # noqa: E402
from sparsemm_experiments.models.vdr import VDRModel  # noqa: E402
from sparsemm_experiments.train.vdr import (  # noqa: E402
    CrossModalData,
    TextPairData,
    VDRTrainConfig,
    contrastive_ce,
    lr_factor,
    preset_train_config,
    train_vdr,
    vdr_loss,
)

WORDS = "a photo of cat dog red blue car tree on the man pizza plate two".split()
THINGS = ["cat", "dog", "car", "tree", "pizza", "man"]
COLOURS = ["red", "blue"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"), WORDS)


def _cross_data(n_items: int = 24, d: int = 6) -> CrossModalData:
    """Items = (thing, colour) pairs; patches = one-hot-ish vectors of thing and colour."""
    rng = np.random.default_rng(0)
    texts, owner = [], []
    patches = np.zeros((n_items, 3, d), dtype=np.float32)
    for i in range(n_items):
        t, c = i % len(THINGS), (i // len(THINGS)) % len(COLOURS)
        patches[i, 0, t] = 1.0
        patches[i, 1, c] = 1.0
        patches[i] += 0.05 * rng.normal(size=(3, d)).astype(np.float32)
        for template in ("a {c} {t}", "a photo of a {c} {t}"):
            texts.append(template.format(c=COLOURS[c], t=THINGS[t]))
            owner.append(i)
    mask = np.ones((n_items, 3), dtype=bool)
    mask[:, 2] = False  # a padding patch
    return CrossModalData(texts, np.array(owner), patches, mask)


def _model(bert_dir: Path, **kw: object) -> VDRModel:
    torch.manual_seed(0)
    return VDRModel.from_bert(
        bert_dir, image_dim=6, text_top_k=6, image_top_k=6, max_length=16, **kw
    )


def _cfg(**kw: object) -> VDRTrainConfig:
    base = dict(batch_size=8, lr=1e-3, new_params_lr=1e-2, freeze_layers=0, log_every=2)
    return preset_train_config("cross", **{**base, **kw})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- loss


def test_contrastive_ce_matches_naive_loops() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(3, 5), torch.randn(5, 5)  # 2 extra (hard-negative) columns
    groups = torch.tensor([0, 0, 1])
    tau = 0.5
    got = contrastive_ce(a, b, tau, groups)
    s = (a @ b.T / tau).tolist()
    fwd, bwd = 0.0, 0.0
    for i in range(3):
        cols = [j for j in range(5) if j == i or j >= 3 or groups[i] != groups[j]]
        fwd += -s[i][i] + math.log(sum(math.exp(s[i][j]) for j in cols))
        rows = [r for r in range(3) if r == i or groups[r] != groups[i]]
        bwd += -s[i][i] + math.log(sum(math.exp(s[r][i]) for r in rows))
    assert float(got) == pytest.approx(0.5 * (fwd / 3 + bwd / 3), rel=1e-5)


def test_vdr_loss_terms_follow_the_bow_entry() -> None:
    torch.manual_seed(0)
    x = [torch.rand(4, 7) for _ in range(4)]
    bow = (torch.rand(4, 7) > 0.5).float()
    with_bow = vdr_loss(x[0], x[1], bow, x[2], x[3], None, 0.1)
    assert set(with_bow) == {"loss", "par_q", "par_d", "bow_q", "acc"}
    parts = [with_bow[k] for k in ("par_q", "par_d", "bow_q")]
    assert float(with_bow["loss"]) == pytest.approx(float(sum(parts) / 3))
    both = vdr_loss(x[0], x[1], bow, x[2], x[3], bow, 0.1)
    assert "bow_d" in both
    plain = vdr_loss(x[0], x[1], None, x[2], x[3], None, 0.1)
    assert set(plain) == {"loss", "par_q", "par_d", "acc"}


def test_lr_schedule_warmup_then_decay() -> None:
    f = [lr_factor(s, 10, 2, "linear") for s in range(10)]
    assert f[0] == pytest.approx(0.5) and f[1] == pytest.approx(1.0)
    assert f[2] == pytest.approx(1.0) and f[-1] == pytest.approx(1 / 8)
    c = [lr_factor(s, 10, 0, "cosine") for s in range(11)]
    assert c[0] == pytest.approx(1.0) and c[5] == pytest.approx(0.5) and c[10] == pytest.approx(0)
    assert all(x >= y for x, y in itertools.pairwise(c))


def test_presets_carry_vdr_settings() -> None:
    cross = preset_train_config("cross")
    t2t = preset_train_config("t2t")
    assert (cross.lr, cross.tau, cross.schedule) == (2e-4, 0.07, "cosine")
    assert (t2t.lr, t2t.tau, t2t.schedule) == (2e-5, 1.0, "linear")
    with pytest.raises(SparsemmError):
        VDRTrainConfig(mode="other")


# ------------------------------------------------------------------------ training


def test_cross_modal_training_smoke(bert_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = _cross_data()
    model = _model(bert_dir)
    model.calibrate(data.texts[:16], data.patches, data.patch_mask, rank=6)
    model, hist = train_vdr(model, data, tmp_path / "m", _cfg(epochs=8), progress=False)
    assert len(hist) == 24  # 48 pairs / batch 8 = 6 steps x 8 epochs, logged every 2
    assert hist[-1]["loss"] < hist[0]["loss"]
    assert {"par_q", "par_d", "bow_q", "acc"} <= set(hist[0])
    # codes stay within their sparsity bounds after training
    codes = model.encode_image(data.patches, data.patch_mask)
    assert (np.diff(codes.indptr) <= 6).all()
    texts = model.encode_text(data.texts[:4])
    bow = model.text_bow(data.texts[:4])
    assert (np.diff(texts.indptr) <= 6 + np.diff(bow.indptr)).all()
    loaded = VDRModel.from_pretrained(tmp_path / "m")
    assert (loaded.encode_image(data.patches, data.patch_mask) != codes).nnz == 0
    assert (tmp_path / "m" / "history.json").is_file()


def test_hidden_patch_is_left_out_of_the_pool(bert_dir: Path) -> None:
    from sparsemm_experiments.train.vdr import _batch_cross, data_fingerprint

    data = _cross_data(4)
    model = _model(bert_dir)
    idx = np.arange(4)
    plain = _batch_cross(model, data, idx)["d_full"]
    hidden = CrossModalData(
        data.texts, data.pair_item, data.patches, data.patch_mask, np.zeros(len(data), int)
    )
    with torch.no_grad():
        got = _batch_cross(model, hidden, idx)["d_full"]
        items = data.pair_item[idx]
        x = torch.from_numpy(data.patches[items][:, 1:2])  # only patch 1 remains
        ref = model.activate(model.image_pooled(x))
    assert torch.allclose(got, ref, atol=1e-6)
    assert not torch.allclose(got, plain)
    assert data_fingerprint(hidden) != data_fingerprint(data)


def test_resume_replays_an_uninterrupted_run(bert_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    data = _cross_data(12)
    cfg = _cfg(max_steps=4, epochs=2, checkpoint_every=2, log_every=1)
    full, _ = train_vdr(_model(bert_dir), data, tmp_path / "a", cfg, progress=False)

    class Stop(Exception):
        pass

    def stop_at_3(record: dict[str, float]) -> None:
        if record["step"] == 3:
            raise Stop

    with pytest.raises(Stop):
        train_vdr(_model(bert_dir), data, tmp_path / "b", cfg, progress=False, on_log=stop_at_3)
    resumed, hist = train_vdr(
        _model(bert_dir), data, tmp_path / "b", cfg, resume=True, progress=False
    )
    assert [h["step"] for h in hist] == [1, 2, 3, 4]
    a, b = full.state_dict(), resumed.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    other = _cross_data(12)
    other.texts[0] = "a red pizza"
    with pytest.raises(SparsemmError, match="other settings or data"):
        train_vdr(_model(bert_dir), other, tmp_path / "b", cfg, resume=True, progress=False)


def test_text_to_text_with_hard_negatives(bert_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    queries, docs, negs = [], [], []
    for i, t in enumerate(THINGS * 2):
        c = COLOURS[i % 2]
        queries.append(f"{c} {t}")
        docs.append(f"a photo of a {c} {t} on the plate")
        negs.append([f"a photo of a {c} {THINGS[(i + 1) % len(THINGS)]}", f"two {t}"])
    data = TextPairData(queries, docs, negs)
    torch.manual_seed(0)
    model = VDRModel.from_bert(
        bert_dir, image_dim=None, text_top_k=8, normalize=False, shared_text=False
    )
    cfg = preset_train_config(
        "t2t", batch_size=4, epochs=4, lr=1e-3, new_params_lr=1e-2, freeze_layers=0, log_every=3
    )
    model, hist = train_vdr(model, data, tmp_path / "t", cfg, hard_negatives=1, progress=False)
    assert {"bow_q", "bow_d"} <= set(hist[0])
    assert all(math.isfinite(h["loss"]) for h in hist)
    assert hist[-1]["loss"] < hist[0]["loss"]
    with pytest.raises(SparsemmError, match="hard negatives"):
        train_vdr(model, data, tmp_path / "t2", cfg, hard_negatives=3, progress=False)


def test_training_input_errors(bert_dir: Path, tmp_path: Path) -> None:
    data = _cross_data(4)
    with pytest.raises(SparsemmError, match="TextPairData"):
        train_vdr(_model(bert_dir), data, tmp_path, preset_train_config("t2t"), progress=False)
    bad = CrossModalData(data.texts, data.pair_item, np.zeros((4, 3, 5), np.float32))
    with pytest.raises(SparsemmError, match="expects 6"):
        train_vdr(_model(bert_dir), bad, tmp_path, _cfg(), progress=False)
    with pytest.raises(SparsemmError, match="pair_item"):
        CrossModalData(data.texts, data.pair_item[:-1], data.patches)
