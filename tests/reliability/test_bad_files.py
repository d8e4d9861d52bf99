"""Missing, tampered and incompatible files, a full disk, and two writers at once.

Every case ends in a SparsemmError whose message names the file and what to do (the CLI
prints it on one line and exits 2), the previous artefact stays intact, and no temp file,
temp folder or lock file is left behind.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reltools import child_env, cli_subprocess, collection_version, index_version

import sparsemm.io as io_mod
from sparsemm.data.collection import collection_root, open_collection, write_collection
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.io import WriteError, exclusive_lock, lock_path
from sparsemm.models.sr import SRConfig, SRModel


@pytest.fixture()
def col(tmp_path: Path) -> Path:
    path = tmp_path / "col"
    write_collection(path, **collection_version(1, 30))
    return path


def same_as_version_1(path: Path) -> None:
    c = open_collection(path)
    c.verify()
    assert c.manifest["v"] == 1 and len(c.items) == 30
    np.testing.assert_array_equal(c.image_embeddings(), collection_version(1, 30)["image_emb"])


def clean(folder: Path, *keep: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(keep)


def rewrite_manifest(path: Path, **changes: Any) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


# ------------------------------------------------------------------- missing and tampered


def test_tampered_tables_are_caught_when_opened(col: Path) -> None:
    text = (col / "items.jsonl").read_text()
    (col / "items.jsonl").write_text(text.replace("item 3 of", "item 33 of"))
    with pytest.raises(SparsemmError, match=r"items\.jsonl does not match its checksum"):
        open_collection(col)
    assert len(open_collection(col, verify=False).items) == 30  # an explicit opt-out


def test_tampered_arrays_are_caught_when_loaded(col: Path) -> None:
    raw = bytearray((col / "image_emb.npy").read_bytes())
    raw[-5] ^= 0xFF  # one flipped byte in the last float
    (col / "image_emb.npy").write_bytes(bytes(raw))
    c = open_collection(col)
    with pytest.raises(SparsemmError, match=r"image_emb\.npy does not match its checksum"):
        c.image_embeddings()
    assert c.image_embeddings(mmap=True).shape == (30, 16)  # memory maps skip the hash
    with pytest.raises(SparsemmError, match="re-run `sparsemm encode`"):
        c.verify()


@pytest.mark.parametrize("name", ["items.jsonl", "texts.jsonl", "image_emb.npy", "text_emb.npy"])
def test_missing_files(col: Path, name: str) -> None:
    (col / name).unlink()
    with pytest.raises(SparsemmError, match=rf"{name.replace('.', '[.]')} is missing"):
        c = open_collection(col)
        c.image_embeddings()
        c.text_embeddings()


def test_arrays_consistent_with_a_forged_checksum_still_fail_their_checks(col: Path) -> None:
    """Someone rewrote an array *and* its checksum: shape and finiteness are still checked."""
    for arr, message in [
        (np.full((30, 16), np.nan, np.float32), "NaN or inf"),
        (np.zeros((30, 15), np.float32), r"shape \(30, 15\), the manifest says \(30, 16\)"),
        (np.zeros((29, 16), np.float32), r"shape \(29, 16\)"),
    ]:
        np.save(col / "image_emb.npy", arr)
        checksums = json.loads((col / "manifest.json").read_text())["checksums"]
        checksums["image_emb.npy"] = io_mod_sha(col / "image_emb.npy")
        rewrite_manifest(col, checksums=checksums)
        with pytest.raises(SparsemmError, match=message):
            open_collection(col).image_embeddings()


def io_mod_sha(path: Path) -> str:
    from sparsemm.data.collection import sha256_file

    return sha256_file(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\xff\xfe binary junk", "not valid JSON"),
        (b"[1, 2, 3]", "is not a sparsemm.collection manifest"),
        (b'{"format": "sparsemm.index", "version": 1}', "is not a sparsemm.collection manifest"),
    ],
)
def test_damaged_manifests(col: Path, content: bytes, message: str) -> None:
    (col / "manifest.json").write_bytes(content)
    with pytest.raises(SparsemmError, match=message):
        open_collection(col)


def test_damaged_npy_and_jsonl(col: Path) -> None:
    (col / "image_emb.npy").write_bytes((col / "image_emb.npy").read_bytes()[:100])
    with pytest.raises(SparsemmError, match="damaged"):
        open_collection(col, verify=False).image_embeddings()
    (col / "texts.jsonl").write_bytes(b"\xff\xfe\x00not utf-8\n")
    with pytest.raises(SparsemmError, match="not UTF-8"):
        open_collection(col, verify=False)
    (col / "texts.jsonl").write_text('{"item": 0, "text": "a"}\n' * 29 + "[1, 2]\n")
    with pytest.raises(SparsemmError, match=r"texts\.jsonl rows must be objects"):
        open_collection(col, verify=False)


# -------------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (2, re.escape("written by a newer sparsemm (sparsemm.collection format v2, this one "
                      "reads v1..v1); upgrade sparsemm")),
        (0, "written by an older sparsemm .* re-create it with this version"),
        ("1", "no valid format version"),
        (None, "no valid format version"),
    ],
)  # fmt: skip
def test_collection_format_versions(col: Path, version: Any, message: str) -> None:
    rewrite_manifest(col, version=version)
    with pytest.raises(SparsemmError, match=message):
        open_collection(col)


def test_a_folder_that_holds_a_collection_opens_it(tmp_path: Path) -> None:
    """`sparsemm up` writes PHOTOS/.sparsemm/collection (or OUT/collection with -o): the photo
    folder and the output folder open the collection inside them, so `sparsemm search PHOTOS`
    works; a folder with none says how to make one."""
    photos = tmp_path / "photos"
    inner = photos / ".sparsemm" / "collection"
    write_collection(inner, **collection_version(1, 30))
    for given in (photos, photos / ".sparsemm", inner):
        assert collection_root(given) == inner
        assert open_collection(given).root == inner
    with pytest.raises(SparsemmError, match="create one with `sparsemm up PHOTOS`"):
        open_collection(tmp_path)


def test_malformed_manifest_fields(col: Path) -> None:
    rewrite_manifest(col, encoder={"name": "x", "dim": "16"})
    with pytest.raises(SparsemmError, match="malformed"):
        open_collection(col)


@pytest.mark.parametrize("version", ["one", None])
def test_index_manifest_with_a_garbage_version(tmp_path: Path, version: Any) -> None:
    root = tmp_path / "ix"
    InvertedIndex.build(root, *index_version(1, 10))
    rewrite_manifest(root, version=version)
    with pytest.raises(SparsemmError, match="version"):
        InvertedIndex.open(root)


@pytest.mark.parametrize("config", [[1, 2], {"model_type": "sr", "top_k": "8"}])
def test_model_config_of_the_wrong_shape(tmp_path: Path, config: Any) -> None:
    out = tmp_path / "m"
    SRModel(SRConfig(text_dim=4, image_dim=4, latent_dim=8, top_k=2)).save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(SparsemmError):
        SRModel.from_pretrained(out)


# ------------------------------------------------------------------------------- full disk


class FullDisk:
    """A file whose device fills up after ``budget`` bytes (OSError ENOSPC, like a real one)."""

    def __init__(self, fh: Any, budget: list[int]) -> None:
        self.fh, self.budget = fh, budget

    def write(self, data: Any) -> int:
        if len(data) > self.budget[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget[0] -= len(data)
        return int(self.fh.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.fh.close()


@pytest.fixture()
def disk_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def fill_after(budget: int) -> None:
        real, left = os.fdopen, [budget]
        monkeypatch.setattr(
            io_mod.os, "fdopen", lambda fd, mode="r", *a, **k: FullDisk(real(fd, mode), left)
        )

    yield fill_after
    monkeypatch.undo()


@pytest.mark.parametrize("budget", [0, 1500, 3000])
def test_full_disk_during_a_collection_write(
    col: Path, tmp_path: Path, disk_with: Any, budget: int
) -> None:
    disk_with(budget)
    with pytest.raises(SparsemmError, match=f"cannot write {col}: no space left on the dev"):
        write_collection(col, **collection_version(2, 60))
    disk_with(budget)
    with pytest.raises(SparsemmError) as info:
        write_collection(col, **collection_version(2, 60))
    assert isinstance(info.value, WriteError) and info.value.errno == errno.ENOSPC
    assert isinstance(info.value, OSError)
    same_as_version_1(col)
    clean(tmp_path, "col")


def test_full_disk_during_an_index_add(tmp_path: Path, disk_with: Any) -> None:
    root = tmp_path / "ix"
    index = InvertedIndex.build(root, *index_version(1, 40))
    disk_with(2000)
    with pytest.raises(SparsemmError, match="no space left"):
        index.add(*index_version(2, 500))
    assert list(InvertedIndex.open(root).ids) == index_version(1, 40)[1]


def test_cli_with_a_file_size_limit(tmp_path: Path) -> None:
    """A real OS refusal: RLIMIT_FSIZE makes writes past 24 KiB fail with EFBIG."""
    n = 300
    ids = [f"id{i}" for i in range(n)]
    table = tmp_path / "table.npy"
    np.save(table, np.random.default_rng(0).normal(size=(n, 64)).astype(np.float32))
    (tmp_path / "table.ids.txt").write_text("\n".join(ids))
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps({"id": i, "caption": f"item {i}"}) + "\n" for i in ids))
    out = tmp_path / "col"
    write_collection(out, **collection_version(1, 30))

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, don't kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (24_000, 24_000))

    argv = ["encode", str(src), "-o", str(out), "--encoder", "precomputed", "--model", str(table)]
    res = cli_subprocess([*argv, "--no-progress"], verbs=("encode",), preexec=limit)
    res.one_line_error(f"cannot write {out}: file too large for the file system or the file-size")
    same_as_version_1(out)
    clean(tmp_path, "col", "items.jsonl", "table.ids.txt", "table.npy")
    ok = cli_subprocess([*argv, "--no-progress"], verbs=("encode",))
    assert ok.code == 0 and len(open_collection(out).items) == n


def test_full_disk_while_checkpointing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import sparsemm.train.checkpoint as ck

    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ck, "save_file", no_space)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(SparsemmError, match="no space left"):
        ck.save_checkpoint(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1), {})


@pytest.mark.parametrize(
    ("err", "fragments"),
    [
        (errno.ENOSPC, ("cannot write {out}: no space left on the device",)),
        # not a user-fixable errno: the OSError itself, on one line, naming the file
        (errno.EIO, ("Input/output error: {out}/.checkpoint.", "check the path and the disk")),
    ],
)
def test_cli_training_on_a_failing_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any, err: int, fragments: Any
) -> None:
    """A checkpoint write failing inside `sparsemm train sr`: one error line, exit 2, and
    no half-written checkpoint left behind."""
    import sparsemm.train.checkpoint as ck

    kw = collection_version(1, 24)
    kw["items"] = [{**it, "split": "train"} for it in kw["items"]]
    write_collection(tmp_path / "col", **kw)
    out = tmp_path / "sr"

    def failing(tensors: Any, path: str) -> None:
        raise OSError(err, os.strerror(err), path)

    monkeypatch.setattr(ck, "save_file", failing)
    res = cli(
        "train", "sr", str(tmp_path / "col"), "-o", str(out), "--no-bias", "--latent-dim",
        "16", "--top-k", "4", "--epochs", "1", "--batch-size", "8", "--no-progress",
    )  # fmt: skip
    res.one_line_error(*(f.format(out=out) for f in fragments))
    assert not list(out.iterdir())  # the checkpoint's temp folder was removed


def test_read_only_output_folder(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes to read-only folders")  # pragma: no cover
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(SparsemmError, match="permission denied"):
            write_collection(ro / "col", **collection_version(1, 5))
    finally:
        ro.chmod(0o700)


def test_permission_errors_become_write_errors(tmp_path: Path) -> None:
    err = io_mod.write_error(PermissionError(errno.EACCES, "Permission denied"), tmp_path / "x")
    assert isinstance(err, SparsemmError) and "choose an output folder" in str(err)
    other = OSError("simulated crash")
    assert io_mod.write_error(other, tmp_path) is other  # not a user-fixable errno: unchanged


# ------------------------------------------------------------------------------ two writers


def hold(lock_script: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", lock_script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    proc.wait(timeout=30)


def test_second_collection_writer_fails_at_once(tmp_path: Path, col: Path, cli: Any) -> None:
    ids = [f"i{i}" for i in range(5)]
    np.save(tmp_path / "t.npy", np.eye(5, 8, dtype=np.float32))
    (tmp_path / "t.ids.txt").write_text("\n".join(ids))
    (tmp_path / "s.jsonl").write_text(
        "".join(json.dumps({"id": i, "caption": i}) + "\n" for i in ids)
    )
    proc = hold(
        "import sys\n"
        "from sparsemm.data.collection import collection_lock\n"
        f"with collection_lock({str(col)!r}):\n"
        "    print('locked', flush=True)\n"
        "    sys.stdin.readline()\n"
    )
    argv = ["encode", str(tmp_path / "s.jsonl"), "-o", str(col), "--encoder", "precomputed"]
    argv += ["--model", str(tmp_path / "t.npy"), "--no-progress"]
    try:
        res = cli(*argv)
        res.one_line_error("is being written by another process (pid", "wait for it to finish")
        same_as_version_1(col)
        with pytest.raises(SparsemmError, match="another process"):
            write_collection(col, **collection_version(2, 3))
    finally:
        release(proc)
    assert cli(*argv).code == 0 and open_collection(col).ids == ids
    clean(tmp_path, "col", "s.jsonl", "t.ids.txt", "t.npy")


def test_lock_of_a_killed_writer_is_free_and_threads_exclude_each_other(tmp_path: Path) -> None:
    target = tmp_path / "col"
    proc = hold(
        "import sys\n"
        "from sparsemm.data.collection import collection_lock\n"
        f"lock = collection_lock({str(target)!r})\n"
        "lock.__enter__()\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    proc.kill()  # SIGKILL: the kernel drops the flock
    proc.wait(timeout=30)
    write_collection(target, **collection_version(1, 4))  # not blocked by a stale lock
    with exclusive_lock(lock_path(target), "collection"):
        import threading

        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                write_collection(target, **collection_version(2, 4))
            except SparsemmError as exc:
                errors.append(exc)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert errors and "another process" in str(errors[0])
        with exclusive_lock(lock_path(target), "collection"):  # re-entrant in one thread
            pass
    assert open_collection(target).manifest["v"] == 1


def test_second_index_writer_via_the_cli(tmp_path: Path, toy_root: Path, cli: Any) -> None:
    col = tmp_path / "col"
    shutil.copytree(toy_root / "col", col)
    proc = hold(
        "import fcntl, sys\n"
        f"fh = open({str(col / 'index' / '.lock')!r}, 'a+')\n"
        "fcntl.flock(fh.fileno(), fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    try:
        res = cli("index", str(col), "--model", str(toy_root / "sr"))
        res.one_line_error("being written by another process")
    finally:
        release(proc)
    assert cli("index", str(col), "--model", str(toy_root / "sr")).code == 0


def test_cli_reports_a_tampered_collection_on_one_line(
    tmp_path: Path, toy_root: Path, cli: Any
) -> None:
    col = tmp_path / "col"
    shutil.copytree(toy_root / "col", col)
    with (col / "items.jsonl").open("a") as fh:
        fh.write('{"id": "intruder"}\n')
    res = cli("search", str(col), "dog")
    res.one_line_error(r"items.jsonl does not match its checksum", "re-run `sparsemm encode`")
