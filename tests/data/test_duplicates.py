"""Exact duplicates in a photo folder: copies with the same bytes and links to a photo of the
folder are one item that lists its other paths (``also``); re-runs keep that consistent
(a later copy joins, deleting the first copy keeps the item under another path, a killed
run loses nothing) and embed nothing twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import sparsemm.data.sync as sync
from fakes import ColourEncoder, FlatText
from sparsemm.data.collection import open_collection
from sparsemm.data.sync import SyncReport, read_photos, sync_folder
from sparsemm.errors import SparsemmError

INFO = {"name": "minilm", "dim": 4}


def picture(path: Path, seed: int, fmt: str = "JPEG") -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((rng.random((24, 32, 3)) * 255).astype(np.uint8)).save(path, format=fmt)
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """a.jpg with a byte copy (copy/b.jpg) and a link (link.jpg); c.jpg; two BMPs of the
    same size but other pixels (sizes collide, bytes differ)."""
    photos = tmp_path / "photos"
    picture(photos / "a.jpg", 0)
    (photos / "copy").mkdir()
    shutil.copyfile(photos / "a.jpg", photos / "copy" / "b.jpg")
    (photos / "link.jpg").symlink_to(photos / "a.jpg")
    picture(photos / "c.jpg", 1)
    picture(photos / "e.bmp", 2, "BMP")
    picture(photos / "f.bmp", 3, "BMP")
    return photos


def run(photos: Path, col: Path, enc: ColourEncoder) -> SyncReport:
    return sync_folder(read_photos(photos), col, enc, FlatText(), INFO, photos, progress=False)


def by_id(col: Path) -> dict[str, dict]:
    return {it["id"]: it for it in open_collection(col).items}


def test_copies_and_links_are_one_item_with_their_other_paths(tmp_path: Path, folder: Path) -> None:
    enc = ColourEncoder()
    report = run(folder, tmp_path / "col", enc)
    items = by_id(tmp_path / "col")
    assert sorted(items) == ["a.jpg", "c.jpg", "e.bmp", "f.bmp"]
    assert items["a.jpg"]["also"] == ["copy/b.jpg", "link.jpg"]
    assert "also" not in items["e.bmp"] and "also" not in items["c.jpg"]
    assert report.folded == 2 and report.added == sorted(items)
    assert sorted(enc.read) == ["a.jpg", "c.jpg", "e.bmp", "f.bmp"]  # each photo read once


def test_a_link_to_a_photo_outside_the_folder_is_a_photo_of_its_own(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    picture(photos / "a.jpg", 0)
    outside = picture(tmp_path / "elsewhere" / "x.jpg", 5)
    (photos / "x-link.jpg").symlink_to(outside)
    report = run(photos, tmp_path / "col", ColourEncoder())
    assert report.folded == 0
    assert sorted(by_id(tmp_path / "col")) == ["a.jpg", "x-link.jpg"]


def test_the_first_copy_is_a_real_file_and_captions_of_copies_join(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    picture(photos / "b.jpg", 0)
    (photos / "a-link.jpg").symlink_to(photos / "b.jpg")  # sorts first, but is a link
    shutil.copyfile(photos / "b.jpg", photos / "c.jpg")
    caps = tmp_path / "caps.jsonl"
    caps.write_text('{"id": "b.jpg", "caption": "a beach"}\n{"id": "c.jpg", "caption": "sea"}\n')
    sync_folder(
        read_photos(photos, caps), tmp_path / "col", ColourEncoder(), FlatText(), INFO, photos,
        progress=False,
    )  # fmt: skip
    col = open_collection(tmp_path / "col")
    assert [it["id"] for it in col.items] == ["b.jpg"]
    assert col.items[0]["also"] == ["a-link.jpg", "c.jpg"]
    assert col.items[0]["captions"] == ["a beach", "sea"]
    assert [t["text"] for t in col.texts] == ["a beach", "sea"]


def test_reruns_stay_consistent_and_embed_nothing_twice(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    col = tmp_path / "col"
    enc = ColourEncoder()
    run(folder, col, enc)
    emb_a = open_collection(col).image_embeddings()[0].copy()

    hashed: list[str] = []
    real = sync._sha256
    monkeypatch.setattr(sync, "_sha256", lambda p: hashed.append(Path(p).name) or real(p))
    enc.read.clear()
    report = run(folder, col, enc)
    assert not report.touched and enc.read == []
    assert hashed == []  # the digests of unchanged files are remembered, not read again

    # a copy added later joins the existing item; the index of the items stays valid
    shutil.copyfile(folder / "a.jpg", folder / "0.jpg")
    (col / "index").mkdir()
    report = run(folder, col, enc)
    items = by_id(col)
    assert items["a.jpg"]["also"] == ["0.jpg", "copy/b.jpg", "link.jpg"] and "0.jpg" not in items
    assert enc.read == [] and report.added == [] and report.grew_only and report.folded == 3
    assert (col / "index").is_dir()  # carried: ids and embeddings are unchanged

    # deleting the first copy keeps the photo under the remaining path, embedding and all
    (folder / "a.jpg").unlink()  # link.jpg now points nowhere and is gone too
    report = run(folder, col, enc)
    items = by_id(col)
    assert report.renamed == [("a.jpg", "0.jpg")] and report.removed == []
    assert items["0.jpg"]["also"] == ["copy/b.jpg"] and "a.jpg" not in items
    assert enc.read == [] and report.unchanged == 4
    assert open_collection(col).ids[0] == "0.jpg"  # in the old item's place
    np.testing.assert_array_equal(open_collection(col).image_embeddings()[0], emb_a)

    # a photo overwritten with a copy of another is shown with it, not "removed"
    shutil.copyfile(folder / "0.jpg", folder / "c.jpg")
    report = run(folder, col, enc)
    assert report.joined == ["c.jpg"] and report.removed == [] and not report.grew_only
    assert by_id(col)["0.jpg"]["also"] == ["c.jpg", "copy/b.jpg"]

    # and the last copies going leave one plain item
    (folder / "c.jpg").unlink()
    (folder / "copy" / "b.jpg").unlink()
    report = run(folder, col, enc)
    assert "also" not in by_id(col)["0.jpg"] and report.folded == 0 and report.removed == []
    assert enc.read == []


def test_a_killed_run_loses_nothing(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    col = tmp_path / "col"
    enc = ColourEncoder()
    run(folder, col, enc)
    (folder / "a.jpg").unlink()
    shutil.copyfile(folder / "c.jpg", folder / "d.jpg")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(sync, "write_collection", killed)
        with pytest.raises(KeyboardInterrupt):
            run(folder, col, enc)
    assert by_id(col)["a.jpg"]["also"] == ["copy/b.jpg", "link.jpg"]  # the old version whole
    report = run(folder, col, enc)
    items = by_id(col)
    assert sorted(items) == ["c.jpg", "copy/b.jpg", "e.bmp", "f.bmp"]
    assert items["c.jpg"]["also"] == ["d.jpg"] and "also" not in items["copy/b.jpg"]
    assert report.renamed == [("a.jpg", "copy/b.jpg")] and report.removed == []


def test_a_rerun_whose_new_files_are_all_broken_skips_them(tmp_path: Path, folder: Path) -> None:
    """New files that cannot be read are skipped on a re-run even when no new file can be
    read (the collection keeps its photos, and a new copy still joins its photo); only a
    folder with nothing readable at all is an error."""
    col = tmp_path / "col"
    run(folder, col, ColourEncoder())
    (folder / "trunc.jpg").write_bytes((folder / "c.jpg").read_bytes()[:100])
    (folder / "zero.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("not a picture")
    shutil.copyfile(folder / "c.jpg", folder / "c-copy.jpg")
    run(folder, col, ColourEncoder())
    items = by_id(col)
    assert sorted(items) == ["a.jpg", "c.jpg", "e.bmp", "f.bmp"]
    assert items["c.jpg"]["also"] == ["c-copy.jpg"]
    skipped = {s["id"] for s in open_collection(col).skipped()}
    assert {"trunc.jpg", "text.jpg"} <= skipped
    only_bad = tmp_path / "bad"
    only_bad.mkdir()
    (only_bad / "text.jpg").write_text("not a picture")
    with pytest.raises(SparsemmError, match="none of the 1 images could be embedded"):
        run(only_bad, tmp_path / "col2", ColourEncoder())


def test_a_copied_or_restored_folder_is_not_read_again(tmp_path: Path, folder: Path) -> None:
    """`cp -r` (or a restore from an archive) gives every photo a new mtime; a re-run read
    and embedded them all again. Same bytes keep the embedding; other bytes of the same size
    (an edited photo) are still read again."""
    run(folder, tmp_path / "col", ColourEncoder())
    assert all(it.get("sha256") for it in by_id(tmp_path / "col").values())
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy, symlinks=True, copy_function=shutil.copyfile)  # new mtimes
    shutil.copytree(tmp_path / "col", tmp_path / "col2", copy_function=shutil.copyfile)
    edited = picture(copy / "f.bmp", 9, "BMP")  # same size as before, other pixels
    assert edited.stat().st_size == (folder / "f.bmp").stat().st_size
    enc = ColourEncoder()
    report = run(copy, tmp_path / "col2", enc)
    assert enc.read == ["f.bmp"]
    assert report.changed == ["f.bmp"] and report.unchanged == 3 and not report.added
    items = by_id(tmp_path / "col2")
    assert items["a.jpg"]["image"] == str(copy / "a.jpg")  # the new paths are recorded
    enc = ColourEncoder()
    report = run(copy, tmp_path / "col2", enc)  # and the next run reads nothing at all
    assert enc.read == [] and not report.touched


def test_checking_many_photos_contents_shows_progress(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Hashing a large copied folder takes a while (about 250 MB/s): it shows a bar."""
    monkeypatch.setattr(sync, "HASH_BAR_FROM", 1)
    items = read_photos(folder)
    sync_folder(items, tmp_path / "col", ColourEncoder(), FlatText(), INFO, folder, progress=True)
    assert "checking photo contents" in capsys.readouterr().err
    monkeypatch.setattr(sync, "HASH_BAR_FROM", 10**6)
    sync_folder(items, tmp_path / "col2", ColourEncoder(), FlatText(), INFO, folder, progress=True)
    assert "checking photo contents" not in capsys.readouterr().err
