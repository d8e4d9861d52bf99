"""Collection and collage folders are swapped in with io.replace_dir: crash-safe, and a file or
a foreign folder at the output path is refused with SparsemmError."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparsemm.data.collection import open_collection, write_collection
from sparsemm.errors import SparsemmError
from sparsemm.io import find_dir
from sparsemm_experiments.data import fashion


def _write(path: Path, n: int) -> None:
    items = [{"id": f"i{k}"} for k in range(n)]
    write_collection(path, items, {"name": "toy", "dim": 3}, np.eye(n, 3, dtype=np.float32))


def test_collection_output_path_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "col"
    target.write_text("not a folder")
    with pytest.raises(SparsemmError, match="not a folder"):
        _write(target, 2)
    assert target.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["col"]  # no temp folder left


def test_collection_refuses_a_foreign_folder_and_replaces_its_own(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SparsemmError, match="not a sparsemm folder"):
        _write(mine, 2)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    col = tmp_path / "col"
    _write(col, 2)
    _write(col, 3)
    assert len(open_collection(col).items) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["col", "mine"]


def test_collection_crash_between_the_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    col = tmp_path / "col"
    _write(col, 2)
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst) == col:  # the move-in of the new folder, and any rollback: killed
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _write(col, 3)
    monkeypatch.undo()
    assert not col.exists()
    assert len(open_collection(find_dir(col)).items) == 2  # the old one, parked aside
    _write(col, 3)  # the next write replaces it and cleans up
    assert len(open_collection(col).items) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["col"]


def test_collage_swap_in(tmp_path: Path) -> None:
    def folder(name: str, text: str) -> Path:
        p = tmp_path / name
        p.mkdir()
        (p / "collages.json").write_text(text)
        return p

    out = tmp_path / "out"
    fashion._swap_in(folder(".a", "1"), out)
    fashion._swap_in(folder(".b", "2"), out)
    assert (out / "collages.json").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SparsemmError, match="not a collage folder"):
        fashion._swap_in(folder(".c", "3"), afile)
