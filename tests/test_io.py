"""io.replace_dir (folder swaps that survive a crash at any step) and checkpoint fallback."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

import sparsemm.io as io_mod
from sparsemm.errors import SparsemmError
from sparsemm.io import find_dir, old_dir, replace_dir
from sparsemm.train.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint


def _folder(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "data.txt").write_text(text)
    return path


def _content(path: Path) -> str:
    return (path / "data.txt").read_text()


class _Crash(BaseException):
    """A simulated kill: BaseException, so no `except Exception` cleanup runs."""


def _crash_on_replace(monkeypatch: pytest.MonkeyPatch, n: int, into: Path | None = None) -> None:
    """Kill the process at the ``n``-th ``os.replace`` call (1-based; counting only renames
    onto ``into`` if given): it and every later rename fail, as nothing runs after a kill."""
    real, calls = os.replace, [0]

    def replace(src: Any, dst: Any) -> None:
        if into is None or Path(dst) == into:
            calls[0] += 1
        if calls[0] >= n:
            raise _Crash(f"killed at os.replace #{n}")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_replace_dir_moves_new_in_and_removes_the_old(tmp_path: Path) -> None:
    target = tmp_path / "out"
    replace_dir(_folder(tmp_path / ".new1", "one"), target)  # nothing there yet
    assert _content(target) == "one"
    replace_dir(_folder(tmp_path / ".new2", "two"), target)
    assert _content(target) == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("crash_at", [1, 2])
def test_a_crash_at_any_step_leaves_old_or_new_findable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: int
) -> None:
    target = _folder(tmp_path / "out", "old")
    new = _folder(tmp_path / ".new", "new")
    _crash_on_replace(monkeypatch, crash_at)
    with pytest.raises(_Crash):
        replace_dir(new, target)
    monkeypatch.undo()
    if crash_at == 1:  # before anything moved: the old folder is where it was
        assert _content(target) == "old" and _content(find_dir(target)) == "old"
    else:  # old parked aside, new not yet in: find_dir finds the old one
        assert not target.exists()
        assert find_dir(target) == old_dir(target) and _content(find_dir(target)) == "old"
    # the next swap completes and leaves no leftovers
    replace_dir(new, target)
    assert _content(target) == "new" and find_dir(target) == target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_crash_before_deleting_the_old_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _folder(tmp_path / "out", "old")

    def die(path: Path) -> None:
        raise _Crash("killed before the old folder was deleted")

    monkeypatch.setattr(io_mod, "_remove", die)
    with pytest.raises(_Crash):
        replace_dir(_folder(tmp_path / ".new", "new"), target)
    monkeypatch.undo()
    assert _content(find_dir(target)) == "new"  # the new one is in place
    replace_dir(_folder(tmp_path / ".newer", "newer"), target)  # sweeps the stale .old
    assert _content(target) == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_move_in_puts_the_old_folder_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _folder(tmp_path / "out", "old")
    new = _folder(tmp_path / ".new", "new")
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(src) == new:
            raise OSError("no space left")
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="no space"):
        replace_dir(new, target)
    monkeypatch.undo()
    assert _content(target) == "old" and not old_dir(target).exists()


def test_replace_dir_refuses_a_file(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.write_text("a file")
    with pytest.raises(SparsemmError, match="not a folder"):
        replace_dir(_folder(tmp_path / ".new", "new"), target)
    assert target.read_text() == "a file"


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def _model_and_opt(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt


def test_checkpoint_falls_back_to_the_parked_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    model, opt = _model_and_opt(0)
    save_checkpoint(out, model, opt, {"epoch": 3})
    # killed between the two renames of the next save: only .checkpoint.old is left
    _crash_on_replace(monkeypatch, 1, into=out / "checkpoint")
    with pytest.raises(_Crash):
        save_checkpoint(out, model, opt, {"epoch": 4})
    monkeypatch.undo()
    assert not (out / "checkpoint").exists() and (out / ".checkpoint.old").is_dir()
    assert has_checkpoint(out)
    fresh, fresh_opt = _model_and_opt(1)
    assert load_checkpoint(out, fresh, fresh_opt) == {"epoch": 3}
    for a, b in zip(fresh.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    # the next save replaces the parked checkpoint and cleans up
    save_checkpoint(out, model, opt, {"epoch": 4})
    assert load_checkpoint(out, fresh, fresh_opt) == {"epoch": 4}
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint"]


def test_checkpoint_errors(tmp_path: Path) -> None:
    model, opt = _model_and_opt(0)
    assert not has_checkpoint(tmp_path / "none")
    with pytest.raises(SparsemmError, match="no checkpoint"):
        load_checkpoint(tmp_path / "none", model, opt)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SparsemmError, match="not a folder"):
        save_checkpoint(afile, model, opt, {"epoch": 0})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint").write_text("x")
    with pytest.raises(SparsemmError, match="not a folder"):
        save_checkpoint(tmp_path / "run", model, opt, {"epoch": 0})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint"]
