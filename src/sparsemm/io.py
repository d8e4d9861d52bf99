"""Atomic file writes and safe array loading shared by every stage.

Every artefact is written to a temporary name in the same folder and then renamed over the
target (``os.replace`` is atomic on POSIX), so a crash mid-write leaves the old file intact.
Only pickle-free formats are read: ``np.load(..., allow_pickle=False)``, JSON, safetensors.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError


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
