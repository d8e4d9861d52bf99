"""Keep a collection in step with a folder of photos, embedding only what is new.

:func:`sync_folder` compares the folder (and an optional captions file) with the collection
already at ``out``: an image whose file (size, mtime) and captions are unchanged keeps its
embedding; new images are embedded and appended; changed ones are re-embedded in place;
items whose file is gone are removed, and the caller is told which (nothing disappears
without a word). The collection is rewritten atomically (see
:func:`sparsemm.data.collection.write_collection`), carrying over its ``index`` and caches
when it only grew, so an index can take the new items with
:meth:`~sparsemm.index.InvertedIndex.add` instead of being rebuilt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.data.collection import (
    UP_SOURCE_KIND,
    Collection,
    collection_lock,
    open_collection,
    write_collection,
)
from sparsemm.data.encode import encode_images_skipping, encoder_info
from sparsemm.data.sources import Item, image_key, read_image_folder, read_items
from sparsemm.encoders.base import l2_normalize
from sparsemm.errors import SparsemmError

logger = logging.getLogger(__name__)

CARRIED = ("index", "concepts")  # sub-folders kept when the collection only grows


@dataclass
class SyncReport:
    """What :func:`sync_folder` did; ids are the items' folder-relative paths."""

    collection: Collection
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # unreadable images
    unchanged: int = 0
    created: bool = False  # there was no collection before
    norms: dict[str, float] = field(default_factory=dict)  # image key -> pooled norm

    @property
    def grew_only(self) -> bool:
        """Only appended items: an index of the old items stays valid."""
        return not self.changed and not self.removed and not self.created

    @property
    def touched(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.created)


def file_stamp(path: str | Path) -> str:
    """``"size:mtime_ns"`` of a file: changes when the photo is replaced or edited."""
    st = Path(path).stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def attach_captions(items: list[Item], captions_file: str | Path, folder: Path) -> int:
    """Add the captions of ``captions_file`` (JSONL or CSV, see :mod:`sparsemm.data.sources`)
    to the folder's items; a row matches an item by its ``image`` path, its id (the path
    relative to the folder), the file name or the name without extension. Returns the
    number of items captioned; rows naming no image of the folder are reported, not fatal."""
    rows = read_items(captions_file)
    by_path = {str(Path(it["image"]).resolve()): it for it in items}
    by_id = {it["id"]: it for it in items}
    by_name: dict[str, Item | None] = {}
    for it in items:
        # file name and bare stem ("IMG_001.jpg", "IMG_001"); ambiguous ones match nothing
        for name in {Path(it["id"]).name, Path(it["id"]).stem}:
            by_name[name] = None if name in by_name else it
    unmatched: list[str] = []
    captioned = 0
    for row in rows:
        target = None
        if row.get("image"):
            target = by_path.get(str(Path(row["image"]).resolve()))
        target = target or by_id.get(row["id"]) or by_name.get(Path(row["id"]).name)
        if target is None:
            unmatched.append(row["id"])
            continue
        caps = list(row.get("captions") or [])
        if caps:
            target.setdefault("captions", []).extend(caps)
            captioned += 1
        if row.get("labels"):
            target["labels"] = list(row["labels"])
    if unmatched:
        logger.warning(
            "%d caption row(s) of %s name no image in %s, e.g. %s; they are left out",
            len(unmatched),
            captions_file,
            folder,
            ", ".join(unmatched[:3]),
        )
    return captioned


def read_photos(folder: str | Path, captions: str | Path | None = None) -> list[Item]:
    """The images under ``folder`` (see :func:`~sparsemm.data.sources.read_image_folder`)
    with their file stamps and, when given, their captions."""
    root = Path(folder).expanduser()
    if not root.exists():
        raise SparsemmError(f"photo folder not found: {root}")
    if not root.is_dir():
        raise SparsemmError(f"{root} is not a folder; give the folder that holds the photos")
    items = read_image_folder(root)
    for it in items:
        it["stamp"] = file_stamp(it["image"])
        # a folder of photos is sorted by whatever its owner chose ("2024 holiday/"): its
        # sub-folder names are no labels of what a photo shows (ImageFolder's convention
        # fits labelled datasets, `sparsemm encode`); labels come from a captions file
        it.pop("labels", None)
    if captions is not None:
        n = attach_captions(items, captions, root)
        logger.info("captions for %d of %d images from %s", n, len(items), captions)
    return items


class NormRecordingEncoder:
    """Wraps an image encoder: gives the L2-normalised embeddings it is asked for and keeps
    each image file's un-normalised norm (what the concept model's classifier needs), so
    the backbone runs once per image."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.modalities = ("image",)
        self.model_id = getattr(inner, "model_id", None)
        self.norms: dict[str, float] = {}

    def encode_image(
        self,
        images: Sequence[Any],
        batch_size: int = 32,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        raw = np.asarray(
            self.inner.encode_image(images, batch_size=batch_size, normalize=False), np.float32
        )
        for img, row in zip(images, raw, strict=True):
            if isinstance(img, str | Path) and np.isfinite(row).all():
                self.norms[image_key(img)] = float(np.linalg.norm(row))
        return l2_normalize(raw) if normalize else raw


def _key(item: Item) -> tuple[str, tuple[str, ...]]:
    return str(item.get("stamp")), tuple(item.get("captions") or ())


def sync_folder(
    items: list[Item],
    out: str | Path,
    image_encoder: Any,
    text_encoder: Any,
    text_info: dict[str, Any],
    source: str | Path,
    batch_size: int = 32,
    progress: bool = True,
) -> SyncReport:
    """Bring the collection at ``out`` in step with ``items`` (from :func:`read_photos`).

    ``image_encoder`` embeds images (EfficientNet-Lite0 by default); ``text_encoder`` embeds
    captions, or is a zero-argument callable returning the encoder (built only when
    captions need embedding); ``text_info`` (name, dim, model) is recorded as the
    collection's text encoder, the one query texts are embedded with. Unreadable images
    are left out and reported (SparsemmError when none can be read).
    """
    out = Path(out)
    with collection_lock(out):
        old: Collection | None = None
        if (out / "manifest.json").is_file():
            try:
                old = open_collection(out)
                if old.encoder_name != image_encoder.name or old.dim != int(image_encoder.dim):
                    logger.warning(
                        "%s was encoded with %s; re-encoding every image with %s",
                        out,
                        old.encoder_name,
                        image_encoder.name,
                    )
                    old = None
            except SparsemmError as exc:
                logger.warning("the collection at %s is unusable (%s); re-encoding", out, exc)
                old = None
        return _sync(
            items, out, old, image_encoder, text_encoder, text_info, source, batch_size, progress
        )


def _sync(
    items: list[Item],
    out: Path,
    old: Collection | None,
    image_encoder: Any,
    text_encoder: Any,
    text_info: dict[str, Any],
    source: str | Path,
    batch_size: int,
    progress: bool,
) -> SyncReport:
    old_items = {it["id"]: (i, it) for i, it in enumerate(old.items)} if old else {}
    new_ids = {it["id"] for it in items}
    report = SyncReport(collection=old, created=old is None)  # type: ignore[arg-type]
    report.removed = [i for i in old_items if i not in new_ids]

    # Final order: surviving old items in their order (changed ones re-embedded in place),
    # then the new ones, so an index of the old items is a prefix of the new collection.
    incoming = {it["id"]: it for it in items}
    # Files that could not be read last time and are unchanged since are not read again
    # (still reported), so a corrupt photo does not make every run rewrite the collection.
    known_bad = {
        row["id"]: row
        for row in (old.skipped() if old is not None else [])
        if row.get("id") in incoming and row.get("stamp") == incoming[row["id"]].get("stamp")
    }
    report.skipped = list(known_bad.values())
    order: list[Item] = [incoming[i] for i in old_items if i in incoming]
    order += [it for it in items if it["id"] not in old_items and it["id"] not in known_bad]
    todo = [
        pos
        for pos, it in enumerate(order)
        if it["id"] not in old_items or _key(old_items[it["id"]][1]) != _key(it)
    ]
    for pos in todo:
        (report.changed if order[pos]["id"] in old_items else report.added).append(order[pos]["id"])
    report.unchanged = len(order) - len(todo)
    if not report.touched:
        logger.info("%s is up to date with %s (%d images)", out, source, len(order))
        return report

    old_emb = old.image_embeddings() if old is not None else None
    emb = np.zeros((len(order), int(image_encoder.dim)), dtype=np.float32)
    todo_set = set(todo)
    for pos, it in enumerate(order):
        if pos not in todo_set and old_emb is not None:
            emb[pos] = old_emb[old_items[it["id"]][0]]
    ok = np.ones(len(order), dtype=bool)
    recorder = NormRecordingEncoder(image_encoder)
    if todo:
        new_emb, good, skipped = encode_images_skipping(
            recorder,
            [order[p]["image"] for p in todo],
            [order[p]["id"] for p in todo],
            batch_size=batch_size,
            progress=progress,
        )
        for row in skipped:  # the file version that failed, so a re-run can skip it
            row["stamp"] = incoming[row["id"]].get("stamp")
        report.skipped += skipped
        emb[todo] = new_emb
        ok[todo] = good
        report.norms = recorder.norms
    bad = {s["id"] for s in report.skipped}
    report.added = [i for i in report.added if i not in bad]
    # A changed image that can no longer be read is gone from the collection too.
    report.removed += [i for i in report.changed if i in bad]
    report.changed = [i for i in report.changed if i not in bad]
    kept = [it for it, good in zip(order, ok, strict=True) if good]
    emb = emb[ok]
    if not kept:
        raise SparsemmError(f"none of the images under {source} could be read")

    texts, text_emb = _texts(
        kept, old, old_items, set(report.added + report.changed), text_encoder, text_info
    )
    manifest_extra = {
        "image_kind": "pixels",
        "source": {"path": str(Path(source).resolve()), "kind": UP_SOURCE_KIND},
    }
    report.collection = write_collection(
        out,
        kept,
        encoder_info(image_encoder),
        image_emb=emb,
        text_emb=text_emb,
        texts=texts,
        extra=manifest_extra,
        text_encoder=text_info,
        skipped=report.skipped,
        keep=CARRIED if report.grew_only else ("concepts",),
    )
    return report


def _texts(
    kept: list[Item],
    old: Collection | None,
    old_items: dict[str, tuple[int, Item]],
    fresh: set[str],
    text_encoder: Any,
    text_info: dict[str, Any],
) -> tuple[list[dict[str, Any]] | None, np.ndarray | None]:
    """Caption rows + embeddings of ``kept``: reused for unchanged items (when the old
    collection's text encoder is ``text_info``), embedded for ``fresh`` ones."""
    old_rows: dict[int, list[int]] = {}
    old_text_emb = None
    if old is not None and old.texts and old.manifest.get("text_encoder") == text_info:
        old_text_emb = old.text_embeddings()
        for j, t in enumerate(old.texts):
            old_rows.setdefault(int(t["item"]), []).append(j)
    texts: list[dict[str, Any]] = []
    reuse: list[int] = []  # old text row, or -1 for a caption to embed
    for idx, it in enumerate(kept):
        caps = list(it.get("captions") or [])
        prior = old_rows.get(old_items[it["id"]][0], []) if it["id"] in old_items else []
        same = it["id"] not in fresh and len(prior) == len(caps)
        for c_i, caption in enumerate(caps):
            texts.append({"item": idx, "text": caption})
            reuse.append(prior[c_i] if same else -1)
    if not texts:
        return None, None
    text_emb = np.zeros((len(texts), int(text_info["dim"])), dtype=np.float32)
    for i, r in enumerate(reuse):
        if r >= 0 and old_text_emb is not None:
            text_emb[i] = old_text_emb[r]
    need = [i for i, r in enumerate(reuse) if r < 0]
    if need:
        enc = text_encoder() if callable(text_encoder) else text_encoder
        if encoder_info(enc) != text_info:
            raise SparsemmError(f"the text encoder is {encoder_info(enc)}, not {text_info}")
        logger.info("embedding %d captions with %s", len(need), enc.name)
        text_emb[need] = enc.encode_text(
            [texts[i]["text"] for i in need], normalize=True, progress=False
        )
    return texts, text_emb
