"""Readers that turn a data source into a list of item dicts.

Every item has a unique string ``id`` and, as the source provides them, ``captions``
(list[str]), ``image`` (a file path string), ``labels`` (list[str]) and ``split``. Rows of a
JSONL/CSV file that share an id are merged into one item (their captions concatenated), so
both "one row per image" and "one row per caption" files work.
"""

from __future__ import annotations

import csv
import io
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError
from sparsemm.io import loads, read_text_utf8, resolve_path

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp"})
# Image formats an image folder may hold that are not read (camera raw, HEIC, TIFF, ...):
# reported, so photos do not silently go missing from a collection.
UNREAD_IMAGE_EXTENSIONS = frozenset(
    {".heic", ".heif", ".avif", ".tif", ".tiff", ".jp2", ".jxl", ".svg", ".psd", ".ico"}
    | {".raw", ".dng", ".cr2", ".cr3", ".nef", ".arw", ".orf", ".rw2"}
)
FORMATS = ("coco", "jsonl", "csv", "images")

Item = dict[str, Any]


def guess_format(path: str | Path) -> str:
    """``coco`` for .json, ``jsonl`` for .jsonl/.ndjson, ``csv`` for .csv, ``images`` for dirs."""
    path = Path(path).expanduser()
    if path.is_dir():
        return "images"
    suffix = path.suffix.lower()
    guessed = {".json": "coco", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}.get(suffix)
    if guessed is None:
        raise SparsemmError(
            f"cannot tell the format of {path} from its extension; pass --format "
            f"({'|'.join(FORMATS)})"
        )
    return guessed


def read_items(
    path: str | Path,
    format: str | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> list[Item]:
    """Read any supported source; ``split`` keeps items of that split, ``limit`` the first N."""
    fmt = format or guess_format(path)
    if fmt == "coco":
        return read_coco(path, split=split, limit=limit)
    readers = {
        "jsonl": read_captions_jsonl,
        "csv": read_captions_csv,
        "images": read_image_folder,
    }
    if fmt not in readers:
        raise SparsemmError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    return select(readers[fmt](path), split=split, limit=limit)


def select(items: list[Item], split: str | None = None, limit: int | None = None) -> list[Item]:
    """Items of ``split`` (if given), then the first ``limit`` (if given)."""
    if split is not None:
        kept = [it for it in items if it.get("split") == split]
        if not kept:
            found = sorted({str(it.get("split")) for it in items if it.get("split") is not None})
            raise SparsemmError(
                f"no items in split {split!r}; splits present: {', '.join(found) or 'none'}"
            )
        items = kept
    if limit is not None:
        if limit < 1:
            raise SparsemmError(f"--limit must be a positive number, got {limit}")
        items = items[:limit]
    return items


def _require_file(path: str | Path) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    return path


# -- COCO --------------------------------------------------------------------------------


def read_coco(
    path: str | Path,
    split: str | None = None,
    limit: int | None = None,
    image_root: str | Path | None = None,
) -> list[Item]:
    """Read the COCO metadata json ``{image_id: {file_name, split, labels, captions}}``.

    Ids are the image ids (as strings); ``split``/``labels``/``file_name`` are kept. With
    ``image_root`` (the folder of the COCO image files) each item also gets ``image``.
    """
    path = _require_file(path)
    data = loads(read_text_utf8(path, bom=True), path)
    if not isinstance(data, dict):
        raise SparsemmError(
            f"{path}: expected a JSON object {{image_id: {{file_name, split, labels, "
            "captions}}}}; for a list of rows use a .jsonl file"
        )
    items: list[Item] = []
    for image_id, rec in data.items():
        where = f"{path}: image {image_id}"
        if not isinstance(rec, dict):
            raise SparsemmError(f"{where}: expected an object with captions/labels/split")
        item: Item = {"id": str(image_id)}
        item["captions"] = _str_list(rec.get("captions", []), where, "captions")
        if "labels" in rec:
            item["labels"] = _str_list(rec["labels"], where, "labels")
        if rec.get("split") is not None:
            item["split"] = str(rec["split"])
        if rec.get("file_name"):
            item["file_name"] = str(rec["file_name"])
            if image_root is not None:
                item["image"] = str(Path(image_root).expanduser() / str(rec["file_name"]))
        if not item["captions"] and "image" not in item:
            raise SparsemmError(f"{where}: has no captions (and no image_root was given)")
        items.append(item)
    if not items:
        raise SparsemmError(f"{path} holds no images")
    return select(items, split=split, limit=limit)


# -- JSONL / CSV captions -----------------------------------------------------------------


def _str_list(value: Any, where: str, key: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise SparsemmError(f"{where}: {key!r} must be a string or a list of strings")
    return [str(v) for v in value]


def _split_field(value: str, where: str, key: str) -> list[str]:
    """A CSV cell holding a JSON list or ``|``-separated values."""
    value = value.strip()
    if not value:
        return []
    if value.startswith("["):
        return _str_list(loads(value, f"{where}: {key!r} is not a valid JSON list:"), where, key)
    return [v.strip() for v in value.split("|") if v.strip()]


# Characters in one caption or id: a caption is a sentence or a paragraph; a 16 MB one once
# took 2.7 GB to encode.
MAX_TEXT_CHARS = 10_000


def _check_text(text: str, where: str) -> None:
    """SparsemmError for an over-long caption or id, or one holding a lone surrogate
    (a ``\\ud800`` escape, which is no character and no text encoder reads)."""
    if len(text) > MAX_TEXT_CHARS:
        raise SparsemmError(
            f"{where}: a caption or id of {len(text):,} characters; the limit is "
            f"{MAX_TEXT_CHARS:,} (split long text into several captions)"
        )
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        raise SparsemmError(f"{where}: a lone surrogate escape (\\ud800-\\udfff) is no text")


class _Merger:
    """Collects rows into items, merging rows that share an id (captions appended)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.base = path.parent
        self.items: dict[str, Item] = {}

    def add(self, row: dict[str, Any], lineno: int, csv_cells: bool) -> None:
        where = f"{self.path}:{lineno}"
        raw_id = row.get("id")
        if raw_id is None or (isinstance(raw_id, str) and not raw_id.strip()):
            image = row.get("image")
            if not isinstance(image, str) or not image.strip():
                raise SparsemmError(f"{where}: missing 'id' (or an 'image' path to name it)")
            raw_id = image.strip()  # a row may name its item by its image path alone
        if not isinstance(raw_id, str | int):
            raise SparsemmError(f"{where}: 'id' must be a string or an integer")
        item_id = str(raw_id).strip()

        captions: list[str] = []
        for key in ("caption", "text"):
            value = row.get(key)
            if value is not None and value != "":
                if not isinstance(value, str):
                    raise SparsemmError(f"{where}: {key!r} must be a string")
                captions.append(value)
        if row.get("captions") not in (None, ""):
            value = row["captions"]
            captions += (
                _split_field(value, where, "captions")
                if csv_cells and isinstance(value, str)
                else _str_list(value, where, "captions")
            )
        captions = [c for c in (c.strip() for c in captions) if c]
        for text in [item_id, *captions]:
            _check_text(text, where)

        fields: Item = {}
        image = row.get("image")
        if image not in (None, ""):
            if not isinstance(image, str):
                raise SparsemmError(f"{where}: 'image' must be a file path string")
            img = Path(image).expanduser()
            fields["image"] = str(img if img.is_absolute() else resolve_path(self.base / img))
        labels = row.get("labels")
        if labels not in (None, ""):
            fields["labels"] = (
                _split_field(labels, where, "labels")
                if csv_cells and isinstance(labels, str)
                else _str_list(labels, where, "labels")
            )
        split = row.get("split")
        if split not in (None, ""):
            fields["split"] = str(split).strip()
        if not captions and "image" not in fields and item_id not in self.items:
            raise SparsemmError(
                f"{where}: item {item_id!r} has neither a caption (caption/captions/text) "
                "nor an image"
            )

        item = self.items.get(item_id)
        if item is None:
            self.items[item_id] = {"id": item_id, "captions": captions, **fields}
            return
        item["captions"].extend(captions)
        for key, value in fields.items():
            if key in item and item[key] != value:
                raise SparsemmError(
                    f"{where}: item {item_id!r} has {key} {value!r} here but "
                    f"{item[key]!r} on an earlier row; rows of one id must agree"
                )
            item[key] = value

    def result(self) -> list[Item]:
        if not self.items:
            raise SparsemmError(f"{self.path} holds no items")
        items = list(self.items.values())
        for item in items:
            if not item["captions"]:
                del item["captions"]
        return items


def read_captions_jsonl(path: str | Path) -> list[Item]:
    """Read a JSONL file, one object per line: ``id`` (or ``image`` alone),
    ``caption``/``captions``/``text``,
    optional ``image`` (relative to the file's folder), ``labels`` (list), ``split``."""
    path = _require_file(path)
    merger = _Merger(path)
    # a byte-order mark is accepted, as in a CSV (editors on Windows write one)
    for lineno, line in enumerate(read_text_utf8(path, bom=True).split("\n"), 1):
        if not line.strip():
            continue
        row = loads(line, f"{path}:{lineno}")
        if not isinstance(row, dict):
            raise SparsemmError(f"{path}:{lineno}: expected a JSON object per line")
        merger.add(row, lineno, csv_cells=False)
    return merger.result()


def read_captions_csv(path: str | Path) -> list[Item]:
    """Read a CSV with a header: ``id`` (or ``image`` alone), ``caption``/``captions``/``text``,
    optional ``image``, ``labels`` (JSON list or ``|``-separated), ``split``. ``captions``
    cells may hold a JSON list or ``|``-separated captions."""
    path = _require_file(path)
    merger = _Merger(path)
    with io.StringIO(read_text_utf8(path, bom=True), newline="") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in (reader.fieldnames or [])]
        if not {"id", "image"} & set(header) or not (
            {"caption", "captions", "text", "image"} & set(header)
        ):
            raise SparsemmError(
                f"{path}:1: the header needs an 'id' (or 'image') column and a 'caption', "
                f"'captions', 'text' or 'image' column (found: {', '.join(header) or 'nothing'})"
            )
        reader.fieldnames = header
        try:
            for row in reader:
                if None in row:
                    raise SparsemmError(
                        f"{path}:{reader.line_num}: more cells than header columns "
                        "(quote cells that contain commas)"
                    )
                if not any((v or "").strip() for v in row.values()):
                    continue
                merger.add(dict(row), reader.line_num, csv_cells=True)
        except csv.Error as exc:
            raise SparsemmError(f"{path}:{reader.line_num}: malformed CSV ({exc})") from exc
    return merger.result()


# -- image folders ------------------------------------------------------------------------


def image_key(path: str | Path) -> str:
    """What identifies one version of an image file: its resolved path, size and mtime."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise SparsemmError(
            f"image {p} of the collection cannot be read ({exc.strerror or exc}); re-encode "
            "the collection (sparsemm up / sparsemm encode)"
        ) from exc
    return f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def text_name(name: str) -> str:
    """A file name as text that is valid UTF-8 (an item id, a label): bytes of the name that
    are not UTF-8 (``caf\\xe9.png`` from a Latin-1 system) are written ``\\xe9``; the file
    itself is still opened by its real name (the item's ``image``)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def read_image_folder(path: str | Path) -> list[Item]:
    """Every image under ``path`` (recursive; hidden files/folders skipped), sorted.

    id = the path relative to ``path`` (POSIX separators, :func:`text_name`); ``labels`` =
    [parent folder name]
    for images in sub-folders (the ImageFolder convention).
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise SparsemmError(f"image folder not found: {root}")
    items: list[Item] = []
    unread: Counter[str] = Counter()
    for file in sorted(root.rglob("*")):
        rel = file.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        suffix = file.suffix.lower()
        if suffix in UNREAD_IMAGE_EXTENSIONS and file.is_file():
            unread[suffix] += 1
        if suffix not in IMAGE_EXTENSIONS or not file.is_file():
            continue
        item: Item = {"id": text_name(rel.as_posix()), "image": str(resolve_path(file))}
        if len(rel.parts) > 1:
            item["labels"] = [text_name(rel.parent.name)]
        items.append(item)
    found = ", ".join(f"{n} {ext}" for ext, n in sorted(unread.items()))
    if not items:
        raise SparsemmError(
            f"no images under {root} (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}"
            + (f"; found only formats sparsemm does not read: {found}" if found else "")
            + ")"
        )
    if unread:
        logger.warning(
            "left out %d file(s) under %s in formats sparsemm does not read (%s); convert "
            "them to JPEG or PNG to include them",
            sum(unread.values()),
            root,
            found,
        )
    return items
