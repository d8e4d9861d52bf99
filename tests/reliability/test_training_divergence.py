"""Training that goes NaN stops with one line naming the setting, so a user can change it.

A diverged run used to report success and save a NaN model (``train sr --tau 0``); now
settings that cannot train are refused up front, the loop stops at the first non-finite
loss, the last good checkpoint is left as it was and no model is saved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from reltools import captioned_collection, train_data

from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRModel
from sparsemm.train.loop import fit_epochs
from sparsemm.train.sr import SRTrainConfig, train_sr

SR_ARGS = ("--no-bias", "--latent-dim", "16", "--top-k", "4", "--epochs", "2", "--no-progress")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--tau", "0"), "tau (--tau) must be a positive number, got 0.0"),
        (("--tau", "nan"), "tau (--tau) must be a positive number, got nan"),
        (("--lr", "nan"), "lr must be a positive number"),
        (("--lr", "inf"), "lr must be a positive number"),
        (("--lambda", "nan"), "contrastive_weight must be a non-negative number"),
    ],
)
def test_cli_settings_that_cannot_train_are_refused(
    tmp_path: Path, cli: Any, extra: tuple[str, ...], message: str
) -> None:
    col = captioned_collection(tmp_path / "col")
    out = tmp_path / "sr"
    cli("train", "sr", str(col), "-o", str(out), *SR_ARGS, *extra).one_line_error(message)
    assert not (out / "model.safetensors").exists()


def test_cli_diverging_run_is_one_error_line_and_saves_nothing(tmp_path: Path, cli: Any) -> None:
    col = captioned_collection(tmp_path / "col")
    out = tmp_path / "sr"
    line = cli(
        "train", "sr", str(col), "-o", str(out), *SR_ARGS, "--lr", "1e30", "--batch-size", "8"
    ).one_line_error("SR training diverged at epoch 1, batch", "--lr 1e+30", "--tau 0.05")
    assert "lower the learning rate" in line
    assert not (out / "model.safetensors").exists()


def test_divergence_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    _img, txt, _pair_item, _bias, config = train_data(n_items=40, per_item=2)
    out = tmp_path / "sr"
    train = SRTrainConfig(epochs=4, batch_size=32, lr=1e-3)
    model = SRModel(config)
    good = {}

    def batch_loss(idx: np.ndarray) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = (model.enc_text.weight**2).mean()
        if good.get("epochs", 0) >= 2:  # the third epoch diverges
            loss = loss * float("nan")
        return loss, {"loss": loss}

    def on_epoch_end(epoch: int, record: dict[str, float]) -> None:
        good["epochs"] = epoch
        good["weights"] = model.enc_text.weight.detach().clone()

    with pytest.raises(SparsemmError) as err:
        fit_epochs(
            model,
            len(txt),
            batch_loss,
            out,
            train,
            {"run": 1},
            progress=False,
            on_epoch_end=on_epoch_end,
            settings="--lr 0.001",
        )
    msg = str(err.value)
    assert "training diverged at epoch 3, batch 1: the loss is nan with --lr 0.001" in msg
    assert "the last good checkpoint (epoch 2) is kept" in msg
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["state"]["epoch"] == 2
    # --resume restarts from the good epoch-2 weights
    resumed = SRModel(config)
    from sparsemm.train.checkpoint import load_checkpoint

    load_checkpoint(out, resumed, torch.optim.Adam(resumed.parameters()))
    torch.testing.assert_close(resumed.enc_text.weight, good["weights"], rtol=0, atol=0)


def test_train_sr_api_refuses_to_save_a_nan_model(tmp_path: Path) -> None:
    img, txt, pair_item, bias, config = train_data(n_items=40, per_item=2)
    with pytest.raises(SparsemmError, match="diverged"):
        train_sr(
            img,
            txt,
            pair_item,
            bias,
            config,
            tmp_path / "sr",
            SRTrainConfig(epochs=2, batch_size=16, lr=1e30),
            progress=False,
        )
    assert not (tmp_path / "sr" / "model.safetensors").exists()


@pytest.mark.parametrize("kind", ["file", "under_a_file"])
def test_cli_bad_output_folder_fails_before_training(tmp_path: Path, cli: Any, kind: str) -> None:
    col = captioned_collection(tmp_path / "col")
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" if kind == "file" else tmp_path / "afile" / "sr"
    res = cli("train", "sr", str(col), "-o", str(out), *SR_ARGS)
    res.one_line_error(str(out))
    assert "epoch" not in res.err  # refused before the first epoch
