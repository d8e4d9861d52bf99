"""Keep a collection in step with a folder of photos, embedding only what is new.

:func:`sync_folder` compares the folder (and an optional captions file) with the collection
already at ``out``: an image whose file (size, mtime; else its bytes, by SHA-256) and
captions are unchanged keeps its embedding; new images are embedded and appended; changed
ones are re-embedded in place; items whose file is gone are removed, and the caller is told
which (nothing disappears without a word). Exact duplicates (copies with the same bytes,
links to a photo of the folder) are one item listing its other paths
(:func:`fold_duplicates`). The collection is rewritten atomically (see
:func:`sparsemm.data.collection.write_collection`), carrying over its ``index`` and caches
when it only grew, so an index can take the new items with
:meth:`~sparsemm.index.InvertedIndex.add` instead of being rebuilt.
"""

from __future__ import annotations

import hashlib
import logging
import zipfile
from collections.abc import Callable, Sequence
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
from sparsemm.io import json_sha256, load_npy

logger = logging.getLogger(__name__)

HASH_BAR_FROM = 500  # photos to hash before a progress bar is shown
CARRIED = ("index", "concepts")  # sub-folders kept when the collection only grows
# Manifest mark of a collection whose photos were embedded upright (EXIF orientation
# applied); in one without it, the photos that carry an orientation tag are embedded again.
ORIENTATION_MARK = "exif"


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
    rewrite: bool = False  # only the manifest or item metadata changed
    folded: int = 0  # duplicate files (same bytes, or links) shown as another item's `also`
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (old id, new id)
    joined: list[str] = field(default_factory=list)  # items now a copy of another item
    norms: dict[str, float] = field(default_factory=dict)  # image key -> pooled norm

    @property
    def grew_only(self) -> bool:
        """Only appended items: an index of the old items stays valid."""
        return (
            not self.changed
            and not self.removed
            and not self.created
            and not self.renamed
            and not self.joined
        )

    @property
    def touched(self) -> bool:
        return bool(
            self.added
            or self.changed
            or self.removed
            or self.created
            or self.rewrite
            or self.renamed
            or self.joined
        )


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


def turned(path: str | Path) -> bool:
    """Whether an image file carries an EXIF orientation other than upright (its header is
    read, no pixels are decoded); False for a file Pillow cannot open."""
    from PIL import Image

    from sparsemm.encoders.hf import exif_orientation

    try:
        with Image.open(path) as img:
            return exif_orientation(img) != 1
    except Exception:  # unreadable: reported where it is decoded
        return False


def _size(item: Item) -> int:
    return int(str(item.get("stamp", "0:0")).split(":")[0])


def _hashes_known(old: Collection | None) -> dict[tuple[str, str], str]:
    """(id, stamp) -> SHA-256 of the files an earlier run hashed (an item's own file and
    its copies), so a re-run reads again only what changed."""
    known: dict[tuple[str, str], str] = {}
    for it in old.items if old is not None else []:
        digest = it.get("sha256")
        if not isinstance(digest, str):
            continue
        known[(str(it["id"]), str(it.get("stamp")))] = digest
        for other, stamp in zip(it.get("also") or [], it.get("also_stamps") or [], strict=False):
            known[(str(other), str(stamp))] = digest
    return known


def fold_duplicates(
    items: list[Item], folder: str | Path, old: Collection | None = None
) -> tuple[list[Item], int]:
    """One item per photo: files of ``items`` (from :func:`read_photos`) that are the same
    file (a symlink to a photo of the folder) or hold the same bytes (same size, then same
    SHA-256) become one item; the others' ids go to its ``also`` list (sorted), their stamps
    to ``also_stamps``, their captions join its own. A file that was hashed (its size is
    another's) records its digest as ``sha256``, so a re-run hashes only what changed.

    The item keeps, in this order of preference: the id it had in ``old`` (a copy added
    later joins the existing item), an id that was one of its ``also`` paths (the first copy
    was deleted), a real file over a symlink, the fewest folders deep, the first in sorted
    order. Empty files are
    never folded. Returns (items in id order, number of paths folded)."""
    root = Path(folder)
    old_ids = {str(it["id"]) for it in old.items} if old is not None else set()
    old_also = {
        str(a) for it in (old.items if old is not None else []) for a in it.get("also") or []
    }
    known = _hashes_known(old)

    by_file: dict[str, list[Item]] = {}
    for it in items:
        by_file.setdefault(str(it["image"]), []).append(it)
    by_size: dict[int, list[list[Item]]] = {}
    for same_file in by_file.values():
        by_size.setdefault(_size(same_file[0]), []).append(same_file)
    groups: list[tuple[list[Item], str | None]] = []
    for size, files in by_size.items():
        if len(files) == 1 or size == 0:
            groups += [(g, None) for g in files]
            continue
        by_digest: dict[str, list[Item]] = {}
        for g in files:
            digest = next(
                (known[k] for m in g if (k := (str(m["id"]), str(m.get("stamp")))) in known),
                None,
            ) or _sha256(g[0]["image"])
            if digest is None:  # unreadable: left to the decoder, which reports it
                groups.append((g, None))
            else:
                by_digest.setdefault(digest, []).extend(g)
        groups += [(g, d) for d, g in by_digest.items()]

    out: list[Item] = []
    folded = 0
    for group, digest in groups:
        if len(group) == 1:  # a file hashed for its size keeps its digest for the next run
            out.append(group[0] if digest is None else {**group[0], "sha256": digest})
            continue
        keep = min(
            group,
            key=lambda m: (
                m["id"] not in old_ids,
                m["id"] not in old_also,
                (root / m["id"]).is_symlink(),
                m["id"].count("/"),  # the copy nearest the top ("IMG_1.jpg", not "backup/...")
                m["id"],
            ),
        )
        others = sorted((m for m in group if m is not keep), key=lambda m: m["id"])
        item = dict(keep)
        item["also"] = [m["id"] for m in others]
        item["also_stamps"] = [m.get("stamp") for m in others]
        if digest is not None:
            item["sha256"] = digest
        captions = list(keep.get("captions") or [])
        for m in others:
            captions += [c for c in m.get("captions") or [] if c not in captions]
            if not item.get("labels") and m.get("labels"):
                item["labels"] = list(m["labels"])
        if captions:
            item["captions"] = captions
        folded += len(others)
        out.append(item)
    out.sort(key=lambda it: it["id"])
    return out, folded


def _sha256(path: str | Path) -> str | None:
    from sparsemm.io import sha256_file

    try:
        return sha256_file(path)
    except OSError:
        return None


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
    before_write: Callable[[Path, list[Item]], None] | None = None,
) -> SyncReport:
    """Bring the collection at ``out`` in step with ``items`` (from :func:`read_photos`).

    ``image_encoder`` embeds images (EfficientNet-Lite0 by default); ``text_encoder`` embeds
    captions, or is a zero-argument callable returning the encoder (built only when
    captions need embedding); ``text_info`` (name, dim, model) is recorded as the
    collection's text encoder, the one query texts are embedded with. Unreadable images
    are left out and reported (SparsemmError when none can be read). ``before_write``:
    called, when a collection is there already, with its folder and the new or changed
    photos just embedded, before the collection takes them (``sparsemm up`` reads their
    concepts then, while the collection still matches its index).
    """
    out = Path(out)
    with collection_lock(out):
        old: Collection | None = None
        if (out / "manifest.json").is_file():
            try:
                old = open_collection(out)
                _check_arrays(old)
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
            items, out, old, image_encoder, text_encoder, text_info, source, batch_size, progress,
            before_write,
        )  # fmt: skip


def _check_arrays(col: Collection) -> None:
    """SparsemmError when a file of ``col`` that a re-run copies from (its embeddings, its
    list of skipped files) does not match its checksum or shape: the collection is then
    encoded again rather than kept, or a later run stopped by it."""
    for name, rows, dim in (
        ("image_emb.npy", len(col.items), col.dim),
        ("text_emb.npy", len(col.texts), col.text_dim if col.has_texts() else 0),
    ):
        if col._lists(name):
            col.check_file(name)
            shape = load_npy(col.root / name, mmap=True).shape
            if shape != (rows, dim):
                raise SparsemmError(f"{name} has shape {shape}, the manifest says ({rows}, {dim})")
    col.skipped()


def _predecessors(items: list[Item], old_items: dict[str, tuple[int, Item]]) -> dict[str, str]:
    """new id -> the old item's id it continues: its own, or, when that item is gone (its
    first copy deleted), the old item that listed one of its paths among its copies."""
    was = {it["id"]: it["id"] for it in items if it["id"] in old_items}
    owner = {a: o for o, (_, it) in old_items.items() for a in it.get("also") or []}
    taken = set(was.values())
    for it in items:
        if it["id"] in was:
            continue
        for path in [it["id"], *(it.get("also") or [])]:
            o = owner.get(path)
            if o is not None and o not in taken:
                was[it["id"]] = o
                taken.add(o)
                break
    return was


def _add_digests(order: list[Item], old: Collection | None, progress: bool = False) -> None:
    """Give every item of ``order`` the SHA-256 of its file (``sha256``): the one an earlier
    run recorded for that file version (:func:`_hashes_known`), else read. A photo's
    recorded evidence is keyed by it, so a moved, renamed or copied photo keeps its reading,
    and a photo whose time stamp alone changed (a copied or restored folder) its
    embedding."""
    from tqdm.auto import tqdm

    known = _hashes_known(old)
    unread = []
    for it in order:
        if it.get("sha256"):
            continue
        digest = known.get((str(it["id"]), str(it.get("stamp"))))
        if digest is not None:
            it["sha256"] = digest
        else:
            unread.append(it)
    # about 250 MB/s: a bar only where it takes a while (a copied or restored folder)
    bar = progress and len(unread) >= HASH_BAR_FROM
    for it in tqdm(unread, desc="checking photo contents", unit="img", disable=not bar):
        if (digest := _sha256(it["image"])) is not None:
            it["sha256"] = digest


def _same_photo(before: Item, after: Item) -> bool:
    """Whether ``after`` (continuing ``before``) keeps its embedding: the same file version
    under the same id, or the same bytes (a copy, a restored or moved file); and the same
    captions."""
    if before["id"] == after["id"] or (
        before.get("image") == after.get("image") and before.get("stamp") == after.get("stamp")
    ):
        if _key(before) == _key(after):
            return True
    digest = before.get("sha256")  # ``after``'s is read by _add_digests (None: unreadable)
    same_bytes = digest is not None and after.get("sha256") == digest
    return same_bytes and tuple(before.get("captions") or ()) == tuple(after.get("captions") or ())


def _named_here(row: dict[str, Any], item: Item) -> dict[str, Any]:
    """A skipped file's row of an earlier run, named where the file is now (in a copied
    folder, the copy's path, in its ``image`` and its error message)."""
    was_at, now_at = str(row.get("image") or ""), str(item.get("image"))
    out = {**row, "image": now_at}
    if was_at:
        out["error"] = str(row.get("error", "")).replace(was_at, now_at)
    return out


def _note_skipped(
    report: SyncReport, skipped: list[dict[str, Any]], incoming: dict[str, Item]
) -> None:
    """Record the images that could not be read in ``report``: each with the file version
    that failed (so a re-run can skip it), out of the added and changed ones."""
    for row in skipped:
        row["stamp"] = incoming[row["id"]].get("stamp")
    report.skipped += skipped
    bad = {s["id"] for s in report.skipped}
    report.added = [i for i in report.added if i not in bad]
    # A changed image that can no longer be read is gone from the collection too.
    report.removed += [i for i in report.changed if i in bad]
    report.changed = [i for i in report.changed if i not in bad]


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
    before_write: Callable[[Path, list[Item]], None] | None = None,
) -> SyncReport:
    old_items = {it["id"]: (i, it) for i, it in enumerate(old.items)} if old else {}
    report = SyncReport(collection=old, created=old is None)  # type: ignore[arg-type]
    items, report.folded = fold_duplicates(items, source, old)
    incoming = {it["id"]: it for it in items}
    was = _predecessors(items, old_items)  # new id -> the old item it continues
    now = {o: n for n, o in was.items()}
    copies = {a for it in items for a in it.get("also") or []}
    report.renamed = [(o, n) for n, o in was.items() if n != o]
    report.joined = [i for i in old_items if i not in now and i in copies]
    report.removed = [i for i in old_items if i not in now and i not in copies]

    # Final order: surviving old items in their order (changed ones re-embedded in place),
    # then the new ones, so an index of the old items is a prefix of the new collection.
    # Files that could not be read last time and are unchanged since are not read again
    # (still reported), so a corrupt photo does not make every run rewrite the collection.
    known_bad = {
        row["id"]: row
        for row in (old.skipped() if old is not None else [])
        if row.get("id") in incoming and row.get("stamp") == incoming[row["id"]].get("stamp")
    }
    report.skipped = [_named_here(row, incoming[row["id"]]) for row in known_bad.values()]
    order: list[Item] = [incoming[now[i]] for i in old_items if i in now]
    order += [it for it in items if it["id"] not in was and it["id"] not in known_bad]
    # A collection embedded before photos were read upright: those with an orientation tag
    # are embedded again (the others' pixels read the same either way).
    sideways: set[str] = set()
    if old is not None and old.manifest.get("orientation") != ORIENTATION_MARK:
        report.rewrite = True  # the mark is recorded even when no photo needs it
        sideways = {it["id"] for it in order if it["id"] in was and turned(it["image"])}
        if sideways:
            logger.info("embedding %d photos with an EXIF orientation again", len(sideways))
    _add_digests(order, old, progress)
    todo = [
        pos
        for pos, it in enumerate(order)
        if it["id"] not in was
        or not _same_photo(old_items[was[it["id"]]][1], it)
        or it["id"] in sideways
    ]
    for pos in todo:
        (report.changed if order[pos]["id"] in was else report.added).append(order[pos]["id"])
    report.unchanged = len(order) - len(todo)
    todo_set = set(todo)
    # an item whose copies or paths changed keeps its embedding; its metadata is rewritten
    report.rewrite = report.rewrite or any(
        old_items[was[it["id"]]][1] != it for pos, it in enumerate(order) if pos not in todo_set
    )
    if not report.touched:
        logger.info("%s is up to date with %s (%d images)", out, source, len(order))
        return report

    old_rows = {n: old_items[o][0] for n, o in was.items()}
    partial = partial_path(out)
    emb, ok, skipped, report.norms = _embed_images(
        order, todo, old, old_rows, image_encoder, batch_size, progress, partial
    )
    _note_skipped(report, skipped, incoming)
    kept = [it for it, good in zip(order, ok, strict=True) if good]
    emb = emb[ok]
    if not kept:
        raise SparsemmError(f"none of the images under {source} could be read")

    fresh = set(report.added + report.changed)
    texts, text_emb = _texts(kept, old, old_rows, fresh, text_encoder, text_info)
    if before_write is not None and old is not None:
        before_write(old.root, [it for it in kept if it["id"] in fresh])
    manifest_extra = {
        "image_kind": "pixels",
        "orientation": ORIENTATION_MARK,
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
    partial.unlink(missing_ok=True)  # all in the collection now
    return report


# Images embedded between two saves of the partial embeddings, so a run stopped while
# embedding a large folder resumes where it was. Each save rewrites the file, so they are
# spaced by a quarter of what it holds once that is more: the writes stay a few times the
# embeddings' size (a stop loses at most a fifth of them) rather than growing as n^2.
PARTIAL_EVERY = 256
PARTIAL_FORMAT = "sparsemm.partial-embeddings-1"


def partial_path(out: Path) -> Path:
    """Where a sync of the collection ``out`` keeps the embeddings of an unfinished run
    (beside the collection, which is swapped whole when written)."""
    return out.parent / f".{out.name}.partial.npz"


def _partial_source(encoder: Any) -> str:
    return json_sha256([PARTIAL_FORMAT, encoder_info(encoder)])


def _load_partial(path: Path, encoder: Any) -> dict[str, tuple[np.ndarray, float]]:
    """image key -> (embedding, pooled norm) embedded by an earlier run that stopped; empty
    when there is none, or it is damaged or from another encoder (then embedded again)."""
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as z:
            keys, emb, norms = z["keys"], z["emb"], z["norms"]
            source, digest = str(z["source"]), str(z["sha256"])
        n, dim = len(keys), int(encoder.dim)
        if (
            source != _partial_source(encoder)
            or emb.dtype != np.float32
            or emb.shape != (n, dim)
            or norms.shape != (n,)
            or digest != _partial_digest(keys, emb, norms)
        ):
            raise ValueError("written for another encoder, or damaged")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        logger.warning("%s is unusable (%s); those photos are embedded again", path, exc)
        return {}
    return {str(k): (emb[i], float(norms[i])) for i, k in enumerate(keys.tolist())}


def _partial_digest(keys: np.ndarray, emb: np.ndarray, norms: np.ndarray) -> str:
    h = hashlib.sha256()
    for arr in (keys, emb, norms):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _save_partial(path: Path, done: dict[str, tuple[np.ndarray, float]], encoder: Any) -> None:
    """Record ``done`` at ``path`` (atomic); a failure to write only costs the resume."""
    from sparsemm.io import atomic_open

    keys = np.array(list(done), dtype=str)
    dim = int(encoder.dim)
    rows = [e for e, _ in done.values()]
    emb = np.stack(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32)
    norms = np.array([v for _, v in done.values()], dtype=np.float64)
    try:
        with atomic_open(path) as fh:
            np.savez(
                fh,
                keys=keys,
                emb=emb,
                norms=norms,
                source=np.array(_partial_source(encoder)),
                sha256=np.array(_partial_digest(keys, emb, norms)),
            )
    except OSError as exc:
        logger.warning("could not record the embeddings so far in %s (%s)", path, exc)


def _embed_images(
    order: list[Item],
    todo: list[int],
    old: Collection | None,
    old_rows: dict[str, int],
    image_encoder: Any,
    batch_size: int,
    progress: bool,
    partial: Path | None = None,
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]], dict[str, float]]:
    """(embeddings (len(order), dim) float32, readable (len(order),) bool, skipped rows, the
    new embeddings' pooled norms by image key): the items at positions ``todo`` embedded
    now, leaving out files that cannot be read; every other item's embedding copied from
    ``old`` (its row there is ``old_rows[id]``). With ``partial``, the embeddings of a run
    that stopped midway are read from that file instead of embedded again, and it records
    the new ones every :data:`PARTIAL_EVERY` images or more."""
    old_emb = old.image_embeddings() if old is not None else None
    emb = np.zeros((len(order), int(image_encoder.dim)), dtype=np.float32)
    todo_set = set(todo)
    for pos, it in enumerate(order):
        if pos not in todo_set and old_emb is not None:
            emb[pos] = old_emb[old_rows[it["id"]]]
    ok = np.ones(len(order), dtype=bool)
    recorder = NormRecordingEncoder(image_encoder)
    skipped: list[dict[str, Any]] = []
    done = _load_partial(partial, image_encoder) if partial is not None else {}
    keys = {pos: _key_or_none(order[pos]["image"]) for pos in todo}
    rest = []
    for pos in todo:
        hit = done.get(keys[pos] or "")
        if hit is None:
            rest.append(pos)
        else:
            emb[pos] = hit[0]
            recorder.norms[str(keys[pos])] = hit[1]
    if len(rest) < len(todo):
        logger.info("%d photos embedded by a run that stopped are reused", len(todo) - len(rest))
    step = PARTIAL_EVERY if partial is not None else max(len(rest), 1)
    saved = len(done)  # entries in the file now
    for at in range(0, len(rest), step):
        part = rest[at : at + step]
        new_emb, good, bad = encode_images_skipping(
            recorder,
            [order[p]["image"] for p in part],
            [order[p]["id"] for p in part],
            batch_size=batch_size,
            progress=progress,
            require_one=False,
        )
        emb[part] = new_emb
        ok[part] = good
        skipped += bad
        if partial is None or at + step >= len(rest):
            continue  # the collection is written next
        for p, row, fine in zip(part, new_emb, good, strict=True):
            key = keys[p]
            if fine and key is not None and key in recorder.norms:
                done[key] = (row, recorder.norms[key])
        if len(done) - saved >= max(PARTIAL_EVERY, saved // 4):
            _save_partial(partial, done, image_encoder)
            saved = len(done)
    # new files that all fail are skipped when the collection keeps other photos
    if todo and len(todo) == len(order) and not ok[todo].any():
        raise SparsemmError(
            f"none of the {len(todo)} images could be embedded (first error: "
            f"{skipped[0]['error'] if skipped else 'unknown'}); check the source"
        )
    return emb, ok, skipped, recorder.norms


def _key_or_none(path: Any) -> str | None:
    try:
        return image_key(path)
    except SparsemmError:
        return None


def _texts(
    kept: list[Item],
    old: Collection | None,
    old_row: dict[str, int],
    fresh: set[str],
    text_encoder: Any,
    text_info: dict[str, Any],
) -> tuple[list[dict[str, Any]] | None, np.ndarray | None]:
    """Caption rows + embeddings of ``kept``: reused for unchanged items (``old_row``: an
    item id's row in ``old``, when the old collection's text encoder is ``text_info``),
    embedded for ``fresh`` ones."""
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
        prior = old_rows.get(old_row[it["id"]], []) if it["id"] in old_row else []
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
