"""Encode items into a collection folder (the library side of ``sparsemm encode``).

What gets written (see :mod:`sparsemm.data.collection` for the layout):

- texts: every caption of every item, in item order (rows ``{"item": idx, "text": caption}``)
  and their L2-normalised embeddings ``text_emb`` ``(n_texts, d)``;
- ``image_emb`` ``(n_items, d)``: the encoder's image embeddings when every item has an
  image and the encoder embeds images (``image_kind: "pixels"``); otherwise, when every item
  has captions, the *caption view* of each item: the L2-normalised mean of the
  L2-normalised embeddings of all its captions (``image_kind: "caption_view"``, the COCO
  caption-proxy protocol, docs/formats.md). A table encoder keyed by id (``precomputed``) is
  given item ids (``image_kind: "precomputed"``).

:func:`encode_source` adds reading and caching: the manifest stores a fingerprint of the
source and the encoder settings, and a matching collection is reused instead of re-encoded.

Bad image files (missing, truncated, corrupt, unsupported, too large, or embedded as
NaN/inf) do not abort a long run: with ``on_bad_image="skip"`` (default) their items are
left out, listed in the collection's ``skipped.jsonl`` (id, image, error) and counted in
the manifest; ``"fail"`` stops at the first one instead.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from sparsemm.data.collection import (
    Collection,
    collection_lock,
    open_collection,
    write_collection,
)
from sparsemm.data.sources import Item, guess_format, read_items
from sparsemm.encoders.base import (
    Encoder,
    ImageEncoder,
    as_image_encoder,
    as_text_encoder,
    get_encoder,
    l2_normalize,
    modalities,
)
from sparsemm.errors import SparsemmError
from sparsemm.linalg import check_embeddings

logger = logging.getLogger(__name__)

BAD_IMAGE_POLICIES = ("skip", "fail")


class _EncoderOutputError(SparsemmError):
    """The encoder returned an array of the wrong shape: its fault, not an image's."""


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
    on_bad_image: str = "skip",
) -> Collection:
    """Embed ``items`` with ``encoder`` and write the collection folder ``out``.

    With ``text_encoder``, captions are embedded by it and images by ``encoder`` (two
    unaligned backbones, e.g. EfficientNet + MiniLM; every item then needs an image).
    ``on_bad_image``: ``"skip"`` leaves out items whose image cannot be embedded and lists
    them in ``skipped.jsonl`` (see the module docstring); ``"fail"`` raises at the first.

    Returns the opened :class:`Collection`. ``extra`` goes into the manifest (e.g. a
    ``source`` fingerprint). Raises SparsemmError when an image embedding (real or caption
    view) cannot be made for every item, or when no image at all could be read.
    """
    if on_bad_image not in BAD_IMAGE_POLICIES:
        raise SparsemmError(
            f"on_bad_image must be one of {', '.join(BAD_IMAGE_POLICIES)}, got {on_bad_image!r}"
        )
    items = [dict(it) for it in items]
    if not items:
        raise SparsemmError("no items to encode; check the source, --split and --limit")
    embeds = modalities(encoder)
    tenc = text_encoder or encoder
    if text_encoder is not None:
        if "image" not in embeds or any(not it.get("image") for it in items):
            raise SparsemmError(
                f"with a separate text encoder, {encoder.name} must embed images and every "
                "item needs an image"
            )

    with_image = sum(1 for it in items if it.get("image"))
    items, image_emb, image_kind, skipped = _embed_images(
        items, encoder, embeds, batch_size, progress, on_bad_image
    )
    n = len(items)
    texts, text_emb = _embed_captions(items, tenc, batch_size, progress)

    if image_emb is None and text_emb is not None:
        if with_image:
            logger.info(
                "%d of %d items have images but %s; using caption views",
                with_image,
                n,
                "not all of them do"
                if "image" in embeds
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
    elif image_emb is None and with_image:
        raise SparsemmError(
            f"the {encoder.name} encoder cannot embed images and the items have no captions; "
            "use --encoder clip or blip"
        )
    elif image_emb is None:
        raise SparsemmError("the items have neither captions nor images; nothing to encode")

    image_info = encoder_info(encoder)
    manifest_extra = {"image_kind": image_kind, **(extra or {})}
    return write_collection(
        out,
        items,
        image_info,
        image_emb=image_emb,
        text_emb=text_emb,
        texts=texts if text_emb is not None else None,
        extra=manifest_extra,
        text_encoder=encoder_info(text_encoder) if text_encoder is not None else None,
        skipped=skipped,
    )


def _embed_images(
    items: list[Item],
    encoder: Encoder,
    embeds: tuple[str, ...],
    batch_size: int,
    progress: bool,
    on_bad_image: str,
) -> tuple[list[Item], np.ndarray | None, str | None, list[dict[str, Any]]]:
    """(items kept, their image embeddings, image kind, skipped rows): looked up by id in a
    precomputed encoder, or embedded from the pixels when every item has an image (items
    whose image cannot be read left out under ``on_bad_image="skip"``); no embeddings
    otherwise (the caller makes caption views). ``embeds``: ``modalities(encoder)``."""
    image_emb: np.ndarray | None = None
    image_kind: str | None = None
    skipped: list[dict[str, Any]] = []
    keys_are_ids = bool(getattr(encoder, "keys_are_ids", False))
    if "image" in embeds and keys_are_ids:
        image_kind = "precomputed"
        logger.info("looking up %d items in %s", len(items), encoder.name)
        image_emb = as_image_encoder(encoder).encode_image(
            [it["id"] for it in items], batch_size=batch_size, normalize=True, progress=progress
        )
        image_emb = check_embeddings(image_emb, encoder.dim, f"{encoder.name} image embeddings")
    elif "image" in embeds and all(it.get("image") for it in items):
        # Images first: items whose image is bad are dropped before their captions are
        # embedded, so texts and items stay aligned.
        image_kind = "pixels"
        logger.info("encoding %d images with %s", len(items), encoder.name)
        image_emb, ok, skipped = encode_images_skipping(
            as_image_encoder(encoder),
            [it["image"] for it in items],
            [str(it["id"]) for it in items],
            batch_size=batch_size,
            progress=progress,
            skip=on_bad_image == "skip",
        )
        if skipped:
            items = [it for it, keep in zip(items, ok, strict=True) if keep]
            image_emb = image_emb[ok]
    return items, image_emb, image_kind, skipped


def _embed_captions(
    items: list[Item], tenc: Encoder, batch_size: int, progress: bool
) -> tuple[list[dict[str, Any]], np.ndarray | None]:
    """(caption rows ``{"item", "text"}``, their embeddings by ``tenc``, or None when it
    embeds no text or there is no caption)."""
    texts: list[dict[str, Any]] = []
    text_emb: np.ndarray | None = None
    if "text" in modalities(tenc):
        texts = [
            {"item": idx, "text": caption}
            for idx, item in enumerate(items)
            for caption in item.get("captions") or []
        ]
        if texts:
            logger.info("encoding %d texts of %d items with %s", len(texts), len(items), tenc.name)
            text_emb = as_text_encoder(tenc).encode_text(
                [t["text"] for t in texts],
                batch_size=batch_size,
                normalize=True,
                progress=progress,
            )
            text_emb = check_embeddings(text_emb, tenc.dim, f"{tenc.name} text embeddings")
    return texts, text_emb


def encode_images_skipping(
    encoder: ImageEncoder,
    images: Sequence[Any],
    ids: Sequence[str],
    batch_size: int = 32,
    progress: bool = True,
    skip: bool = True,
    require_one: bool = True,
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """Embed ``images`` batch by batch, leaving out the ones that cannot be embedded.

    Returns (emb (n, dim) float32 L2-normalised, ok (n,) bool, skipped rows ``{"id",
    "image", "error"}``); rows of skipped images are zero. A batch whose encoding raises
    SparsemmError (an unreadable file) is redone image by image, so one bad file costs
    one batch, not the run; an image embedded as NaN/inf is skipped too. With ``skip=False``
    the first bad image raises. Raises SparsemmError when no image could be embedded, unless
    ``require_one`` is False (a re-run whose collection keeps other photos).
    """
    n, dim = len(images), int(encoder.dim)
    emb = np.zeros((n, dim), dtype=np.float32)
    ok = np.ones(n, dtype=bool)
    errors: dict[int, str] = {}
    step = max(1, int(batch_size))

    def run(rows: range) -> np.ndarray:
        out = np.asarray(
            encoder.encode_image([images[i] for i in rows], batch_size=step, normalize=True),
            dtype=np.float32,
        )
        if out.shape != (len(rows), dim):
            raise _EncoderOutputError(
                f"the {encoder.name} encoder returned shape {out.shape} for {len(rows)} "
                f"images; expected ({len(rows)}, {dim})"
            )
        return out

    with tqdm(total=n, desc=f"{encoder.name} images", disable=not progress, unit="img") as bar:
        for start in range(0, n, step):
            rows = range(start, min(n, start + step))
            try:
                emb[rows.start : rows.stop] = run(rows)
            except _EncoderOutputError:
                raise
            except SparsemmError:
                if not skip:
                    raise
                for i in rows:  # find the bad file(s); the others are still embedded
                    try:
                        emb[i] = run(range(i, i + 1))[0]
                    except _EncoderOutputError:
                        raise
                    except SparsemmError as exc:
                        ok[i] = False
                        errors[i] = str(exc)
            bar.update(len(rows))
    bad = ok & ~np.isfinite(emb).all(axis=1)
    if bad.any() and not skip:
        raise SparsemmError(
            f"the {encoder.name} encoder gave NaN or inf for image {images[int(np.argmax(bad))]}; "
            "fix or remove this file"
        )
    for row in np.flatnonzero(bad).tolist():
        ok[row] = False
        errors[row] = f"the {encoder.name} encoder gave NaN or inf for this image"
        emb[row] = 0.0
    skipped = [{"id": ids[i], "image": str(images[i]), "error": errors[i]} for i in sorted(errors)]
    if skipped and not ok.any() and require_one:
        raise SparsemmError(
            f"none of the {n} images could be embedded (first error: {skipped[0]['error']}); "
            "check the source"
        )
    if skipped:
        logger.info(  # the front ends print their own one-line summary
            "skipped %d of %d images that could not be embedded, e.g. %s: %s",
            len(skipped),
            n,
            skipped[0]["image"],
            skipped[0]["error"],
        )
    return emb, ok, skipped


def encoder_info(encoder: Encoder) -> dict[str, Any]:
    """What a collection's manifest records of an encoder: name, dim and model."""
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
    try:
        path = Path(source).expanduser().resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError up to 3.12)
        raise SparsemmError(
            f"source {source} is a symbolic link loop; point to the real file or folder"
        ) from exc
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
    on_bad_image: str = "skip",
) -> Collection:
    """Read ``source``, embed it and write the collection ``out``; reuse a cached one.

    ``encoder`` is a registered name (built with ``model=`` when given) or an encoder
    object. Unless ``force``, an existing collection at ``out`` whose manifest ``source``
    fingerprint matches is returned without re-encoding. ``on_bad_image``: see
    :func:`encode_items`. The collection's writer lock is held from the start, so a
    second ``encode`` into ``out`` fails at once instead of after its own encoding.
    """
    with collection_lock(out):
        return _encode_source(
            source,
            out,
            format,
            encoder,
            model,
            split,
            limit,
            batch_size,
            progress,
            force,
            text_encoder,
            on_bad_image,
        )


def _encode_source(
    source: str | Path,
    out: str | Path,
    format: str | None,
    encoder: str | Encoder,
    model: str | None,
    split: str | None,
    limit: int | None,
    batch_size: int,
    progress: bool,
    force: bool,
    text_encoder: str | Encoder | None,
    on_bad_image: str,
) -> Collection:
    fmt = format or guess_format(source)
    encoder_name = encoder if isinstance(encoder, str) else encoder.name
    if not isinstance(encoder, str) and model is None:
        model = getattr(encoder, "model_id", None)
    fingerprint = source_fingerprint(source, fmt, split, limit, encoder_name, model)
    if text_encoder is not None:
        fingerprint["text_encoder"] = (
            text_encoder if isinstance(text_encoder, str) else text_encoder.name
        )
    if on_bad_image != "skip":  # only non-defaults: older fingerprints stay valid
        fingerprint["on_bad_image"] = on_bad_image
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
        on_bad_image=on_bad_image,
    )
