"""A collection on disk: a folder of dense embeddings plus item metadata.

Layout (format version 1)::

    manifest.json   format, version, encoder {name, dim}, counts, file checksums
    items.jsonl     one row per item: {"id", "captions"?, "image"?, "labels"?, "split"?, ...}
    image_emb.npy   (n_items, d) float32, row i = item i (an image, or an image *view*)
    text_emb.npy    (n_texts, d) float32, row j = texts.jsonl row j
    texts.jsonl     one row per text: {"item": item index, "text": str}

The folder is written under a temporary name and swapped in, so a crash never leaves a
half-written collection where a good one stood.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.io import (
    load_npy,
    read_json,
    read_jsonl,
    replace_dir,
    save_npy,
    write_json,
    write_jsonl,
)

FORMAT = "sparsemm.collection"
VERSION = 1


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_embeddings(arr: np.ndarray, dim: int | None, what: str) -> np.ndarray:
    """Validate a dense (n, d) float matrix: right shape, finite values."""
    arr = np.asarray(arr)
    if arr.ndim != 2:
        raise SparsemmError(f"{what}: expected a 2-D (n, d) array, got shape {arr.shape}")
    if dim is not None and arr.shape[1] != dim:
        raise SparsemmError(f"{what}: expected dimension {dim}, got {arr.shape[1]}")
    if not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).any(axis=1).sum())
        raise SparsemmError(f"{what}: {bad} row(s) contain NaN or inf; re-encode those items")
    return arr.astype(np.float32, copy=False)


@dataclass
class Collection:
    """An opened collection folder (see module docstring)."""

    root: Path
    manifest: dict[str, Any]
    items: list[dict[str, Any]]
    texts: list[dict[str, Any]] = field(default_factory=list)

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

    def has_images(self) -> bool:
        return (self.root / "image_emb.npy").is_file()

    def has_texts(self) -> bool:
        return (self.root / "text_emb.npy").is_file()

    def image_embeddings(self, mmap: bool = False) -> np.ndarray:
        if not self.has_images():
            raise SparsemmError(f"collection {self.root} has no image embeddings")
        return load_npy(self.root / "image_emb.npy", mmap=mmap)

    def text_embeddings(self, mmap: bool = False) -> np.ndarray:
        if not self.has_texts():
            raise SparsemmError(f"collection {self.root} has no text embeddings")
        return load_npy(self.root / "text_emb.npy", mmap=mmap)

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
        """(n_items,) bool: items whose ``split`` field equals ``split``."""
        mask = np.asarray([it.get("split") == split for it in self.items], dtype=bool)
        if not mask.any():
            raise SparsemmError(f"collection {self.root} has no items in split {split!r}")
        return mask

    def verify(self) -> None:
        """Re-hash every file and compare with the manifest's checksums."""
        for name, digest in self.manifest.get("checksums", {}).items():
            path = self.root / name
            if not path.is_file():
                raise SparsemmError(f"collection {self.root}: {name} is missing")
            if sha256_file(path) != digest:
                raise SparsemmError(
                    f"collection {self.root}: {name} does not match its checksum "
                    "(modified or corrupt); re-run `sparsemm encode`"
                )


def open_collection(path: str | Path) -> Collection:
    root = Path(path)
    if not (root / "manifest.json").is_file():
        raise SparsemmError(
            f"{root} is not a sparsemm collection (no manifest.json); create one with "
            "`sparsemm encode`"
        )
    manifest = read_json(root / "manifest.json")
    if manifest.get("format") != FORMAT:
        raise SparsemmError(f"{root}/manifest.json is not a {FORMAT} manifest")
    if int(manifest.get("version", -1)) > VERSION:
        raise SparsemmError(
            f"{root} was written by a newer sparsemm (collection format "
            f"v{manifest.get('version')}, this one reads v{VERSION}); upgrade sparsemm"
        )
    items = read_jsonl(root / "items.jsonl")
    texts = read_jsonl(root / "texts.jsonl") if (root / "texts.jsonl").is_file() else []
    col = Collection(root=root, manifest=manifest, items=items, texts=texts)
    counts = manifest.get("counts", {})
    if counts.get("items") != len(items) or counts.get("texts", 0) != len(texts):
        raise SparsemmError(f"collection {root}: item/text counts disagree with the manifest")
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
) -> Collection:
    """Write a collection folder atomically (temp folder, then swap) and return it opened.

    ``encoder`` must hold at least ``name`` and ``dim``; ``text_encoder`` likewise when the
    texts come from another backbone than the images (e.g. EfficientNet + MiniLM). ``texts``
    rows carry ``item`` (an index into ``items``) and ``text``; they are required when
    ``text_emb`` is given.
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

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".tmp", dir=root.parent))
    try:
        write_jsonl(tmp / "items.jsonl", list(items))
        if image_emb is not None:
            save_npy(tmp / "image_emb.npy", image_emb)
        if text_emb is not None:
            save_npy(tmp / "text_emb.npy", text_emb)
            write_jsonl(tmp / "texts.jsonl", texts)
        names = sorted(p.name for p in tmp.iterdir())
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "encoder": dict(encoder),
            **({"text_encoder": dict(text_encoder)} if text_encoder else {}),
            "counts": {"items": len(items), "texts": len(texts)},
            "checksums": {n: sha256_file(tmp / n) for n in names},
            **(extra or {}),
        }
        write_json(tmp / "manifest.json", manifest)
        _swap_dir(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_collection(root)


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
