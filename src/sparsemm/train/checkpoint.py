"""Pickle-free training checkpoints: model + optimizer state as safetensors, the rest as JSON.

A checkpoint is a folder ``ckpt/`` holding ``model.safetensors``, ``optim.safetensors`` and
``state.json`` (epoch, optimizer hyper-parameters, anything the loop needs to continue, and
the SHA-256 of both weight files, checked before a resume reads them). It is
written under a temp name (``.checkpoint.<pid>.*``) and swapped in, so a crash mid-save keeps
the previous checkpoint; the temp folders of killed writers are removed by the next save. A
full disk or a read-only folder raises :class:`sparsemm.io.WriteError` naming the folder.
Training loops draw their randomness from generators seeded by ``(seed, epoch)``, so resuming
at epoch e replays exactly what an uninterrupted run would have done. A loop stores what its
run depends on (settings, a fingerprint of the data) in each checkpoint's state;
:func:`resume_checkpoint` refuses a checkpoint whose entries differ.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from sparsemm.errors import SparsemmError
from sparsemm.io import (
    check_digests,
    find_dir,
    old_dir,
    read_json,
    record_digests,
    replace_dir,
    write_error,
    write_json,
)
from sparsemm.models.base import one_line, sweep_temp_dirs

log = logging.getLogger(__name__)

CKPT_DIR = "checkpoint"
TMP_PREFIX = ".checkpoint."  # + "<pid>.": a checkpoint being written
WEIGHT_FILES = ["model.safetensors", "optim.safetensors"]  # SHA-256 in state.json


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for name, val in st.items():
            if isinstance(val, torch.Tensor):
                tensors[f"{idx}.{name}"] = val.detach().clone().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _unflatten_optimizer(
    opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, val in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = val
    for idx, sc in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(sc)
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(
    out_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    scheduler: Any = None,
) -> Path:
    """Write ``out_dir/checkpoint`` atomically; ``state`` must be JSON-serialisable.

    Raises :class:`sparsemm.io.WriteError` (a SparsemmError) for a full disk or a folder
    that cannot be written; the previous checkpoint is then left as it was.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SparsemmError(f"{out} exists and is not a folder; choose another output folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        sweep_temp_dirs(out, TMP_PREFIX, keep=(old_dir(out / CKPT_DIR).name,))
        tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}.", dir=out))
    except OSError as exc:
        raise write_error(exc, out) from exc
    try:
        save_file(
            {k: v.detach().contiguous() for k, v in model.state_dict().items()},
            str(tmp / "model.safetensors"),
        )
        tensors, meta = _flatten_optimizer(optimizer)
        save_file(tensors, str(tmp / "optim.safetensors"))
        full = {"state": state, "optimizer": meta, "sha256": record_digests(tmp, WEIGHT_FILES)}
        if scheduler is not None:
            full["scheduler"] = scheduler.state_dict()
        write_json(tmp / "state.json", full)
        replace_dir(tmp, out / CKPT_DIR)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise write_error(exc, out) from exc
        raise
    return out / CKPT_DIR


def _checkpoint_dir(out_dir: str | Path) -> Path:
    """The checkpoint folder, or the previous one a crash mid-swap left parked aside."""
    return find_dir(Path(out_dir) / CKPT_DIR)


def has_checkpoint(out_dir: str | Path) -> bool:
    return (_checkpoint_dir(out_dir) / "state.json").is_file()


def load_checkpoint(
    out_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
) -> dict[str, Any]:
    """Restore model/optimizer(/scheduler) in place from ``out_dir/checkpoint``; return state."""
    ck = _checkpoint_dir(out_dir)
    if not (ck / "state.json").is_file():
        raise SparsemmError(f"no checkpoint to resume from in {out_dir}; drop --resume")
    full = read_json(ck / "state.json")
    if not isinstance(full, dict) or not isinstance(full.get("state"), dict):
        raise SparsemmError(
            f"{ck / 'state.json'} is not a checkpoint state (damaged); start over without "
            f"--resume (or delete {ck})"
        )
    # a damaged weights file would resume training from garbage: refuse it by name
    check_digests(
        ck, full.get("sha256"), WEIGHT_FILES, f"start over without --resume (or delete {ck})"
    )
    try:
        model.load_state_dict(load_file(str(ck / "model.safetensors")))
    except RuntimeError as exc:
        raise SparsemmError(
            f"checkpoint in {out_dir} does not fit this model configuration ({one_line(exc)}); "
            "use the same settings as the interrupted run or drop --resume"
        ) from exc
    _unflatten_optimizer(optimizer, load_file(str(ck / "optim.safetensors")), full["optimizer"])
    if scheduler is not None and "scheduler" in full:
        scheduler.load_state_dict(full["scheduler"])
    return dict(full["state"])


def load_matching_checkpoint(
    out_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    expected: Mapping[str, Any],
) -> dict[str, Any]:
    """:func:`load_checkpoint`, refused unless every entry of ``expected`` is in its state.

    ``expected`` (JSON values: settings, data fingerprint, ...) is what the current run
    depends on; the loop writes the same entries into each checkpoint's state.
    """
    state = load_checkpoint(out_dir, model, optimizer)
    if any(state.get(k) != v for k, v in expected.items()):
        raise SparsemmError(
            f"the checkpoint in {Path(out_dir)} was made with other settings or data; use the "
            "same ones, another output folder, or start over without --resume"
        )
    return state


def resume_checkpoint(
    out_dir: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    expected: Mapping[str, Any],
    resume: bool,
) -> dict[str, Any] | None:
    """Where a training run starts: the checkpoint's state (model and optimizer restored)
    when ``resume`` and ``out_dir`` holds one, else None (from scratch).

    A checkpoint made with other ``expected`` entries raises SparsemmError
    (:func:`load_matching_checkpoint`).
    """
    if not resume:
        return None
    if not has_checkpoint(out_dir):
        log.info("no checkpoint in %s; starting from scratch", out_dir)
        return None
    return load_matching_checkpoint(out_dir, model, optimizer, expected)


def checkpoint_due(done: int, every: int, total: int) -> bool:
    """True after ``done`` of ``total`` epochs/steps: every ``every`` of them and at the end."""
    return done % every == 0 or done == total
