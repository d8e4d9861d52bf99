"""Image uploads are bounded work (issue 32): the size is read from the header before any
pixel is decoded, at most DECODE_SLOTS decode at once (the rest get 503), the decoded query
image is small, and a standard form upload (``curl -F image=@photo.jpg``) is accepted."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from webtoy import StripeImageEncoder, WebKeywordEncoder, draw

from sparsemm.errors import SparsemmError
from sparsemm.query.searcher import Searcher
from sparsemm.web import images
from sparsemm.web.app import create_app

fastapi = pytest.importorskip("fastapi", reason="the web extra is not installed")
from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(scope="module")
def client(web_collection: Path) -> Iterator[TestClient]:
    searcher = Searcher(
        web_collection, encoder=WebKeywordEncoder(), image_encoder=StripeImageEncoder()
    )
    with TestClient(create_app(searcher=searcher), base_url="http://127.0.0.1") as c:
        yield c


def _png(size: tuple[int, int], mode: str = "1") -> bytes:
    out = io.BytesIO()
    Image.new(mode, size).save(out, format="PNG")
    return out.getvalue()


def test_a_decompression_bomb_is_refused_from_its_header(client: TestClient) -> None:
    bomb = _png((7280, 5456))  # 39.7 megapixels in a few KB: what once took 6 GB
    assert len(bomb) < 10_000
    r = client.post("/api/search/image", content=bomb)
    assert r.status_code == 400 and "megapixels" in r.json()["error"]
    assert images.MAX_UPLOAD_PIXELS < Image.MAX_IMAGE_PIXELS  # below Pillow's own limit


def test_an_image_past_pillows_own_limit_is_refused_for_its_pixels(client: TestClient) -> None:
    """A header of 60000x60000 trips Pillow's own check (twice its limit) in open(): that is
    a size to refuse, not "not an image this server can read"."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    huge = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")
    r = client.post("/api/search/image", content=huge)
    assert r.status_code == 400 and "too many pixels" in r.json()["error"], r.json()


def test_a_decoded_query_image_is_reduced() -> None:
    img = images.decode_upload(_png((3000, 2000), "RGB"))
    assert max(img.size) == images.QUERY_IMAGE_SIDE and img.mode == "RGB"
    out = io.BytesIO()
    Image.new("RGB", (4000, 3000), (200, 10, 10)).save(out, format="JPEG")
    jpeg = images.decode_upload(out.getvalue())
    assert max(jpeg.size) <= images.QUERY_IMAGE_SIDE


def test_uploads_beyond_the_decode_slots_are_told_to_retry(
    client: TestClient, tmp_path: Path
) -> None:
    draw(["pizza"], tmp_path / "q.png")
    query = (tmp_path / "q.png").read_bytes()
    budget = images.decode_budget
    held = [budget.take(1) for _ in range(images.DECODE_SLOTS)]
    try:
        assert all(held)
        r = client.post("/api/search/image", content=query)
        assert r.status_code == 503 and r.headers.get("retry-after")
        assert "try again" in r.json()["error"]
    finally:
        for _ in held:
            budget.give_back(1)
    r = client.post("/api/search/image", content=query)
    assert r.status_code == 200, r.text


def test_concurrent_decodes_never_exceed_the_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    inside, most = 0, 0
    lock = threading.Lock()
    real_thumbnail = Image.Image.thumbnail

    def slow_thumbnail(img, *a, **kw):  # type: ignore[no-untyped-def]
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            threading.Event().wait(0.05)
            return real_thumbnail(img, *a, **kw)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(Image.Image, "thumbnail", slow_thumbnail)
    data = _png((64, 48), "RGB")
    results: list[str] = []

    def one() -> None:
        try:
            images.decode_upload(data)
            results.append("ok")
        except images.DecodeBusy:
            results.append("busy")

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most <= images.DECODE_SLOTS and "busy" in results and "ok" in results


def test_a_form_upload_is_accepted(client: TestClient, tmp_path: Path) -> None:
    path = tmp_path / "q.png"
    draw(["pizza", "car"], path)
    r = client.post(
        "/api/search/image",
        params={"exclude": "car", "strategy": "filter"},
        files={"image": ("photo.png", path.read_bytes(), "image/png")},
    )
    assert r.status_code == 200, r.text
    assert r.json()["like"] == "uploaded image"
    # a form without a file part says how to send one
    r = client.post("/api/search/image", files={"note": (None, "no file")})
    assert r.status_code == 400 and "curl -F image=@photo.jpg" in r.json()["error"]
    with pytest.raises(SparsemmError, match="no image file"):
        images.upload_bytes(b"--b--\r\n", "multipart/form-data; boundary=b")


def test_uploads_just_under_the_cap_share_one_pixel_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight clients posting 3-KB PNGs of 23.9 megapixels once decoded two at a time without
    pause (204 -> 17 req/s for the searches, 1.3 GB): the decode slots share a budget of
    pixels in flight (one image at the cap) and per second."""
    monkeypatch.setattr(images, "decode_budget", images.PixelBudget())
    inside, most = 0, 0
    lock = threading.Lock()
    real_thumbnail = Image.Image.thumbnail

    def slow_thumbnail(img, *a, **kw):  # type: ignore[no-untyped-def]
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            threading.Event().wait(0.1)
            return real_thumbnail(img, *a, **kw)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(Image.Image, "thumbnail", slow_thumbnail)
    big = _png((5656, 4226))  # 23.9 MP, just under the cap
    assert len(big) < 5000
    results: list[str] = []
    start = threading.Barrier(8)

    def one() -> None:
        start.wait()
        try:
            images.decode_upload(big)
            results.append("ok")
        except images.DecodeBusy:
            results.append("busy")

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most == 1 and results.count("ok") == 1, (most, results)
    # the rate: a burst of two images at the cap, then about one a second
    budget = images.PixelBudget()
    for _ in range(2):
        assert budget.take(23_900_000)
        budget.give_back(23_900_000)
    assert not budget.take(23_900_000)  # a third at once: wait for the rate
    budget = images.PixelBudget()
    assert budget.take(10_000_000) and budget.take(10_000_000)  # two phone photos at once
    assert not budget.take(10_000_000)  # a third would pass the pixels in flight
    assert budget.decoding == (2, 20_000_000)
