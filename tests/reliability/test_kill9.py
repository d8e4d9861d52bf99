"""kill -9 during an index build and a collection write (real subprocesses).

Each writer is a ``python -c`` subprocess killed with SIGKILL, either at a fixed point in the
middle of a write (it touches a marker file there and waits) or at a random moment of a loop
that rewrites the artefact over and over. Afterwards the previous (or a complete newer)
version must load, exactly as written. Training: test_kill9_train.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from reltools import (
    collection_version,
    index_version,
    kill_after,
    kill_when,
    start,
)

from sparsemm.data.collection import open_collection, write_collection
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.models.sr import SRConfig, SRModel


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Bitwise-reproducible torch on CPU: the killed writer runs with one thread too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def leftovers(folder: Path, keep: set[str]) -> set[str]:
    return {p.name for p in folder.iterdir()} - keep


# ------------------------------------------------------------------------------------ index


def assert_index_is_version(root: Path, v: int, n: int) -> None:
    index = InvertedIndex.open(root)
    codes, ids = index_version(v, n)
    assert index.meta == {"v": v}
    assert list(index.ids) == ids
    assert (index.codes(np.arange(n)) != codes).nnz == 0
    hits = index.search(codes[3], k=1)
    assert hits.ids[0] == ids[3] or hits.scores[0] >= float(codes[3].multiply(codes[3]).sum())


def test_kill_mid_segment_keeps_the_previous_index(tmp_path: Path) -> None:
    root, marker = tmp_path / "ix", tmp_path / "mid-write"
    InvertedIndex.build(root, *index_version(1, 500), meta={"v": 1})
    script = f"""
import time
from pathlib import Path
import sparsemm.index.inverted as inv
from reltools import index_version
real, calls = inv.save_npy, [0]
def save_npy(path, arr):
    real(path, arr)
    calls[0] += 1
    if calls[0] == 3:  # three of the six arrays of the new segment are on disk
        Path({str(marker)!r}).touch()
        time.sleep(60)
inv.save_npy = save_npy
inv.InvertedIndex.build({str(root)!r}, *index_version(2, 3000), overwrite=True, meta={{"v": 2}})
"""
    kill_when(start(script), marker.exists)
    assert_index_is_version(root, 1, 500)
    # the half-written segment is swept by the next writer
    InvertedIndex.build(root, *index_version(3, 200), overwrite=True, meta={"v": 3})
    assert_index_is_version(root, 3, 200)
    manifest_segments = {s["name"] for s in InvertedIndex.open(root)._manifest["segments"]}
    assert {p.name for p in root.iterdir() if p.is_dir()} == manifest_segments


@pytest.mark.parametrize("delay", [0.2])
def test_kill_at_a_random_moment_of_repeated_rebuilds(tmp_path: Path, delay: float) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, *index_version(0, 100), meta={"v": 0})
    started = tmp_path / "started"
    script = f"""
from pathlib import Path
from sparsemm.index import InvertedIndex
from reltools import index_version
Path({str(started)!r}).touch()
for v in range(1, 10**6):
    InvertedIndex.build({str(root)!r}, *index_version(v, 2000 + 37 * v), overwrite=True,
                        meta={{"v": v}})
"""
    kill_after(start(script), started.exists, delay)
    v = InvertedIndex.open(root).meta["v"]
    assert_index_is_version(root, v, 100 if v == 0 else 2000 + 37 * v)


# ------------------------------------------------------------------------------- collection


def assert_collection_is_version(path: Path, v: int, n: int) -> None:
    col = open_collection(path)
    col.verify()
    want = collection_version(v, n)
    assert col.manifest["v"] == v and col.items == want["items"] and col.texts == want["texts"]
    np.testing.assert_array_equal(col.image_embeddings(), want["image_emb"])
    np.testing.assert_array_equal(col.text_embeddings(), want["text_emb"])


def test_kill_between_the_folder_renames_keeps_the_previous_collection(tmp_path: Path) -> None:
    col, marker = tmp_path / "col", tmp_path / "parked"
    write_collection(col, **collection_version(1, 50))
    script = f"""
import os, time
from pathlib import Path
from sparsemm.data.collection import write_collection
from reltools import collection_version
real = os.replace
def replace(src, dst):
    real(src, dst)
    if Path(dst).name == ".col.old":  # the old folder is parked, the new not yet moved in
        Path({str(marker)!r}).touch()
        time.sleep(60)
os.replace = replace
write_collection({str(col)!r}, **collection_version(2, 80))
"""
    kill_when(start(script), marker.exists)
    assert not col.exists()
    assert_collection_is_version(col, 1, 50)  # found where the swap parked it
    write_collection(col, **collection_version(3, 20))
    assert_collection_is_version(col, 3, 20)
    assert leftovers(tmp_path, {"col", "parked"}) == set()


def test_kill_mid_array_write_leaves_no_partial_output(tmp_path: Path) -> None:
    col, marker = tmp_path / "col", tmp_path / "mid-write"
    write_collection(col, **collection_version(1, 50))
    script = f"""
import time
from pathlib import Path
import sparsemm.data.collection as c
from reltools import collection_version
real = c.save_npy
def save_npy(path, arr):
    real(path, arr)
    Path({str(marker)!r}).touch()  # image_emb.npy written into the temp folder
    time.sleep(60)
c.save_npy = save_npy
c.write_collection({str(col)!r}, **collection_version(2, 80))
"""
    kill_when(start(script), marker.exists)
    assert_collection_is_version(col, 1, 50)
    assert {p.name for p in tmp_path.glob(".col.*.tmp")}, "the killed writer's temp folder"
    write_collection(col, **collection_version(3, 20))  # sweeps it
    assert_collection_is_version(col, 3, 20)
    assert leftovers(tmp_path, {"col", "mid-write"}) == set()


def test_kill_at_a_random_moment_of_repeated_collection_writes(tmp_path: Path) -> None:
    col, started = tmp_path / "col", tmp_path / "started"
    write_collection(col, **collection_version(0, 10))
    script = f"""
from pathlib import Path
from sparsemm.data.collection import write_collection
from reltools import collection_version
Path({str(started)!r}).touch()
for v in range(1, 10**6):
    write_collection({str(col)!r}, **collection_version(v, 500 + v))
"""
    kill_after(start(script), started.exists, 0.2)
    v = open_collection(col).manifest["v"]
    assert_collection_is_version(col, v, 10 if v == 0 else 500 + v)
    write_collection(col, **collection_version(0, 10))  # the lock died with the writer
    assert leftovers(tmp_path, {"col", "started"}) == set()


# ------------------------------------------------------------------------------- model


@pytest.mark.xfail(
    strict=True,
    reason="PretrainedMixin.save_pretrained (models/base.py) writes model.safetensors and "
    "config.json as two separate atomic renames; a kill between them over a model of another "
    "shape leaves a folder that loads neither (fix: write the folder to a temp dir and "
    "io.replace_dir it in, as checkpoints do)",
)
def test_kill_between_model_files_keeps_the_previous_model(tmp_path: Path) -> None:
    out, marker = tmp_path / "model", tmp_path / "between"
    SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=30, top_k=4)).save_pretrained(out)
    script = f"""
import time
from pathlib import Path
import sparsemm.models.base as base
from sparsemm.models.sr import SRConfig, SRModel
real = base.write_json
def write_json(path, obj):
    Path({str(marker)!r}).touch()  # model.safetensors replaced, config.json not yet
    time.sleep(60)
base.write_json = write_json
SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=40, top_k=4)).save_pretrained({str(out)!r})
"""
    kill_when(start(script), marker.exists)
    try:
        model = SRModel.from_pretrained(out)
    except SparsemmError:
        pytest.fail("the previous model no longer loads")
    assert model.config.latent_dim in (30, 40)
