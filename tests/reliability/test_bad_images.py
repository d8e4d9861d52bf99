"""Bad image files: each gets a specific error naming the file, and a long encode skips and
reports them (skipped.jsonl + a summary line) instead of aborting.

Covers truncated, corrupt and non-image files, formats Pillow cannot read (HEIC), a
"decompression bomb" PNG whose header declares 10^10 pixels (refused before decoding),
16-bit greyscale, random corruption of real PNG/JPEG bytes (hypothesis), encoder output
with NaN, and ``sparsemm encode`` end to end.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from sparsemm.data.collection import SKIPPED, open_collection
from sparsemm.data.encode import encode_images_skipping, encode_items
from sparsemm.data.sources import read_image_folder
from sparsemm.encoders.base import l2_normalize, register_encoder
from sparsemm.encoders.hf import MAX_IMAGE_PIXELS, load_image
from sparsemm.errors import SparsemmError

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (30, 60, 220)}


class PixelEncoder:
    """A real pixel reader: the mean RGB of the image opened with ``load_image``, so every
    loading failure surfaces exactly as it would for EfficientNet/CLIP. Files whose name
    contains "nan" come back as NaN (an encoder numerics failure)."""

    name = "relpix"
    dim = 3
    modalities = ("image",)
    batches: ClassVar[list[int]] = []

    def __init__(self, model: str | None = None) -> None:
        self.model_id = "mean-rgb"

    def encode_image(
        self, images: Sequence[Any], batch_size: int = 32, normalize: bool = True, **kw: Any
    ) -> np.ndarray:
        PixelEncoder.batches.append(len(images))
        out = np.stack(
            [np.asarray(load_image(p), dtype=np.float32).mean(axis=(0, 1)) for p in images]
        )
        for i, p in enumerate(images):
            if "nan" in Path(str(p)).name:
                out[i] = np.nan
        return l2_normalize(out) if normalize else out


register_encoder("relpix")(PixelEncoder)


# ----------------------------------------------------------------------------- bad files


def png_bytes(colour: tuple[int, int, int] = (200, 50, 50), size: int = 32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def jpeg_bytes(size: int = 48) -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A valid-looking PNG whose header declares width x height pixels; a few bytes long."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


HEIC = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 64

BAD_FILES: dict[str, tuple[bytes | None, str]] = {
    # name: (content, what the error says)
    "truncated.png": (png_bytes()[:60], "cannot read image"),
    "truncated.jpg": (jpeg_bytes()[:400], "cannot read image"),
    "corrupt.png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "cannot read image"),
    "notes.jpg": (b"these are my notes, not a photo\n", "cannot read image"),
    "empty.png": (b"", "cannot read image"),
    "iphone.heic": (HEIC, "cannot read image"),
    "bomb.png": (bomb_png(), "larger than the 120 megapixels sparsemm decodes"),
    "missing.png": (None, "image file not found"),
}


def write_bad(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (content, _) in BAD_FILES.items():
        path = folder / name
        if content is not None:
            path.write_bytes(content)
        paths[name] = path
    return paths


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_each_bad_file_gets_a_specific_error_naming_it(tmp_path: Path, name: str) -> None:
    path = write_bad(tmp_path)[name]
    with pytest.raises(SparsemmError) as info:
        load_image(path)
    msg = str(info.value)
    assert str(path) in msg and BAD_FILES[name][1] in msg
    assert "\n" not in msg


def test_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    side = int(MAX_IMAGE_PIXELS**0.5) + 1
    path = tmp_path / "big.png"
    path.write_bytes(bomb_png(side, side))
    with pytest.raises(SparsemmError, match=rf"decodes \({side}x{side} pixels\); downscale it"):
        load_image(path)  # would need ~360 MB to decode; refused before any pixel is read
    path.write_bytes(bomb_png(side - 2, side - 2))
    with pytest.raises(SparsemmError, match="cannot read image"):
        load_image(path)  # below the limit: decoded, and its 64-byte pixel data is too short
    # past Pillow's own limit (which it checks first, in its own words): sparsemm's limit only
    path.write_bytes(bomb_png(30_000, 30_000))
    with pytest.raises(SparsemmError) as info:
        load_image(path)
    msg = str(info.value)
    assert "larger than the 120 megapixels sparsemm decodes (900,000,000 pixels)" in msg, msg
    assert "exceeds limit" not in msg and "DOS" not in msg, msg


def test_folder_as_image_and_wrong_types(tmp_path: Path) -> None:
    with pytest.raises(SparsemmError, match="is a folder"):
        load_image(tmp_path)
    with pytest.raises(SparsemmError, match="PIL images or file paths"):
        load_image(b"bytes")  # type: ignore[arg-type]


def test_sixteen_bit_greyscale_is_scaled_not_clipped(tmp_path: Path) -> None:
    ramp = (np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16).astype(np.uint16)
    path = tmp_path / "depth.png"
    Image.fromarray(ramp).save(path)
    rgb = np.asarray(load_image(path))
    assert rgb.shape == (64, 64, 3) and rgb.dtype == np.uint8
    assert rgb[0, 0, 0] == 0 and rgb[-1, -1, 0] == round(65520 / 257)
    assert len(np.unique(rgb[..., 0])) > 200  # a ramp, not a white square


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.sampled_from(["png", "jpeg"]),
    cut=st.integers(0, 2000),
    flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=6),
)
def test_corrupted_real_images_only_raise_sparsemm_errors(
    tmp_path_factory: pytest.TempPathFactory, base: str, cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(png_bytes(size=24) if base == "png" else jpeg_bytes())
    for pos, val in flips:
        data[pos % len(data)] = val
    path = tmp_path_factory.mktemp("fuzz") / f"x.{base}"
    path.write_bytes(bytes(data[: max(1, len(data) - cut)]))
    try:
        img = load_image(path)
    except SparsemmError as exc:
        assert str(path) in str(exc)
    else:
        assert img.mode == "RGB" and img.size[0] * img.size[1] > 0


# --------------------------------------------------------------------------- batch skipping


def good_images(folder: Path, n: int = 7) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    names = list(COLOURS)
    paths = []
    for i in range(n):
        p = folder / f"good{i}_{names[i % 3]}.png"
        p.write_bytes(png_bytes(COLOURS[names[i % 3]], size=16 + i))
        paths.append(p)
    return paths


def test_batches_skip_bad_files_and_keep_the_rest_exact(tmp_path: Path) -> None:
    good = good_images(tmp_path / "img")
    bad = write_bad(tmp_path / "img")
    (tmp_path / "img" / "nan_tile.png").write_bytes(png_bytes())
    paths = [*good[:3], bad["truncated.png"], *good[3:], bad["bomb.png"]]
    paths.append(tmp_path / "img" / "nan_tile.png")
    ids = [p.name for p in paths]
    enc = PixelEncoder()
    PixelEncoder.batches.clear()
    emb, ok, skipped = encode_images_skipping(enc, paths, ids, batch_size=4, progress=False)
    assert [s["id"] for s in skipped] == ["truncated.png", "bomb.png", "nan_tile.png"]
    assert "cannot read image" in skipped[0]["error"] and "NaN" in skipped[2]["error"]
    assert ok.tolist() == [p in good for p in paths]
    np.testing.assert_allclose(emb[ok], enc.encode_image(good), rtol=1e-6)
    assert (emb[~ok] == 0).all()
    # batches of 4, 4, 2; those holding an unreadable file were redone image by image
    assert PixelEncoder.batches[:9] == [4, 1, 1, 1, 1, 4, 2, 1, 1]

    with pytest.raises(SparsemmError, match=r"truncated\.png"):
        encode_images_skipping(enc, paths, ids, batch_size=4, progress=False, skip=False)
    with pytest.raises(SparsemmError, match="none of the 2 images could be embedded"):
        encode_images_skipping(enc, [bad["empty.png"], bad["notes.jpg"]], ["a", "b"])


def test_skipped_items_drop_their_captions_too(tmp_path: Path) -> None:
    good = good_images(tmp_path / "img", 3)
    bad = write_bad(tmp_path / "img")
    items = [
        {"id": "g0", "image": str(good[0]), "captions": ["red red"]},
        {"id": "b0", "image": str(bad["corrupt.png"]), "captions": ["lost", "also lost"]},
        {"id": "g1", "image": str(good[1]), "captions": ["green"]},
    ]

    class Words:
        name, dim, modalities, model_id = "relwords", 2, ("text",), "w"

        def encode_text(self, texts: Sequence[str], **kw: Any) -> np.ndarray:
            return l2_normalize(np.array([[len(t), 1.0] for t in texts], dtype=np.float32))

    col = encode_items(
        items, PixelEncoder(), tmp_path / "col", progress=False, text_encoder=Words()
    )  # type: ignore[arg-type]
    assert col.ids == ["g0", "g1"] and col.manifest["skipped"] == 1
    assert [t["text"] for t in col.texts] == ["red red", "green"]
    assert col.text_item_index().tolist() == [0, 1]
    assert [s["id"] for s in col.skipped()] == ["b0"]
    col.verify()  # skipped.jsonl is covered by the checksums


def test_cli_encode_skips_reports_and_can_fail_fast(
    tmp_path: Path, cli: Any, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "photos"
    good = good_images(folder, 5)
    write_bad(folder)
    (folder / "raw").mkdir()
    (folder / "raw" / "IMG_0001.CR2").write_bytes(b"raw sensor data")
    out = tmp_path / "col"
    args = ["encode", str(folder), "-o", str(out), "--encoder", "relpix", "--no-progress"]
    with caplog.at_level(logging.WARNING):
        res = cli(*args)
    assert res.code == 0, res.err
    n_bad = len([n for n, (c, _) in BAD_FILES.items() if c is not None]) - 1  # heic not listed
    lines = res.out.strip().splitlines()
    assert lines[-1].startswith(f"{len(good)} items") and str(out) in lines[-1]
    assert lines[0].startswith(f"skipped {n_bad} item(s) whose image could not be read")
    assert str(out / SKIPPED) in lines[0]
    assert any("1 .cr2" in r.getMessage() and "1 .heic" in r.getMessage() for r in caplog.records)
    col = open_collection(out)
    assert sorted(col.ids) == sorted(p.name for p in good)
    assert {s["id"] for s in col.skipped()} == {
        n for n, (c, _) in BAD_FILES.items() if c is not None and n != "iphone.heic"
    }
    before = (out / "manifest.json").read_bytes()

    # fail fast: one line naming the first bad file (sorted: bomb.png); the collection that
    # was there is untouched and nothing is left behind
    res = cli(*args, "--force", "--on-bad-image", "fail")
    res.one_line_error("bomb.png", "larger than the 120 megapixels")
    assert (out / "manifest.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["col", "photos"]

    # nothing readable at all
    only_bad = tmp_path / "bad"
    write_bad(only_bad)
    res = cli(
        "encode", str(only_bad), "-o", str(tmp_path / "c2"), "--encoder", "relpix", "--no-progress"
    )
    res.one_line_error("none of the 6 images could be embedded")
    assert not (tmp_path / "c2").exists()


def test_folder_of_unreadable_formats_says_so(tmp_path: Path) -> None:
    (tmp_path / "a.heic").write_bytes(HEIC)
    (tmp_path / "b.tiff").write_bytes(b"II*\x00")
    with pytest.raises(SparsemmError, match=r"found only formats sparsemm does not read: 1 \.heic"):
        read_image_folder(tmp_path)


def test_jsonl_source_with_an_unsupported_image(tmp_path: Path, cli: Any) -> None:
    good = good_images(tmp_path, 2)
    (tmp_path / "p.heic").write_bytes(HEIC)
    rows = [{"id": p.stem, "image": p.name} for p in good] + [{"id": "h", "image": "p.heic"}]
    src = tmp_path / "items.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = cli(
        "encode", str(src), "-o", str(tmp_path / "col"), "--encoder", "relpix", "--no-progress"
    )
    assert res.code == 0 and "skipped 1 item(s)" in res.out
    (skip,) = open_collection(tmp_path / "col").skipped()
    assert skip["id"] == "h" and "cannot identify image file" in skip["error"]
