"""Atomic file writes and safe array loading shared by every stage.

Every artefact is written to a temporary name in the same folder and then renamed over the
target (``os.replace`` is atomic on POSIX), so a crash mid-write leaves the old file intact.
Whole folders are written under a temporary name and swapped in with :func:`replace_dir`;
:func:`find_dir` finds the folder even after a crash in the middle of that swap.
Only pickle-free formats are read: ``np.load(..., allow_pickle=False)``, JSON, safetensors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temp file beside ``path``; on clean exit fsync and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_open(path, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=False)
        fh.write("\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SparsemmError(f"{path} is not valid JSON ({exc}); re-create it") from exc


def save_npy(path: str | Path, arr: np.ndarray) -> None:
    with atomic_open(path, "wb") as fh:
        np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)


def load_npy(path: str | Path, mmap: bool = False) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as exc:
        raise SparsemmError(f"{path} is not a plain .npy array ({exc})") from exc


def save_csr(path: str | Path, mat: sp.csr_matrix) -> None:
    with atomic_open(path, "wb") as fh:
        sp.save_npz(fh, sp.csr_matrix(mat), compressed=False)


def load_csr(path: str | Path) -> sp.csr_matrix:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    return sp.csr_matrix(sp.load_npz(path))


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with atomic_open(path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False))
            fh.write("\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    rows = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise SparsemmError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
    return rows


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (renames, new files) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def old_dir(target: str | Path) -> Path:
    """Where :func:`replace_dir` parks the previous ``target`` while it swaps a new one in."""
    target = Path(target)
    return target.with_name(f".{target.name}.old")


def find_dir(target: str | Path) -> Path:
    """``target``, or its parked previous version when a crash hit :func:`replace_dir`
    between moving the old folder aside and moving the new one in; else ``target``."""
    target = Path(target)
    if not os.path.lexists(target) and old_dir(target).is_dir():
        return old_dir(target)
    return target


def replace_dir(new: str | Path, target: str | Path) -> None:
    """Move the folder ``new`` to ``target``, replacing the folder there (if any).

    Steps: (1) an existing ``target`` is renamed to ``.<name>.old`` beside it, (2) ``new``
    is renamed to ``target``, (3) the old folder is deleted. A crash after (1) leaves the
    previous version at ``.<name>.old``, where :func:`find_dir` finds it and the next
    ``replace_dir`` takes it as the version to replace; a crash at any other point leaves
    ``target`` holding the old or the new folder. Both paths must be on one file system
    (``new`` is normally a temp folder beside ``target``). Raises SparsemmError when
    ``target`` exists and is not a folder; if step (2) fails the old folder is put back.
    """
    new, target = Path(new), Path(target)
    if os.path.lexists(target) and not target.is_dir():
        raise SparsemmError(f"{target} exists and is not a folder; choose another output path")
    old = old_dir(target)
    parked = False
    if target.is_dir():
        if os.path.lexists(old):
            # ``target`` is intact, so a folder still parked here is a leftover of a crash.
            _remove(old)
        os.replace(target, old)
        parked = True
    # else: nothing at ``target``; a folder at ``old`` (if any) is the version being replaced
    try:
        os.replace(new, target)
    except BaseException:
        if parked:
            with contextlib.suppress(OSError):
                os.replace(old, target)
        raise
    with contextlib.suppress(OSError):
        fsync_dir(target.parent)
    if os.path.lexists(old):
        _remove(old)


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as exc:  # the new folder is in place; a leftover only costs disk space
        logger.warning("could not remove %s (%s); delete it by hand", path, exc)
