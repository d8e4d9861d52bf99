"""The linear alignment baseline: shapes, save/load, training, resume, searcher wiring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sparsemm.cli.main import main
from sparsemm.errors import SparsemmError
from sparsemm.train.sr import SRTrainConfig
from sparsemm_experiments.models.lit import AlignConfig, AlignedTextEncoder, LinearAligner
from sparsemm_experiments.train.lit import train_aligner


def _pairs(seed: int = 0):
    """Images in a 16-d space, texts in an unrelated 10-d space, one hidden shared factor."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(60, 6)).astype(np.float32)
    img = z @ rng.normal(size=(6, 16)).astype(np.float32)
    pair_item = np.repeat(np.arange(60), 2)
    txt = z[pair_item] @ rng.normal(size=(6, 10)).astype(np.float32)
    txt += 0.05 * rng.normal(size=txt.shape).astype(np.float32)
    return img, txt, pair_item


CFG = AlignConfig(image_dim=16, text_dim=10, dim=8)


def test_alignment_learns_to_match_pairs(tmp_path: Path) -> None:
    img, txt, pi = _pairs()
    model, hist = train_aligner(
        img,
        txt,
        pi,
        CFG,
        tmp_path,
        SRTrainConfig(epochs=60, batch_size=40, lr=1e-2),
        progress=False,
    )
    assert hist[-1]["nce"] < 0.5 * hist[0]["nce"]
    zi, zt = model.encode_image(img), model.encode_text_features(txt)
    assert zi.shape == (60, 8) and np.allclose(np.linalg.norm(zi, axis=1), 1, atol=1e-5)
    top1 = np.argmax(zt @ zi.T, axis=1)
    assert (top1 == pi).mean() > 0.8  # untrained: ~1/60
    again = LinearAligner.from_pretrained(tmp_path)
    assert np.array_equal(again.encode_image(img), zi)


def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    img, txt, pi = _pairs()
    tc2 = SRTrainConfig(epochs=4, batch_size=40, checkpoint_every=2)
    full, _ = train_aligner(img, txt, pi, CFG, tmp_path / "a", tc2, progress=False)
    part = tmp_path / "c"
    with pytest.raises(KeyboardInterrupt):
        _interrupting_run(img, txt, pi, part, tc2)
    resumed, hist = train_aligner(img, txt, pi, CFG, part, tc2, resume=True, progress=False)
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4]
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def _interrupting_run(img, txt, pi, out: Path, tc: SRTrainConfig) -> None:
    """Train until the epoch-2 checkpoint lands, then stop as a Ctrl-C would."""
    import sparsemm_experiments.train.lit as lit

    real = lit.save_checkpoint

    def save_then_stop(*args, **kwargs):
        path = real(*args, **kwargs)
        if args[3]["epoch"] == 2:
            raise KeyboardInterrupt
        return path

    lit.save_checkpoint = save_then_stop  # type: ignore[assignment]
    try:
        train_aligner(img, txt, pi, CFG, out, tc, progress=False)
    finally:
        lit.save_checkpoint = real  # type: ignore[assignment]


def test_bad_inputs(tmp_path: Path) -> None:
    img, txt, pi = _pairs()
    with pytest.raises(SparsemmError, match="do not match"):
        train_aligner(img[:, :5], txt, pi, CFG, tmp_path, progress=False)
    with pytest.raises(SparsemmError, match="tau"):
        AlignConfig(image_dim=2, text_dim=2, tau=0)
    model = LinearAligner(CFG)
    with pytest.raises(SparsemmError, match=r"\(n, 16\)"):
        model.encode_image(np.zeros((3, 10), np.float32))

    class Enc:
        dim = 7

        def encode_text(self, texts, batch_size=64, progress=False):
            return np.zeros((len(texts), 7), np.float32)

    with pytest.raises(SparsemmError, match="7-d"):
        AlignedTextEncoder(Enc(), model)
    # A changed training set is refused on resume.
    train_aligner(img, txt, pi, CFG, tmp_path / "r", SRTrainConfig(epochs=1), progress=False)
    with pytest.raises(SparsemmError, match="other settings or data"):
        train_aligner(
            img,
            txt * 2,
            pi,
            CFG,
            tmp_path / "r",
            SRTrainConfig(epochs=1),
            resume=True,
            progress=False,
        )


@pytest.mark.usefixtures("declared_entry_points")
def test_cli_train_align(tmp_path: Path, capsys) -> None:
    from sparsemm.data.collection import write_collection

    img, txt, pi = _pairs()
    items = [{"id": f"i{i}", "captions": ["x", "y"], "split": "train"} for i in range(60)]
    texts = [{"item": int(i), "text": f"caption {j}"} for j, i in enumerate(pi)]
    col = tmp_path / "col"
    write_collection(
        col,
        items,
        {"name": "imgfake", "dim": 16},
        image_emb=img,
        text_emb=txt,
        texts=texts,
        text_encoder={"name": "txtfake", "dim": 10},
    )
    rc = main(
        [
            "train",
            "align",
            str(col),
            "-o",
            str(tmp_path / "al"),
            "--dim",
            "8",
            "--epochs",
            "2",
            "--no-progress",
        ]
    )
    assert rc == 0 and "trained the aligner on 60 items / 120 captions" in capsys.readouterr().out
    assert LinearAligner.from_pretrained(tmp_path / "al").config.dim == 8
    # The aligner records its encoders, and index/search refuse it on other backbones.
    from sparsemm.models.base import check_encoders

    info = LinearAligner.from_pretrained(tmp_path / "al").training_info
    assert info is not None and info["image_encoder"]["name"] == "imgfake"
    other = {"encoder": {"name": "efficientnet", "dim": 16}, "text_encoder": {"name": "minilm"}}
    with pytest.raises(SparsemmError, match="other encoders"):
        check_encoders(info, other, tmp_path / "al", col)
