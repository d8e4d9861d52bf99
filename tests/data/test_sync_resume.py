"""A run of ``sync_folder`` (``sparsemm up``) stopped while embedding a folder resumes where
it was: the images embedded before the stop are not read again, and the collection is the
same as an uninterrupted run's. A damaged record of them is embedded again, not trusted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import sparsemm.data.sync as sync
from fakes import ColourEncoder, FlatText
from sparsemm.data.collection import open_collection
from sparsemm.data.sync import partial_path, read_photos, sync_folder

INFO = {"name": "minilm", "dim": 4}


def picture(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((rng.random((24, 32, 3)) * 255).astype(np.uint8)).save(path, format="JPEG")
    return path


class _Killed(BaseException):
    """What a SIGKILL looks like from inside: nothing after it runs (not an Exception)."""


class _DiesAfter(ColourEncoder):
    def __init__(self, images: int) -> None:
        super().__init__()
        self.left = images

    def encode_image(self, images, batch_size=32, normalize=True, progress=False):
        if len(self.read) + len(images) > self.left:
            raise _Killed
        return super().encode_image(images, batch_size, normalize, progress)


def _folder(tmp_path: Path, n: int = 7) -> Path:
    photos = tmp_path / "photos"
    for i in range(n):
        picture(photos / f"p{i}.jpg", i)
    return photos


def _sync(photos: Path, col: Path, enc: ColourEncoder) -> None:
    sync_folder(
        read_photos(photos), col, enc, FlatText(), INFO, photos, batch_size=1, progress=False
    )


@pytest.fixture
def killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(photos, collection folder) after a run of 7 photos killed at the 5th: records every
    2 photos, so 4 are recorded (2 + 2), the 5th lost, and no collection written."""
    monkeypatch.setattr(sync, "PARTIAL_EVERY", 2)
    photos = _folder(tmp_path)
    col = tmp_path / "col"
    with pytest.raises(_Killed):
        _sync(photos, col, _DiesAfter(5))
    return photos, col


def test_a_stopped_run_resumes_without_reading_again(
    tmp_path: Path, killed: tuple[Path, Path]
) -> None:
    photos, col = killed
    whole = tmp_path / "whole"
    _sync(photos, whole, ColourEncoder())
    assert partial_path(col).is_file() and not (col / "manifest.json").exists()
    again = ColourEncoder()
    _sync(photos, col, again)
    assert again.read == ["p4.jpg", "p5.jpg", "p6.jpg"]
    assert not partial_path(col).exists()
    got, want = open_collection(col), open_collection(whole)
    assert got.ids == want.ids
    np.testing.assert_array_equal(got.image_embeddings(), want.image_embeddings())


def test_a_damaged_record_is_embedded_again(tmp_path: Path, killed: tuple[Path, Path]) -> None:
    photos, col = killed
    record = partial_path(col)
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0xFF
    record.write_bytes(bytes(data))
    again = ColourEncoder()
    _sync(photos, col, again)
    assert len(again.read) == 7
    whole = tmp_path / "whole"
    _sync(photos, whole, ColourEncoder())
    np.testing.assert_array_equal(
        open_collection(col).image_embeddings(), open_collection(whole).image_embeddings()
    )


def test_a_replaced_photo_is_not_taken_from_the_record(killed: tuple[Path, Path]) -> None:
    """The record is keyed by file version: a photo replaced between the runs is read."""
    photos, col = killed
    picture(photos / "p0.jpg", 99)
    again = ColourEncoder()
    _sync(photos, col, again)
    assert again.read == ["p0.jpg", "p4.jpg", "p5.jpg", "p6.jpg"]


def test_the_record_is_rewritten_a_few_times_its_size_not_n_squared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every save rewrites the whole record: saves spaced by a quarter of what it holds
    keep the rows written to a few times the folder, where one save per step wrote
    n^2 / 2 / step rows."""
    monkeypatch.setattr(sync, "PARTIAL_EVERY", 1)
    written: list[int] = []
    real = sync._save_partial

    def counting(path: Path, done: dict, enc: object) -> None:
        written.append(len(done))
        real(path, done, enc)

    monkeypatch.setattr(sync, "_save_partial", counting)
    photos = _folder(tmp_path, 60)
    _sync(photos, tmp_path / "col", ColourEncoder())
    assert 10 <= len(written) <= 20 and sum(written) <= 6 * 60, written
    assert not partial_path(tmp_path / "col").exists()
