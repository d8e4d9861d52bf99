"""A collection on disk: a folder of dense embeddings plus item metadata.

Layout (format version 1)::

    manifest.json   format, version, encoder {name, dim}, counts, file checksums
    items.jsonl     one row per item: {"id", "captions"?, "image"?, "labels"?, "split"?, ...}
    image_emb.npy   (n_items, d) float32, row i = item i (an image, or an image *view*)
    text_emb.npy    (n_texts, d) float32, row j = texts.jsonl row j
    texts.jsonl     one row per text: {"item": item index, "text": str}
    skipped.jsonl   optional: source items left out, {"id", "image", "error"} (bad images)

The folder is written under a temporary name and swapped in, so a crash never leaves a
half-written collection where a good one stood; a lock file (``.<name>.lock`` beside the
folder, see :func:`sparsemm.io.exclusive_lock`) refuses a second writer, and temp folders
left by a killed writer are removed by the next one. Readers check the sha256 of every
file they read against the manifest (the arrays when loaded fully, not memory-mapped), the
arrays' shapes and finiteness, and the format version.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.io import (  # sha256_file: re-exported
    exclusive_lock,
    find_dir,
    load_npy,
    lock_path,
    read_json,
    read_jsonl,
    replace_dir,
    resolve_path,
    save_npy,
    sha256_file,
    write_error,
    write_json,
    write_jsonl,
)
from sparsemm.linalg import check_embeddings

logger = logging.getLogger(__name__)

FORMAT = "sparsemm.collection"
VERSION = 1  # the format this sparsemm writes
MIN_VERSION = 1  # the oldest format it still reads
SKIPPED = "skipped.jsonl"
# manifest["source"]["kind"] of a collection `sparsemm up` keeps for a photo folder
UP_SOURCE_KIND = "photo folder (sparsemm up)"
UP_DIR_NAME = ".sparsemm"  # where `sparsemm up PHOTOS` writes, inside PHOTOS
UP_LOCK = "up.lock"  # in up's folder, held by a running `sparsemm up` for the whole run


@dataclass
class Collection:
    """An opened collection folder (see module docstring)."""

    root: Path
    manifest: dict[str, Any]
    items: list[dict[str, Any]]
    texts: list[dict[str, Any]] = field(default_factory=list)
    _verified: set[str] = field(default_factory=set, repr=False)

    @property
    def ids(self) -> list[str]:
        return [str(it["id"]) for it in self.items]

    @property
    def encoder_name(self) -> str:
        return str(self.manifest["encoder"]["name"])

    @property
    def dim(self) -> int:
        """Dimension of the image embeddings (and of the texts, with one shared encoder)."""
        return int(self.manifest["encoder"]["dim"])

    @property
    def text_encoder_name(self) -> str:
        """The encoder of the texts: ``text_encoder`` when the modalities use two backbones."""
        return str(self.manifest.get("text_encoder", self.manifest["encoder"])["name"])

    @property
    def text_dim(self) -> int:
        return int(self.manifest.get("text_encoder", self.manifest["encoder"])["dim"])

    @functools.cached_property
    def photos_moved(self) -> tuple[Path, Path] | None:
        """(the photo folder `sparsemm up` read, the folder holding the collection now) when
        they differ: see :func:`moved_photos`."""
        return moved_photos(self.root, self.manifest)

    def image_file(self, row: int) -> Path | None:
        """Where the image of item ``row`` is now (None: it has none; see
        :func:`image_file`): its own file, or when that was deleted, a copy of it still in
        the folder (its ``also`` paths)."""
        return photo_file(self.items[row], self.root, self.manifest, self.photos_moved)

    def up_args(self) -> str | None:
        """The `sparsemm up` arguments that made this collection (:func:`up_args`)."""
        return up_args(self.root, self.manifest)

    def stale(self, rows: Sequence[int]) -> dict[int, str]:
        """Of the photos of ``rows``, those no longer as `sparsemm up` read them: "gone" (no
        file at its path, nor a copy of it at one of its ``also`` paths) or "changed" (a file
        of another size there: replaced or edited). Only a photo folder's items are checked
        (they carry a file stamp, ``"size:mtime_ns"``); a file whose time alone changed (a
        copied folder) is not."""
        out: dict[int, str] = {}
        for row in rows:
            stamp = self.items[row].get("stamp")
            path = self._recorded_file(row) if stamp else None
            if path is None:
                continue
            try:
                size = path.stat().st_size
            except OSError:  # its own file was deleted: gone unless a copy of it is there
                copy = self.image_file(row)
                if copy is None or not copy.exists():
                    out[row] = "gone"
                continue
            if str(size) != str(stamp).split(":")[0]:
                out[row] = "changed"
        return out

    def _recorded_file(self, row: int) -> Path | None:
        ref = self.items[row].get("image")
        return image_file(str(ref), self.root, self.photos_moved) if ref else None

    def _lists(self, name: str) -> bool:
        """The manifest lists ``name`` (its checksum), or the file is there."""
        return name in self.manifest.get("checksums", {}) or (self.root / name).is_file()

    def has_images(self) -> bool:
        return self._lists("image_emb.npy")

    def has_texts(self) -> bool:
        return self._lists("text_emb.npy")

    def image_embeddings(self, mmap: bool = False) -> np.ndarray:
        """(n_items, dim) float32. Without ``mmap`` the file's checksum and the values'
        finiteness are checked; the shape always is."""
        if not self.has_images():
            raise SparsemmError(f"collection {self.root} has no image embeddings")
        return self._embeddings("image_emb.npy", len(self.items), self.dim, mmap)

    def text_embeddings(self, mmap: bool = False) -> np.ndarray:
        """(n_texts, text_dim) float32, checked as :meth:`image_embeddings`."""
        if not self.has_texts():
            raise SparsemmError(f"collection {self.root} has no text embeddings")
        return self._embeddings("text_emb.npy", len(self.texts), self.text_dim, mmap)

    def _embeddings(self, name: str, rows: int, dim: int, mmap: bool) -> np.ndarray:
        if not mmap:
            self.check_file(name)
        arr = load_npy(self.root / name, mmap=mmap)
        if arr.ndim != 2 or arr.shape != (rows, dim):
            raise SparsemmError(
                f"collection {self.root}: {name} has shape {arr.shape}, the manifest says "
                f"({rows}, {dim}); re-run `sparsemm encode`"
            )
        if not mmap:
            return check_embeddings(arr, dim, f"collection {self.root}: {name}")
        return arr

    def check_file(self, name: str) -> None:
        """Compare ``name``'s sha256 with the manifest's (once per opened collection).

        Files the manifest lists no checksum for are not checked.
        """
        if name in self._verified:
            return
        digest = self.manifest.get("checksums", {}).get(name)
        if digest is not None:
            path = self.root / name
            if not path.is_file():
                raise SparsemmError(
                    f"collection {self.root}: {name} is missing; re-run `sparsemm encode`"
                )
            if sha256_file(path) != digest:
                raise SparsemmError(
                    f"collection {self.root}: {name} does not match its checksum "
                    "(modified or corrupt); re-run `sparsemm encode`"
                )
        self._verified.add(name)

    def skipped(self) -> list[dict[str, Any]]:
        """Source items left out when the collection was made (``{"id", "image", "error"}``:
        unreadable images); empty when none were."""
        if not (self.root / SKIPPED).is_file():
            return []
        self.check_file(SKIPPED)
        return read_jsonl(self.root / SKIPPED)

    def text_item_index(self) -> np.ndarray:
        """(n_texts,) int array: the item each text row belongs to."""
        return np.asarray([int(t["item"]) for t in self.texts], dtype=np.int64)

    def caption_rows(self, item_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Texts of the items in ``item_mask``: (text rows, index of each text's item among
        the selected items, in item order)."""
        items = np.flatnonzero(item_mask)
        pos = np.full(len(item_mask), -1, dtype=np.int64)
        pos[items] = np.arange(len(items))
        text_item = self.text_item_index()
        rows = np.flatnonzero(pos[text_item] >= 0)
        return rows, pos[text_item[rows]]

    def split_mask(self, split: str) -> np.ndarray:
        """(n_items,) bool: items whose ``split`` field equals ``split``; ``"all"``: every
        item (a collection of photos needs no split field)."""
        if split == "all":
            return np.ones(len(self.items), dtype=bool)
        mask = np.asarray([it.get("split") == split for it in self.items], dtype=bool)
        if not mask.any():
            raise SparsemmError(f"collection {self.root} has no items in split {split!r}")
        return mask

    def verify(self) -> None:
        """Re-hash every file and compare with the manifest's checksums."""
        self._verified.clear()
        for name in self.manifest.get("checksums", {}):
            self.check_file(name)


def check_manifest(manifest: Any, where: str, fmt: str, version: int, min_version: int) -> None:
    """Raise SparsemmError unless ``manifest`` is a JSON object of format ``fmt`` whose
    integer ``version`` lies in [min_version, version] (this sparsemm reads those)."""
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise SparsemmError(f"{where} is not a {fmt} manifest")
    v = manifest.get("version")
    if type(v) is not int:
        raise SparsemmError(
            f"{where} has no valid format version (got {v!r}); it is damaged or was not "
            "written by sparsemm: re-create it"
        )
    if v > version:
        raise SparsemmError(
            f"{where} was written by a newer sparsemm ({fmt} format v{v}, this one reads "
            f"v{min_version}..v{version}); upgrade sparsemm"
        )
    if v < min_version:
        raise SparsemmError(
            f"{where} was written by an older sparsemm ({fmt} format v{v}, this one reads "
            f"v{min_version}..v{version}); re-create it with this version"
        )


def collection_root(path: str | Path) -> Path:
    """The collection folder ``path`` names: ``path`` itself when it holds a collection, else
    the collection inside `sparsemm up`'s output folder (``path/collection``) or inside a photo
    folder `sparsemm up` ran on (``path/.sparsemm/collection``), so ``sparsemm search PHOTOS``
    searches what ``sparsemm up PHOTOS`` built. A folder with none of them is returned as it
    is (opening it then says it is not a collection)."""
    root = find_dir(Path(path))
    if (root / "manifest.json").is_file():
        return root
    for inner in (root / "collection", root / UP_DIR_NAME / "collection"):
        found = find_dir(inner)
        if (found / "manifest.json").is_file():
            return found
    return root


def moved_photos(root: Path, manifest: dict[str, Any]) -> tuple[Path, Path] | None:
    """(the photo folder `sparsemm up` read, as it recorded it; the photo folder the
    collection is in now) when a collection `up` keeps inside its photo folder
    (``PHOTOS/.sparsemm/collection``) was moved, renamed or copied with that folder since.
    None when the folder is where `up` read it, for a collection up wrote elsewhere (``-o``:
    it does not move with the photos) and for other collections."""
    source = manifest.get("source")
    if not isinstance(source, dict) or source.get("kind") != UP_SOURCE_KIND:
        return None
    recorded = source.get("path")
    here = resolve_path(root)
    if not isinstance(recorded, str) or not recorded or here.parent.name != UP_DIR_NAME:
        return None
    now = here.parent.parent
    return None if now == Path(recorded) else (Path(recorded), now)


def image_file(ref: str, root: Path, moved: tuple[Path, Path] | None = None) -> Path:
    """Where an item's recorded ``image`` is now.

    A relative one is under the collection folder ``root``. `up` records absolute paths;
    when its photo folder has moved (``moved``, from :func:`moved_photos`), an image under
    the recorded folder is read at the same place under the folder it is in now (never
    from the recorded folder: a copied folder's deleted photo is gone from the copy).
    """
    path = Path(ref).expanduser()
    if not path.is_absolute():
        return resolve_path(root / path)
    there = relocated(path, moved)
    return there if there is not None else path


def photo_file(
    item: dict[str, Any], root: Path, manifest: Any, moved: tuple[Path, Path] | None
) -> Path | None:
    """Where ``item``'s photo is now (:func:`image_file`; None: it has none): its own file,
    or when that was deleted, a copy of it still in the folder (its ``also`` paths, relative
    to the photo folder the collection's ``manifest`` names)."""
    ref = item.get("image")
    if not ref:
        return None
    path = image_file(str(ref), root, moved)
    source = manifest.get("source") if isinstance(manifest, dict) else None
    folder = source.get("path") if isinstance(source, dict) else None
    if path.exists() or not folder:
        return path
    for other in item.get("also") or []:
        copy = image_file(str(Path(str(folder)) / str(other)), root, moved)
        if copy.exists():
            return copy
    return path


def relocated(path: Path, moved: tuple[Path, Path] | None) -> Path | None:
    """``path`` (absolute) at the same place under the photo folder's new location
    (``moved``: see :func:`moved_photos`); None when nothing moved or ``path`` is not under
    the recorded folder (a symlink's target elsewhere)."""
    if moved is None:
        return None
    try:
        return moved[1] / path.relative_to(moved[0])
    except ValueError:
        return None


def up_args(root: Path, manifest: Any) -> str | None:
    """The `sparsemm up` arguments that made the collection folder ``root`` (whose manifest
    is ``manifest``): ``PHOTOS``, with ``-o OUT`` when it is not in PHOTOS' own folder,
    shell-quoted; None for collections up did not make. With no manifest (it could not be
    read), only a collection in PHOTOS/.sparsemm is known to be up's, by where it is."""
    source = manifest.get("source") if isinstance(manifest, dict) else None
    out = root.parent  # up writes OUT/collection
    if not (isinstance(source, dict) and source.get("kind") == UP_SOURCE_KIND):
        if manifest is None and root.name == "collection" and out.name == UP_DIR_NAME:
            return shlex.quote(str(out.parent.resolve()))
        return None
    photos = str(source.get("path") or "PHOTOS")
    moved = moved_photos(root, manifest)
    if moved is not None:  # inside the photo folder, which moved: where it is now
        return shlex.quote(str(moved[1]))
    if out.name == UP_DIR_NAME and out.parent.resolve() == Path(photos).resolve():
        return shlex.quote(photos)
    return f"{shlex.quote(photos)} -o {shlex.quote(str(out.resolve()))}"


def open_collection(path: str | Path, verify: bool = True) -> Collection:
    """Open a collection folder; raise SparsemmError if it is missing, damaged or from an
    incompatible sparsemm.

    A collection parked aside by a crash in the middle of a folder swap is found (see
    :func:`sparsemm.io.find_dir`). With ``verify`` (default) the item and text tables are
    checked against the manifest's checksums now and the arrays when they are loaded.
    """
    root = collection_root(path)
    if not (root / "manifest.json").is_file():
        raise SparsemmError(
            f"{root} is not a sparsemm collection (no manifest.json); create one with "
            "`sparsemm up PHOTOS` or `sparsemm encode`"
        )
    manifest = read_json(root / "manifest.json")
    check_manifest(manifest, f"{root}/manifest.json", FORMAT, VERSION, MIN_VERSION)
    encoder, counts = manifest.get("encoder"), manifest.get("counts")
    if not (
        isinstance(encoder, dict)
        and isinstance(encoder.get("name"), str)
        and type(encoder.get("dim")) is int
        and isinstance(counts, dict)
        and isinstance(manifest.get("checksums", {}), dict)
    ):
        raise SparsemmError(f"{root}/manifest.json is malformed; re-run `sparsemm encode`")
    if verify and not manifest.get("checksums"):
        logger.warning(
            "%s/manifest.json records no checksums: its files are not verified (written by "
            "an older sparsemm, or edited); `sparsemm encode` writes them again",
            root,
        )
    col = Collection(root=root, manifest=manifest, items=[])
    if not verify:  # every file counts as checked
        col._verified.update(manifest.get("checksums", {}))
    col.check_file("items.jsonl")
    col.items = read_jsonl(root / "items.jsonl")
    if col._lists("texts.jsonl"):
        col.check_file("texts.jsonl")
        col.texts = read_jsonl(root / "texts.jsonl")
    if counts.get("items") != len(col.items) or counts.get("texts", 0) != len(col.texts):
        raise SparsemmError(f"collection {root}: item/text counts disagree with the manifest")
    if not all(isinstance(it, dict) and "id" in it for it in col.items):
        raise SparsemmError(f"collection {root}: items.jsonl rows must be objects with an id")
    n = len(col.items)
    if not all(
        isinstance(t, dict) and type(t.get("item")) is int and 0 <= t["item"] < n for t in col.texts
    ):
        raise SparsemmError(
            f"collection {root}: texts.jsonl rows must be objects whose 'item' indexes an item"
        )
    return col


def write_collection(
    path: str | Path,
    items: Sequence[dict[str, Any]],
    encoder: dict[str, Any],
    image_emb: np.ndarray | None = None,
    text_emb: np.ndarray | None = None,
    texts: Sequence[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
    text_encoder: dict[str, Any] | None = None,
    skipped: Sequence[dict[str, Any]] | None = None,
    keep: Sequence[str] = (),
) -> Collection:
    """Write a collection folder atomically (temp folder, then swap) and return it opened.

    ``encoder`` must hold at least ``name`` and ``dim``; ``text_encoder`` likewise when the
    texts come from another backbone than the images (e.g. EfficientNet + MiniLM). ``texts``
    rows carry ``item`` (an index into ``items``) and ``text``; they are required when
    ``text_emb`` is given. ``skipped`` (source items left out, e.g. unreadable images) goes
    to ``skipped.jsonl`` and its count to the manifest. ``keep`` names sub-folders of the
    collection now at ``path`` (e.g. its ``index`` when items were only appended, caches) to
    carry into the new version, hard-linked in the same atomic swap; without it every
    sub-folder is dropped. Holds the collection's writer lock (SparsemmError if another
    process writes it); on any failure nothing is left behind.
    """
    root = Path(path)
    dim = int(encoder["dim"])
    if image_emb is None and text_emb is None:
        raise SparsemmError("a collection needs image and/or text embeddings")
    if image_emb is not None:
        image_emb = check_embeddings(image_emb, dim, "image embeddings")
        if len(image_emb) != len(items):
            raise SparsemmError(
                f"{len(image_emb)} image embeddings for {len(items)} items; they must match"
            )
    texts = list(texts or [])
    if text_emb is not None:
        text_dim = int((text_encoder or encoder)["dim"])
        text_emb = check_embeddings(text_emb, text_dim, "text embeddings")
        if len(text_emb) != len(texts):
            raise SparsemmError(f"{len(text_emb)} text embeddings for {len(texts)} texts")
    ids = [str(it.get("id", "")) for it in items]
    if any(not i for i in ids) or len(set(ids)) != len(ids):
        raise SparsemmError("every item needs a unique, non-empty 'id'")

    with collection_lock(root):
        _remove_stale_temps(root)
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
        except OSError as exc:
            raise write_error(exc, root) from exc
        try:
            write_jsonl(tmp / "items.jsonl", list(items))
            if image_emb is not None:
                save_npy(tmp / "image_emb.npy", image_emb)
            if text_emb is not None:
                save_npy(tmp / "text_emb.npy", text_emb)
                write_jsonl(tmp / "texts.jsonl", texts)
            if skipped:
                write_jsonl(tmp / SKIPPED, list(skipped))
            names = sorted(p.name for p in tmp.iterdir())
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "encoder": dict(encoder),
                **({"text_encoder": dict(text_encoder)} if text_encoder else {}),
                "counts": {"items": len(items), "texts": len(texts)},
                **({"skipped": len(skipped)} if skipped else {}),
                "checksums": {n: sha256_file(tmp / n) for n in names},
                **(extra or {}),
            }
            write_json(tmp / "manifest.json", manifest)
            if keep:
                _carry_subdirs(find_dir(root), tmp, keep)
            _swap_dir(tmp, root)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError):  # name the collection, not its temp folder
                raise write_error(exc, root) from exc
            raise
        return open_collection(root)


def _carry_subdirs(old: Path, new: Path, names: Sequence[str]) -> None:
    """Hard-link (copy where links fail) the sub-folders ``names`` of ``old`` into ``new``.
    Their writers replace files rather than rewrite them, so a link never sees a change
    made to the other version."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    for name in names:
        src = old / name
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, new / name, copy_function=link)


def collection_lock(path: str | Path) -> Any:
    """Context manager holding the writer lock of the collection folder ``path``
    (``.<name>.lock`` beside it); SparsemmError at once when another process holds it."""
    return exclusive_lock(lock_path(path), f"collection {path}")


def _remove_stale_temps(root: Path) -> None:
    """Delete temp folders a killed writer of ``root`` left beside it (call under the lock:
    no other writer of ``root`` is running, so any such folder is abandoned)."""
    if not root.parent.is_dir():
        return
    # mkdtemp's names: ".<name>." + 8 random characters + ".tmp"
    pattern = re.compile(re.escape(f".{root.name}.") + r"[a-z0-9_]{8}\.tmp")
    for p in root.parent.iterdir():
        if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            logger.info("removing %s, left by an interrupted write", p)
            shutil.rmtree(p, ignore_errors=True)


def _swap_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target`` (see :func:`sparsemm.io.replace_dir`); only an empty folder
    or a sparsemm folder (one with a ``manifest.json``) at ``target`` is replaced."""
    if target.exists():
        if not target.is_dir():
            raise SparsemmError(f"{target} exists and is not a folder; choose another output path")
        if not (target / "manifest.json").is_file() and any(target.iterdir()):
            raise SparsemmError(
                f"{target} exists and is not a sparsemm folder; choose another output path"
            )
    replace_dir(new, target)
