"""kill -9 during SR training (a real subprocess): the run resumes from its last complete
checkpoint and ends with exactly the weights and history of an uninterrupted run.

The writer is killed either in the middle of writing a checkpoint (it touches a marker file
between the model and the optimizer tensors and waits) or at a random moment after its
first epoch. Both sides train with one torch thread, so results are bitwise reproducible.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from reltools import kill_after, kill_when, start, train_data

from sparsemm.models.sr import SRModel
from sparsemm.train.sr import SRTrainConfig, train_sr

pytestmark = pytest.mark.slow  # training runs killed in subprocesses (CONTRIBUTING.md)

TRAIN = SRTrainConfig(epochs=6, batch_size=64, seed=5, checkpoint_every=1)
TRAIN_SCRIPT = """
import time, torch
from pathlib import Path
import sparsemm.train.checkpoint as ck
from sparsemm.train.sr import SRTrainConfig, train_sr
from reltools import train_data
torch.set_num_threads(1)
{patch}
img, txt, pi, bias, cfg = train_data()
train_sr(img, txt, pi, bias, cfg, {out!r},
         SRTrainConfig(epochs=6, batch_size=64, seed=5, checkpoint_every=1),
         progress=False, on_epoch_end=lambda e, r: (Path({started!r}).touch(), time.sleep({pause})))
"""


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, list[dict]]:
    img, txt, pi, bias, cfg = train_data()
    with one_thread():
        return train_sr(
            img, txt, pi, bias, cfg, tmp_path_factory.mktemp("full"), TRAIN, progress=False
        )


def resume(out: Path, uninterrupted: tuple[Any, list[dict]]) -> list[int]:
    """Resume ``out``, compare with the uninterrupted run; return the epochs trained again."""
    img, txt, pi, bias, cfg = train_data()
    rerun: list[int] = []
    with one_thread():
        resumed, hist = train_sr(
            img, txt, pi, bias, cfg, out, TRAIN, resume=True, progress=False,
            on_epoch_end=lambda e, r: rerun.append(e),
        )  # fmt: skip
    full, full_hist = uninterrupted
    assert [h["epoch"] for h in hist] == [1, 2, 3, 4, 5, 6]
    assert hist == full_hist
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert SRModel.from_pretrained(out).config == cfg
    return rerun


def test_kill_mid_checkpoint_write_resumes_from_the_last_complete_one(
    tmp_path: Path, uninterrupted: tuple[Any, list[dict]]
) -> None:
    out, marker, started = tmp_path / "run", tmp_path / "mid-checkpoint", tmp_path / "started"
    patch = f"""
real, calls = ck.save_file, [0]
def save_file(tensors, path):
    real(tensors, path)
    calls[0] += 1
    if calls[0] == 5:  # checkpoint 3: model tensors written, optimizer state not yet
        Path({str(marker)!r}).touch()
        time.sleep(60)
ck.save_file = save_file
"""
    script = TRAIN_SCRIPT.format(patch=patch, out=str(out), started=str(started), pause=0)
    kill_when(start(script), marker.exists)
    assert not (out / "model.safetensors").exists()
    assert [p.name for p in out.glob(".checkpoint.*")]  # the killed writer's temp folder
    assert resume(out, uninterrupted) == [3, 4, 5, 6]  # epoch 3 is trained again
    assert not list(out.glob(".checkpoint.*"))  # swept by the next checkpoint


def test_kill_at_a_random_moment_resumes_identically(
    tmp_path: Path, uninterrupted: tuple[Any, list[dict]]
) -> None:
    out, started = tmp_path / "run", tmp_path / "started"
    # 50 ms between epochs stands for a longer run, so the writer is surely still going
    # 120 ms after epoch 1 however fast the machine; the kill lands in epoch 2 or 3
    script = TRAIN_SCRIPT.format(patch="", out=str(out), started=str(started), pause=0.05)
    kill_after(start(script), started.exists, 0.12)
    rerun = resume(out, uninterrupted)
    assert rerun and rerun[0] >= 2 and rerun[-1] == 6
