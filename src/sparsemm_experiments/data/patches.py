"""Patch features of a collection's items for VDR's image side: the caption embeddings of
an item as a set (caption-proxy collections) or EfficientNet-Lite0 spatial features (items
with pixels), cached beside the collection. Library code: ``sparsemm index`` with a VDR
model needs them, as do the VDR training and benchmark runs."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.data.collection import Collection, sha256_file
from sparsemm.errors import SparsemmError
from sparsemm.io import load_npy, read_json, save_npy, write_json

log = logging.getLogger(__name__)


def proxy_patches(collection: Collection) -> tuple[np.ndarray, np.ndarray]:
    """Caption-proxy patches: each item's caption embeddings as a set.

    Returns patches (n_items, P, d) float32 (P = most captions of an item, zero padded) and
    mask (n_items, P) bool (True = a real caption).
    """
    te = collection.text_embeddings()
    owner = collection.text_item_index()
    n = len(collection.items)
    counts = np.bincount(owner, minlength=n)
    if counts.min() == 0:
        raise SparsemmError("every item needs at least one caption for VDR's proxy patches")
    p = int(counts.max())
    patches = np.zeros((n, p, te.shape[1]), dtype=np.float32)
    mask = np.zeros((n, p), dtype=bool)
    slot = np.zeros(n, dtype=np.int64)
    for row, item in enumerate(owner):
        patches[item, slot[item]] = te[row]
        mask[item, slot[item]] = True
        slot[item] += 1
    return patches, mask


def _collection_key(collection: Collection) -> str:
    files = collection.manifest.get("checksums", {})
    return str(sorted(files.items())) if files else sha256_file(collection.root / "items.jsonl")


def collage_patches(
    collection: Collection,
    cache_dir: str | Path,
    encoder: Any = None,
    progress: bool = False,
) -> np.ndarray:
    """EfficientNet-Lite0 spatial features (n_items, 49, 1280) float16, cached in ``cache_dir``.

    Items need an ``image`` path. The cache (``spatial.npy`` + ``spatial.json``) is reused
    only for the same collection files.
    """
    cache = Path(cache_dir)
    key = _collection_key(collection)
    meta_path, arr_path = cache / "spatial.json", cache / "spatial.npy"
    if meta_path.is_file() and arr_path.is_file() and read_json(meta_path).get("key") == key:
        return load_npy(arr_path)
    images = [it.get("image") for it in collection.items]
    if any(not img for img in images):
        raise SparsemmError("collage items need an 'image' path for VDR's spatial features")
    if encoder is None:
        from sparsemm.encoders.base import get_encoder

        encoder = get_encoder("efficientnet")
    t0 = time.perf_counter()
    feats = encoder.encode_spatial(images, progress=progress).astype(np.float16)
    save_npy(arr_path, feats)
    write_json(meta_path, {"key": key, "shape": list(feats.shape), "encoder": "efficientnet"})
    log.info("spatial features of %d images in %.1f s", len(images), time.perf_counter() - t0)
    return feats
