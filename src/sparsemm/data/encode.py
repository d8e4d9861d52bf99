"""Encode items into a collection folder (the library side of ``sparsemm encode``).

What gets written (see :mod:`sparsemm.data.collection` for the layout):

- texts: every caption of every item, in item order (rows ``{"item": idx, "text": caption}``)
  and their L2-normalised embeddings ``text_emb`` ``(n_texts, d)``;
- ``image_emb`` ``(n_items, d)``: the encoder's image embeddings when every item has an
  image and the encoder embeds images (``image_kind: "pixels"``); otherwise, when every item
  has captions, the *caption view* of each item: the L2-normalised mean of the
  L2-normalised embeddings of all its captions (``image_kind: "caption_view"``, the COCO
  caption-proxy protocol of DESIGN.md). A table encoder keyed by id (``precomputed``) is
  given item ids (``image_kind: "precomputed"``).

:func:`encode_source` adds reading and caching: the manifest stores a fingerprint of the
source and the encoder settings, and a matching collection is reused instead of re-encoded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.data.collection import (
    Collection,
    check_embeddings,
    open_collection,
    write_collection,
)
from sparsemm.data.sources import Item, guess_format, read_items
from sparsemm.encoders.base import Encoder, get_encoder, l2_normalize
from sparsemm.errors import SparsemmError

logger = logging.getLogger(__name__)


def _modalities(encoder: Encoder) -> tuple[str, ...]:
    # Not part of the Encoder protocol: an encoder that does not say is assumed to do both.
    return tuple(getattr(encoder, "modalities", ("text", "image")))


def caption_views(
    text_emb: np.ndarray, text_item: np.ndarray, n_items: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-item caption views from caption embeddings.

    text_emb (n_texts, d), text_item (n_texts,) item index of each row -> views (n_items, d),
    the L2-normalised mean of the L2-normalised caption embeddings of each item, and
    has_caption (n_items,) bool (items without captions get a zero row).
    """
    unit = l2_normalize(text_emb)
    sums = np.zeros((n_items, unit.shape[1]), dtype=np.float64)
    np.add.at(sums, text_item, unit)
    counts = np.bincount(text_item, minlength=n_items)
    means = sums / np.maximum(counts, 1)[:, None]
    return l2_normalize(means.astype(np.float32)), counts > 0


def encode_items(
    items: Sequence[Item],
    encoder: Encoder,
    out: str | Path,
    batch_size: int = 64,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
    text_encoder: Encoder | None = None,
) -> Collection:
    """Embed ``items`` with ``encoder`` and write the collection folder ``out``.

    With ``text_encoder``, captions are embedded by it and images by ``encoder`` (two
    unaligned backbones, e.g. EfficientNet + MiniLM; every item then needs an image).

    Returns the opened :class:`Collection`. ``extra`` goes into the manifest (e.g. a
    ``source`` fingerprint). Raises SparsemmError when an image embedding (real or caption
    view) cannot be made for every item.
    """
    items = [dict(it) for it in items]
    if not items:
        raise SparsemmError("no items to encode; check the source, --split and --limit")
    modalities = _modalities(encoder)
    n = len(items)

    texts: list[dict[str, Any]] = []
    text_emb: np.ndarray | None = None
    tenc = text_encoder or encoder
    if text_encoder is not None:
        if "image" not in modalities or any(not it.get("image") for it in items):
            raise SparsemmError(
                f"with a separate text encoder, {encoder.name} must embed images and every "
                "item needs an image"
            )
    if "text" in _modalities(tenc):
        texts = [
            {"item": idx, "text": caption}
            for idx, item in enumerate(items)
            for caption in item.get("captions") or []
        ]
        if texts:
            logger.info("encoding %d texts of %d items with %s", len(texts), n, tenc.name)
            text_emb = tenc.encode_text(
                [t["text"] for t in texts],
                batch_size=batch_size,
                normalize=True,
                progress=progress,
            )
            text_emb = check_embeddings(text_emb, tenc.dim, f"{tenc.name} text embeddings")

    image_emb: np.ndarray | None = None
    image_kind: str | None = None
    keys_are_ids = bool(getattr(encoder, "keys_are_ids", False))
    with_image = sum(1 for it in items if it.get("image"))
    if "image" in modalities and (keys_are_ids or with_image == n):
        keys = [it["id"] for it in items] if keys_are_ids else [it["image"] for it in items]
        image_kind = "precomputed" if keys_are_ids else "pixels"
        logger.info("encoding %d images with %s", n, encoder.name)
        image_emb = encoder.encode_image(
            keys, batch_size=batch_size, normalize=True, progress=progress
        )
        image_emb = check_embeddings(image_emb, encoder.dim, f"{encoder.name} image embeddings")
    elif text_emb is not None:
        if with_image:
            logger.info(
                "%d of %d items have images but %s; using caption views",
                with_image,
                n,
                "not all of them do"
                if "image" in modalities
                else f"the {encoder.name} encoder embeds text only",
            )
        item_index = np.asarray([t["item"] for t in texts], dtype=np.int64)
        image_emb, has_caption = caption_views(text_emb, item_index, n)
        if not has_caption.all():
            missing = [items[i]["id"] for i in np.flatnonzero(~has_caption)[:5]]
            raise SparsemmError(
                f"{int((~has_caption).sum())} item(s) have no captions, so no caption view "
                f"can be made (e.g. {missing}); give every item a caption or an image and an "
                "image encoder (--encoder clip|blip)"
            )
        image_kind = "caption_view"
    elif with_image:
        raise SparsemmError(
            f"the {encoder.name} encoder cannot embed images and the items have no captions; "
            "use --encoder clip or blip"
        )
    else:
        raise SparsemmError("the items have neither captions nor images; nothing to encode")

    encoder_info = _encoder_info(encoder)
    manifest_extra = {"image_kind": image_kind, **(extra or {})}
    return write_collection(
        out,
        items,
        encoder_info,
        image_emb=image_emb,
        text_emb=text_emb,
        texts=texts if text_emb is not None else None,
        extra=manifest_extra,
        text_encoder=_encoder_info(text_encoder) if text_encoder is not None else None,
    )


def _encoder_info(encoder: Encoder) -> dict[str, Any]:
    info: dict[str, Any] = {"name": encoder.name, "dim": int(encoder.dim)}
    model_id = getattr(encoder, "model_id", None)
    if model_id:
        info["model"] = str(model_id)
    return info


def source_fingerprint(
    source: str | Path,
    format: str,
    split: str | None,
    limit: int | None,
    encoder: str,
    model: str | None,
    checksum: bool = False,
) -> dict[str, Any]:
    """What identifies an encode run: the source's path and content stamp + the settings.

    The stamp is size + mtime (or the sha256 with ``checksum``) for a file, and a hash of
    the (relative path, size, mtime) listing for an image folder.
    """
    path = Path(source).expanduser().resolve()
    if not path.exists():
        raise SparsemmError(f"source not found: {path}")
    fp: dict[str, Any] = {"path": str(path), "format": format}
    if path.is_dir():
        listing = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            st = file.stat()
            listing.update(f"{file.relative_to(path).as_posix()}\0{st.st_size}\0".encode())
            listing.update(f"{st.st_mtime_ns}\n".encode())
        fp["listing_sha256"] = listing.hexdigest()
    elif checksum:
        from sparsemm.data.collection import sha256_file

        fp["sha256"] = sha256_file(path)
    else:
        st = path.stat()
        fp["size"] = st.st_size
        fp["mtime_ns"] = st.st_mtime_ns
    if model is not None and Path(model).expanduser().exists():
        model = str(Path(model).expanduser().resolve())
    fp.update({"split": split, "limit": limit, "encoder": encoder, "model": model})
    return fp


def cached_collection(out: str | Path, fingerprint: dict[str, Any]) -> Collection | None:
    """The collection at ``out`` if it was made from ``fingerprint`` and is intact, else None."""
    root = Path(out)
    if not (root / "manifest.json").is_file():
        return None
    try:
        col = open_collection(root)
        if col.manifest.get("source") != fingerprint:
            return None
        col.verify()
    except SparsemmError as exc:
        logger.warning("existing collection at %s is unusable (%s); re-encoding", root, exc)
        return None
    return col


def encode_source(
    source: str | Path,
    out: str | Path,
    format: str | None = None,
    encoder: str | Encoder = "minilm",
    model: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    batch_size: int = 64,
    progress: bool = True,
    force: bool = False,
    text_encoder: str | Encoder | None = None,
) -> Collection:
    """Read ``source``, embed it and write the collection ``out``; reuse a cached one.

    ``encoder`` is a registered name (built with ``model=`` when given) or an encoder
    object. Unless ``force``, an existing collection at ``out`` whose manifest ``source``
    fingerprint matches is returned without re-encoding.
    """
    fmt = format or guess_format(source)
    encoder_name = encoder if isinstance(encoder, str) else encoder.name
    if not isinstance(encoder, str) and model is None:
        model = getattr(encoder, "model_id", None)
    fingerprint = source_fingerprint(source, fmt, split, limit, encoder_name, model)
    if text_encoder is not None:
        fingerprint["text_encoder"] = (
            text_encoder if isinstance(text_encoder, str) else text_encoder.name
        )
    if not force:
        cached = cached_collection(out, fingerprint)
        if cached is not None:
            logger.info("%s is up to date with %s (cached); use --force to re-encode", out, source)
            return cached
    items = read_items(source, format=fmt, split=split, limit=limit)
    logger.info("read %d items from %s (%s)", len(items), source, fmt)
    if isinstance(encoder, str):
        kwargs: dict[str, Any] = {"model": model} if model is not None else {}
        if encoder == "precomputed":
            # CLI use: the table holds one row per item id (image side only).
            kwargs["modalities"] = ("image",)
        enc = get_encoder(encoder, **kwargs)
    else:
        enc = encoder
    tenc = get_encoder(text_encoder) if isinstance(text_encoder, str) else text_encoder
    return encode_items(
        items,
        enc,
        out,
        batch_size=batch_size,
        progress=progress,
        extra={"source": fingerprint},
        text_encoder=tenc,
    )
