"""Images the server serves: item images by id (only files the collection references,
only with an image suffix), thumbnails made and cached in memory, and decoded uploads.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os
import quopri
import re
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from sparsemm.data.collection import Collection, relocated
from sparsemm.encoders.hf import upright
from sparsemm.errors import SparsemmError

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 8 * 2**20  # a query image (POST /api/search/image); a phone photo fits
# Decoded size cap, read from the header before anything is decoded: a 5 KB PNG can expand to
# 40 megapixels (120 MB as RGB). 24 MP holds a phone photo and is well under Pillow's own
# bomb limit (about 89 MP).
MAX_UPLOAD_PIXELS = 24_000_000
# Longest side a query image is reduced to once decoded: the encoders read 224-384 px, so
# a larger copy is memory held for nothing.
QUERY_IMAGE_SIDE = 1024
# Uploads decoded at once; another finds the server busy (503) instead of adding its
# hundred megabytes to the server's memory.
DECODE_SLOTS = 2
# The decode slots share a pixel budget: the pixels of the uploads being decoded at once
# (after a JPEG's reduced-scale draft) stay under DECODE_PIXELS (one image at the cap), and
# the pixels decoded per second under DECODE_PIXELS_PER_SECOND, with a burst of two images
# at the cap. Eight clients posting 3-KB PNGs of 23.9 megapixels through two slots once
# took two cores and 800 MB from the searches; a person's query photos stay far below.
DECODE_PIXELS = MAX_UPLOAD_PIXELS
DECODE_PIXELS_PER_SECOND = 24_000_000
DECODE_PIXEL_BURST = 2 * MAX_UPLOAD_PIXELS
THUMB_PX = 256  # longest side of a thumbnail (the page shows cards at 256 px)
THUMB_CACHE_BYTES = 32 * 2**20  # thumbnails kept in memory, least recently used dropped
# Suffixes served from /images/ and their media types; any other referenced file is not served.
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
}


# -------------------------------------------------------------------------------- images


def _listing(folder: str) -> tuple[str, dict[str, os.DirEntry[str]]] | None:
    """(the folder's resolved path, its entries by name), or None if it cannot be read."""
    try:
        real = os.path.realpath(folder, strict=True)
        with os.scandir(real) as it:
            return real, {e.name: e for e in it}
    except (OSError, RuntimeError, ValueError):
        return None


def _image_file(real_folder: str, entry: os.DirEntry[str]) -> Path | None:
    """The resolved path of a folder entry that is (or links to) a regular file with an
    image suffix, else None."""
    try:
        if entry.is_symlink():
            path = Path(os.path.realpath(entry.path, strict=True))
            ok = path.is_file()
        else:
            path = Path(real_folder) / entry.name
            ok = entry.is_file(follow_symlinks=False)
    except (OSError, RuntimeError, ValueError):
        return None
    return path if ok and path.suffix.lower() in IMAGE_TYPES else None


class ImageStore:
    """Item id -> image file, for the images the collection's items reference.

    An item's ``image`` may be absolute or relative to the collection folder; an absolute
    one under a photo folder moved since `up` is looked for where the folder is now first
    (:func:`sparsemm.data.collection.moved_photos`). Only existing regular files with a
    suffix in :data:`IMAGE_TYPES` are kept; a request can name nothing else, since it is
    looked up by id and never joined to a folder.
    """

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    @classmethod
    def from_collection(cls, col: Collection) -> ImageStore:
        """The images of ``col``'s items, each as its resolved path (symlinks followed).

        Each folder is resolved and listed once: at 100,000 items, resolving every path on
        its own (``Path.resolve`` walks each component) took 7.7 s of a server's start."""
        paths: dict[str, Path] = {}
        skipped = 0
        folders: dict[str, tuple[str, dict[str, os.DirEntry[str]]] | None] = {}

        def lookup(path: Path) -> Path | None:
            parent, name = os.path.split(str(path))
            if parent not in folders:
                folders[parent] = _listing(parent)
            listing = folders[parent]
            entry = listing[1].get(name) if listing is not None else None
            return _image_file(listing[0], entry) if listing and entry else None

        moved = col.photos_moved  # the photo folder moved since `up`: its photos are there
        for item in col.items:
            ref = item.get("image")
            if not isinstance(ref, str) or not ref:
                continue
            path = Path(ref).expanduser()
            if not path.is_absolute():
                path = col.root / path
            there = relocated(path, moved)
            found = (lookup(there) if there is not None else None) or lookup(path)
            if found is None:
                skipped += 1
            else:
                paths[str(item["id"])] = found
        if skipped:
            log.warning(
                "%d item image(s) are missing or not image files; those items show as "
                "caption cards",
                skipped,
            )
        return cls(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self.paths

    def get(self, item_id: str) -> Path | None:
        """The image file of ``item_id``; None when it has none or the file changed."""
        path = self.paths.get(item_id)
        if path is None:
            return None
        try:
            # A file swapped for a symlink since startup resolves elsewhere: refuse it.
            if path.resolve(strict=True) != path or not path.is_file():
                return None
        except (OSError, RuntimeError):
            return None
        return path


class ThumbCache:
    """Thumbnails (JPEG, longest side :data:`THUMB_PX`) made from the served images on first
    request, kept in memory up to :data:`THUMB_CACHE_BYTES` (least recently used dropped);
    a file changed since is made again (keyed by path, size and mtime)."""

    def __init__(self, max_bytes: int = THUMB_CACHE_BYTES, px: int = THUMB_PX) -> None:
        self.max_bytes, self.px = max_bytes, px
        self._items: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: Path) -> bytes | None:
        """The thumbnail of ``path``; None when the file cannot be read as an image."""
        try:
            st = path.stat()
        except OSError:
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        data = self._make(path)
        if data is None:
            return None
        with self._lock:
            if key not in self._items:
                self._items[key] = data
                self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)
        return data

    def _make(self, path: Path) -> bytes | None:
        from PIL import Image

        try:
            with Image.open(path) as img:
                if img.width * img.height > MAX_UPLOAD_PIXELS:
                    return None
                # JPEG: decode at a reduced scale (square, so a quarter turn needs no care)
                img.draft("RGB", (self.px, self.px))
                small = upright(img).convert("RGB")  # as the phone showed it
                small.thumbnail((self.px, self.px))
                out = io.BytesIO()
                small.save(out, format="JPEG", quality=85)
                return out.getvalue()
        except Exception:  # a broken or non-image file: the page falls back to a caption
            log.warning("cannot make a thumbnail of %s", path, exc_info=True)
            return None


class PixelBudget:
    """What the decode slots share: at most ``slots`` decodes and ``in_flight`` pixels at
    once, and ``rate`` pixels a second (a token bucket holding at most ``burst``).
    :meth:`take` never waits: False means the server is busy (503, retry)."""

    def __init__(
        self,
        slots: int = DECODE_SLOTS,
        in_flight: int = DECODE_PIXELS,
        rate: float = DECODE_PIXELS_PER_SECOND,
        burst: float = DECODE_PIXEL_BURST,
    ) -> None:
        self.slots, self.in_flight, self.rate, self.burst = slots, in_flight, rate, burst
        self._lock = threading.Lock()
        self._decoding = 0  # decodes in progress
        self._pixels = 0  # their pixels
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self, pixels: int) -> bool:
        """Reserve a decode of ``pixels``; False when it does not fit now."""
        pixels = max(int(pixels), 1)
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            if (
                self._decoding >= self.slots
                or self._pixels + pixels > self.in_flight
                or self._tokens < pixels
            ):
                return False
            self._decoding += 1
            self._pixels += pixels
            self._tokens -= pixels
            return True

    def give_back(self, pixels: int) -> None:
        """End a decode :meth:`take` reserved (its pixels stay spent in the rate)."""
        with self._lock:
            self._decoding -= 1
            self._pixels -= max(int(pixels), 1)

    @property
    def decoding(self) -> tuple[int, int]:
        """(decodes, pixels) in progress now."""
        with self._lock:
            return self._decoding, self._pixels


decode_budget = PixelBudget()


class DecodeBusy(SparsemmError):
    """The decode slots or their pixel budget are taken (HTTP 503: try again in a moment)."""


def decode_upload(data: bytes) -> Any:
    """A query image from an upload's bytes (a PIL image, RGB, at most
    :data:`QUERY_IMAGE_SIDE` px a side); SparsemmError when it is empty, too large or not
    an image, :class:`DecodeBusy` when the decode slots or their pixel budget
    (:data:`decode_budget`) are taken.

    The size is checked from the header before any pixel is decoded; a JPEG is decoded at
    a reduced scale straight away (``draft``); the full-size buffer of other formats is
    dropped as soon as the reduced copy exists. Run it off the event loop."""
    from PIL import Image

    if not data:
        raise SparsemmError("send the query image as the request body (PNG, JPEG, WebP, ...)")
    if len(data) > MAX_UPLOAD_BYTES:
        raise SparsemmError(f"the image is larger than {MAX_UPLOAD_BYTES // 2**20} MiB")
    not_an_image = (
        "the upload is not an image this server can read; send a PNG, JPEG, GIF, WebP or BMP file"
    )
    try:  # the header only: no pixel is decoded yet
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > MAX_UPLOAD_PIXELS:
            raise SparsemmError(
                f"the image has {img.width}x{img.height} pixels; send one under "
                f"{MAX_UPLOAD_PIXELS // 10**6} megapixels"
            )
        if img.format == "JPEG":
            img.draft("RGB", (QUERY_IMAGE_SIDE, QUERY_IMAGE_SIDE))
        pixels = img.width * img.height  # what will be decoded
    except SparsemmError:
        raise
    except Image.DecompressionBombError as exc:  # Pillow's own check, past twice its limit
        raise SparsemmError(
            f"the image has too many pixels; send one under {MAX_UPLOAD_PIXELS // 10**6} megapixels"
        ) from exc
    except Exception as exc:  # PIL raises several types for a non-image or a broken file
        raise SparsemmError(not_an_image) from exc
    if not decode_budget.take(pixels):
        raise DecodeBusy("the server is decoding other uploads; try again in a moment")
    try:
        query = upright(img)  # a phone's portrait photo is read as it was taken
        query.thumbnail((QUERY_IMAGE_SIDE, QUERY_IMAGE_SIDE))
        return query.convert("RGB")
    except Exception as exc:
        raise SparsemmError(not_an_image) from exc
    finally:
        decode_budget.give_back(pixels)


def upload_bytes(body: bytes, content_type: str) -> bytes:
    """The image bytes of an upload: the body itself, or, for a form upload
    (``multipart/form-data``, as ``curl -F image=@photo.jpg`` and HTML forms send), its
    ``image`` part (else its first file part). SparsemmError when a form holds no file, more
    than :data:`MAX_FORM_PARTS` parts or a part head over :data:`MAX_PART_HEAD` bytes.

    One pass of ``bytes.find`` over the body (a form of 161,300 tiny parts once held the
    event loop 70 s in the e-mail parser); run it off the event loop all the same."""
    if not content_type.lower().startswith("multipart/form-data"):
        return body
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise SparsemmError("the form names no boundary; send the image as the raw body")
    delim = b"--" + (match.group(1) or match.group(2)).encode("latin-1", "replace")
    files: list[tuple[str | None, dict[str, str], bytes]] = []
    pos = body.find(delim)
    parts = 0
    while pos >= 0:
        pos += len(delim)
        if body.startswith(b"--", pos):
            break  # the closing delimiter
        end = body.find(b"\r\n" + delim, pos)
        part = body[pos:] if end < 0 else body[pos:end]
        parts += 1
        if parts > MAX_FORM_PARTS:
            raise SparsemmError(
                f"the form has more than {MAX_FORM_PARTS} parts; send the image alone, as the "
                "field 'image' (curl -F image=@photo.jpg) or as the raw request body"
            )
        head, sep, data = part.partition(b"\r\n\r\n")
        if not sep:
            head, data = part, b""
        if len(head) > MAX_PART_HEAD:
            raise SparsemmError(f"a form part's head is over {MAX_PART_HEAD // 1024} KiB")
        headers = _part_headers(head)
        name, is_file = _disposition(headers.get("content-disposition", ""))
        if is_file or name == "image":
            files.append((name, headers, data))
        pos = end + 2 if end >= 0 else -1
    named = [f for f in files if f[0] == "image"]
    if not files:
        raise SparsemmError(
            "the form holds no image file; send it as the field 'image' "
            "(curl -F image=@photo.jpg) or as the raw request body"
        )
    _, headers, data = (named or files)[0]
    encoding = headers.get("content-transfer-encoding", "").strip().lower()
    try:
        if encoding == "base64":
            return base64.b64decode(data)
        if encoding == "quoted-printable":
            return quopri.decodestring(data)
    except (ValueError, binascii.Error) as exc:
        raise SparsemmError(f"the form's image part is not valid {encoding}") from exc
    return data


MAX_FORM_PARTS = 16  # a query image form has one file part, and perhaps a few fields
MAX_PART_HEAD = 16 * 1024  # the headers of one form part
_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,200})"|([^\s;,"]{1,200}))', re.IGNORECASE)
_PARAM = re.compile(r';\s*([a-z0-9*_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))', re.IGNORECASE)


def _part_headers(head: bytes) -> dict[str, str]:
    """A form part's header lines (lower-cased names; folded lines joined)."""
    out: dict[str, str] = {}
    last = None
    for raw in head.decode("utf-8", "replace").split("\r\n"):
        if raw[:1] in (" ", "\t") and last is not None:
            out[last] += " " + raw.strip()
            continue
        name, sep, value = raw.partition(":")
        if sep:
            last = name.strip().lower()
            out[last] = value.strip()
    return out


def _disposition(value: str) -> tuple[str | None, bool]:
    """(name, whether it is a file) of a form part's Content-Disposition."""
    params = {
        m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
        for m in _PARAM.finditer(value)
    }
    name = params.get("name")
    return name, "filename" in params or "filename*" in params
