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
    sr_version,
    start,
)

from sparsemm.data.collection import open_collection, write_collection
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.models.sr import SRModel

pytestmark = pytest.mark.slow  # writers killed mid-write, in subprocesses (CONTRIBUTING.md)


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
import sparsemm.index.segments as seg
from reltools import index_version
real, calls = seg.save_npy, [0]
def save_npy(path, arr):
    real(path, arr)
    calls[0] += 1
    if calls[0] == 3:  # three of the six arrays of the new segment are on disk
        Path({str(marker)!r}).touch()
        time.sleep(60)
seg.save_npy = save_npy
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


def assert_model_is_version(out: Path, v: int) -> None:
    model = SRModel.from_pretrained(out)
    want = sr_version(v)
    assert model.config == want.config
    for a, b in zip(want.state_dict().values(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_kill_between_model_files_keeps_the_previous_model(tmp_path: Path) -> None:
    out, marker = tmp_path / "model", tmp_path / "between"
    sr_version(10).save_pretrained(out)
    (out / "history.json").write_text("{}")  # a trainer's other files in the model folder
    (out / "checkpoint").mkdir()
    script = f"""
import time
from pathlib import Path
import sparsemm.models.base as base
from reltools import sr_version
real = base.write_json
def write_json(path, obj):
    Path({str(marker)!r}).touch()  # the new model.safetensors written, config.json not yet
    time.sleep(60)
base.write_json = write_json
sr_version(20).save_pretrained({str(out)!r})
"""
    kill_when(start(script), marker.exists)
    try:
        assert_model_is_version(out, 10)
    except SparsemmError:
        pytest.fail("the previous model no longer loads")
    sr_version(30).save_pretrained(out)  # sweeps the killed writer's temp folder
    assert_model_is_version(out, 30)
    assert (
        leftovers(out, {"config.json", "model.safetensors", "history.json", "checkpoint"}) == set()
    )


def test_kill_while_moving_the_committed_model_in_loads_the_new_one(tmp_path: Path) -> None:
    out, marker = tmp_path / "model", tmp_path / "moving"
    sr_version(1).save_pretrained(out)
    script = f"""
import time
from pathlib import Path
import sparsemm.models.base as base
from reltools import sr_version
real, calls = base._link_or_copy, [0]
def link(src, dst):
    calls[0] += 1
    if calls[0] == 2:  # the new model.safetensors is in place, config.json is still the old
        Path({str(marker)!r}).touch()
        time.sleep(60)
    real(src, dst)
base._link_or_copy = link
sr_version(2).save_pretrained({str(out)!r})
"""
    kill_when(start(script), marker.exists)
    import json

    assert json.loads((out / "config.json").read_text())["latent_dim"] == 21  # mixed on top
    assert_model_is_version(out, 2)  # read from the committed pair
    sr_version(3).save_pretrained(out)  # finishes the interrupted move first
    assert_model_is_version(out, 3)
    assert leftovers(out, {"config.json", "model.safetensors"}) == set()


def test_kill_at_a_random_moment_of_repeated_model_saves(tmp_path: Path) -> None:
    out, started = tmp_path / "model", tmp_path / "started"
    sr_version(0).save_pretrained(out)
    script = f"""
from pathlib import Path
from reltools import sr_version
models = [sr_version(v) for v in range(1, 6)]
Path({str(started)!r}).touch()
for i in range(10**6):
    models[i % 5].save_pretrained({str(out)!r})
"""
    kill_after(start(script), started.exists, 0.3)
    model = SRModel.from_pretrained(out)  # one complete version, whichever
    assert_model_is_version(out, model.config.latent_dim - 20)


def test_old_layout_model_folders_still_load(tmp_path: Path) -> None:
    """A folder of plain config.json + model.safetensors (written before the commit folder)."""
    from safetensors.torch import save_file

    model, out = sr_version(4), tmp_path / "old"
    out.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
    import dataclasses
    import json

    cfg = {"model_type": "sr", **dataclasses.asdict(model.config)}
    (out / "config.json").write_text(json.dumps(cfg))
    assert_model_is_version(out, 4)
    assert SRModel.from_pretrained(out).training_info is None
