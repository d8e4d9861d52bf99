"""What the concept model reads from a collection's photos, kept in ``COLLECTION/concepts/``:
the pooled-feature norms of version 1 (``norms.json``) and the photo evidence of version 2
(``evidence.json``: whole-image class probabilities, the faces found and, with regions, the
tiles' class probabilities), each computed once per image version."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.data.sources import image_key
from sparsemm.errors import SparsemmError
from sparsemm.models.concepts import ConceptConfig, ImageNetConceptModel

log = logging.getLogger(__name__)

NORMS_DIR = "concepts"  # inside the collection folder
NORMS_FILE = "norms.json"


def read_norms(collection_root: str | Path) -> dict[str, float]:
    """The pooled-feature norms recorded for a collection's images (empty when none)."""
    from sparsemm.io import read_json

    path = Path(collection_root) / NORMS_DIR / NORMS_FILE
    if not path.is_file():
        return {}
    data = read_json(path)
    norms = data.get("norms") if isinstance(data, dict) else None
    if not isinstance(norms, dict):
        log.warning("%s is malformed; the norms will be recomputed", path)
        return {}
    return {str(k): float(v) for k, v in norms.items() if isinstance(v, int | float)}


def photo_key(item: dict[str, Any]) -> str:
    """What one photo's evidence is recorded under: its content (``sha256:...``), which a
    moved, renamed or copied photo keeps, when the collection records it (``sparsemm up``
    does), else its file version (:func:`~sparsemm.data.sources.image_key`)."""
    digest = item.get("sha256")
    return f"sha256:{digest}" if isinstance(digest, str) and digest else image_key(item["image"])


def _live_keys(root: Path) -> set[str]:
    """The keys of the images a collection holds now, by content and by file version (path,
    size, mtime): entries of other images are dropped from its per-photo tables."""
    from sparsemm.data.collection import open_collection

    return _keys_of(open_collection(root, verify=False).items)


def _keys_of(items: Sequence[dict[str, Any]]) -> set[str]:
    """The keys of ``items``' images, by content and by file version."""
    live: set[str] = set()
    for it in items:
        if it.get("sha256"):
            live.add(photo_key(it))
        if it.get("image"):
            try:
                live.add(image_key(it["image"]))
            except SparsemmError:
                continue
    return live


def record_norms(collection_root: str | Path, norms: dict[str, float]) -> None:
    """Merge ``norms`` into the collection's norm table (atomic write); entries of image
    versions the collection no longer holds are dropped."""
    from sparsemm.io import write_json

    root = Path(collection_root)
    merged = {**read_norms(root), **norms}
    live = _live_keys(root)
    (root / NORMS_DIR).mkdir(exist_ok=True)
    write_json(
        root / NORMS_DIR / NORMS_FILE,
        {"norms": {k: v for k, v in merged.items() if k in live}},
    )


def check_backbone_collection(collection: Any) -> None:
    """Raise SparsemmError unless the collection holds EfficientNet embeddings of images."""
    if (
        collection.manifest.get("image_kind") != "pixels"
        or collection.encoder_name != "efficientnet"
    ):
        raise SparsemmError(
            f"the ImageNet concept model codes EfficientNet-Lite0 image embeddings, but "
            f"{collection.root} holds {collection.manifest.get('image_kind')} embeddings from "
            f"{collection.encoder_name}; encode the images with `sparsemm encode PHOTOS -o COL "
            "--encoder efficientnet --text-encoder minilm` (or use `sparsemm up PHOTOS`)"
        )


def pooled_features(collection: Any, encoder: Any = None, progress: bool = False) -> np.ndarray:
    """(n_items, F) un-normalised pooled EfficientNet features of a collection's items:
    its unit embeddings times the recorded norms; norms not yet recorded are computed by
    running the backbone on those images (and recorded)."""
    check_backbone_collection(collection)
    emb = collection.image_embeddings()
    keys = []
    for it in collection.items:
        if not it.get("image"):
            raise SparsemmError(f"item {it['id']!r} of {collection.root} has no image path")
        keys.append(image_key(it["image"]))
    norms = read_norms(collection.root)
    missing = [i for i, k in enumerate(keys) if k not in norms]
    if missing:
        if encoder is None:
            from sparsemm.encoders.base import get_encoder

            model = collection.manifest["encoder"].get("model")
            kwargs = {"model": model} if model and model != "efficientnet-lite0" else {}
            encoder = get_encoder("efficientnet", **kwargs)
        log.info("computing pooled-feature norms of %d images", len(missing))
        raw = encoder.encode_image(
            [collection.items[i]["image"] for i in missing], normalize=False, progress=progress
        )
        fresh: dict[str, float] = {}
        for row, i in enumerate(missing):
            n = float(np.linalg.norm(raw[row]))
            # The file must still be the image the collection embedded.
            if n == 0.0 or float(raw[row] @ emb[i]) / n < 0.99:
                raise SparsemmError(
                    f"image {collection.items[i]['image']} changed since the collection was "
                    "encoded; re-encode it (sparsemm up / sparsemm encode --force)"
                )
            fresh[keys[i]] = n
        norms.update(fresh)
        try:
            record_norms(collection.root, fresh)
        except OSError as exc:  # a read-only collection still gets its codes
            log.warning("could not record image norms in %s (%s)", collection.root, exc)
    scale = np.asarray([norms[k] for k in keys], dtype=np.float32)
    return emb * scale[:, None]


# -- photo evidence (version 2) -----------------------------------------------------------

EVIDENCE_FILE = "evidence.json"  # in COLLECTION/concepts, keyed like the norms
EVIDENCE_FORMAT = "sparsemm.concept-evidence"
EVIDENCE_TOP = 20  # class probabilities kept per photo
# class probabilities kept over a photo's tiles: a thing a tile shows beside the tile's own
# subject (the table under the cup) often ranks past the 20th over all tiles
EVIDENCE_REGION_TOP = 40
FACE_MAX_SIDE = 800  # photos are shrunk to this before face detection
EVIDENCE_CHUNK = 32  # photos read between two writes of the evidence file


@dataclass(frozen=True)
class PhotoEvidence:
    """What the offline models see in one photo (version 2 of the concept model)."""

    classes: tuple[tuple[int, float], ...]  # top whole-image ImageNet class probabilities
    faces: tuple[float, ...] = ()  # face probabilities, best first (empty: no face found)
    # top classes by their largest probability over the photo's tiles (empty: not read)
    regions: tuple[tuple[int, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "c": [[int(c), round(float(p), 6)] for c, p in self.classes],
            "f": list(self.faces),
        }
        if self.regions:
            out["r"] = [[int(c), round(float(p), 6)] for c, p in self.regions]
        return out

    @classmethod
    def from_json(cls, data: Any) -> PhotoEvidence:
        if not isinstance(data, dict) or not isinstance(data.get("c"), list):
            raise ValueError("not a photo evidence entry")
        classes = tuple((int(c), float(p)) for c, p in data["c"])
        faces = tuple(float(f) for f in data.get("f", []))
        regions = tuple((int(c), float(p)) for c, p in data.get("r", []))
        for _, p in classes + regions:
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"class probability {p} out of [0, 1]")
        for f in faces:
            if not 0.0 <= f <= 1.0:
                raise ValueError(f"face probability {f} out of [0, 1]")
        return cls(classes, faces, regions)


def evidence_source(model: ImageNetConceptModel) -> dict[str, Any]:
    """What the stored evidence was computed with (the model's classifier head, the face
    detector, the settings): evidence from other weights or settings is computed again."""
    import hashlib

    from sparsemm.encoders.faces import WEIGHTS_SHA256

    head = hashlib.sha256(model.fc_weight.tobytes() + model.fc_bias.tobytes())
    out: dict[str, Any] = {
        "classifier": head.hexdigest()[:16],
        "faces": WEIGHTS_SHA256[:16],
        "image_size": int(model.config.image_size),
        "face_max_side": FACE_MAX_SIDE,
        "top": EVIDENCE_TOP,
        "orientation": "exif",  # photos read upright (evidence from sideways pixels is redone)
    }
    if model.config.regions:
        out["tiles"] = [float(model.config.tile_fraction), int(model.config.max_tiles)]
        out["region_top"] = EVIDENCE_REGION_TOP
        if model.config.small_tile_fraction:
            cfg = model.config
            out["small_tiles"] = [float(cfg.small_tile_fraction), int(cfg.small_max_tiles)]
    return out


class EvidenceReader:
    """Computes :class:`PhotoEvidence` from image files: one decode per photo (JPEG
    draft-decoded near the size needed), the backbone's pooled features of the whole image
    through ``model``'s classifier head, and the face detector."""

    def __init__(
        self, model: ImageNetConceptModel, backbone: Any = None, faces: Any = None
    ) -> None:
        from sparsemm.encoders.base import get_encoder
        from sparsemm.encoders.faces import FaceDetector

        self.model = model
        self.backbone: Any = backbone if backbone is not None else get_encoder("efficientnet")
        self.faces = faces if faces is not None else FaceDetector(max_side=FACE_MAX_SIDE)
        self.source = evidence_source(model)

    def read(self, images: Sequence[Any], progress: bool = False) -> list[PhotoEvidence]:
        from tqdm.auto import tqdm

        from sparsemm.encoders.hf import load_image

        out = []
        cfg = self.model.config
        side = int(cfg.image_size)
        desc = "classes, regions and faces" if cfg.regions else "classes and faces"
        for img in tqdm(list(images), desc=desc, disable=not progress, unit="img"):
            pil = load_image(img, max_side=FACE_MAX_SIDE)
            pooled = self.backbone.pooled_full([pil], side=side)
            probs = self.model.class_probabilities(pooled)[0]
            regions: tuple[tuple[int, float], ...] = ()
            if cfg.regions:
                crops = [pil.crop(box) for box in tile_boxes(pil.size, cfg)]
                tile_probs = self.model.class_probabilities(
                    self.backbone.pooled_squares(crops, side=side)
                ).max(axis=0)
                regions = _top_pairs(tile_probs, EVIDENCE_REGION_TOP)
            faces = tuple(round(f.score, 6) for f in self.faces.detect(pil))
            out.append(PhotoEvidence(_top_pairs(probs), faces, regions))
        return out


def _top_pairs(probs: np.ndarray, k: int = EVIDENCE_TOP) -> tuple[tuple[int, float], ...]:
    top = np.argsort(-probs, kind="stable")[:k]
    return tuple((int(c), round(float(probs[c]), 6)) for c in top)


def tile_boxes(size: tuple[int, int], cfg: ConceptConfig) -> list[tuple[int, int, int, int]]:
    """Square tiles (left, top, right, bottom) covering a ``size`` = (w, h) photo: side
    ``tile_fraction`` of the shorter side, two along the shorter side and up to
    ``max_tiles`` along the longer one (overlapping by at least a quarter); then, with
    ``small_tile_fraction``, a finer grid of tiles of that side, up to ``small_max_tiles``
    along each side. ``max_tiles`` 0 leaves out the first grid (the finer one alone)."""
    boxes = _grid(size, cfg.tile_fraction, cfg.max_tiles, 2) if cfg.max_tiles else []
    if cfg.small_tile_fraction:
        boxes += _grid(size, cfg.small_tile_fraction, cfg.small_max_tiles, cfg.small_max_tiles)
    return boxes


def _grid(
    size: tuple[int, int], fraction: float, max_long: int, max_short: int
) -> list[tuple[int, int, int, int]]:
    """Square tiles of side ``fraction`` of the shorter side, as few along each side as
    overlap by at least a quarter (at most ``max_long`` / ``max_short``), spread evenly."""
    w, h = int(size[0]), int(size[1])
    short, long_ = min(w, h), max(w, h)
    s = max(1, round(short * fraction))

    def count(extent: int, most: int) -> int:
        return 1 if extent <= s else min(most, math.ceil((extent - s) / (0.75 * s)) + 1)

    n_long, n_short = count(long_, max_long), count(short, max_short)
    boxes = []
    for i in range(n_long):
        a = round(i * (long_ - s) / (n_long - 1)) if n_long > 1 else (long_ - s) // 2
        for j in range(n_short):
            b = round(j * (short - s) / (n_short - 1)) if n_short > 1 else (short - s) // 2
            x, y = (a, b) if w >= h else (b, a)
            boxes.append((x, y, x + s, y + s))
    return boxes


def read_evidence(collection_root: str | Path, source: dict[str, Any]) -> dict[str, PhotoEvidence]:
    """The photo evidence recorded for a collection's images (empty when none, or when it
    was computed with other weights or settings than ``source``)."""
    from sparsemm.io import read_json

    path = Path(collection_root) / NORMS_DIR / EVIDENCE_FILE
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except (SparsemmError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        log.warning("%s is unreadable (%s); the evidence will be computed again", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("format") != EVIDENCE_FORMAT:
        log.warning("%s is malformed; the evidence will be computed again", path)
        return {}
    if data.get("source") != source:
        return {}
    out: dict[str, PhotoEvidence] = {}
    items, checks = data.get("items"), data.get("sha256")
    checks = checks if isinstance(checks, dict) else {}
    unchecked = 0
    for key, entry in items.items() if isinstance(items, dict) else []:
        if checks.get(key) != evidence_entry_digest(key, entry):
            unchecked += 1  # edited, swapped with another photo's, or from before checksums
            continue
        try:
            out[str(key)] = PhotoEvidence.from_json(entry)
        except (ValueError, TypeError):
            continue  # a damaged entry is computed again
    if unchecked:
        log.warning(
            "%s: %d photo(s) have no valid checksum for their evidence (edited, damaged or "
            "written by an older sparsemm); it is computed again",
            path,
            unchecked,
        )
    return out


def evidence_entry_digest(key: str, entry: Any) -> str:
    """The checksum of one photo's evidence, tied to its image key: an entry moved to
    another photo, or edited, no longer matches it."""
    from sparsemm.io import json_sha256

    return json_sha256([key, entry])[:32]


def record_evidence(
    collection_root: str | Path,
    fresh: dict[str, PhotoEvidence],
    source: dict[str, Any],
    keep: Iterable[str] = (),
) -> None:
    """Merge ``fresh`` into the collection's evidence (atomic write); entries of image
    versions the collection no longer holds are dropped, but for the keys in ``keep``
    (photos read ahead of the collection that will hold them: :func:`read_ahead`)."""
    from sparsemm.io import write_json

    root = Path(collection_root)
    merged = {**read_evidence(root, source), **fresh}
    live = _live_keys(root) | set(keep)
    (root / NORMS_DIR).mkdir(exist_ok=True)
    items = {k: v.to_json() for k, v in sorted(merged.items()) if k in live}
    write_json(
        root / NORMS_DIR / EVIDENCE_FILE,
        {
            "format": EVIDENCE_FORMAT,
            "version": 1,
            "source": source,
            "items": items,
            "sha256": {k: evidence_entry_digest(k, v) for k, v in items.items()},
        },
    )


def photo_evidence(
    collection: Any, reader: EvidenceReader, progress: bool = False
) -> list[PhotoEvidence]:
    """The evidence of every item of a collection of photos, computed with ``reader`` for
    the images that have none recorded yet (and recorded)."""
    if collection.manifest.get("image_kind") != "pixels":
        raise SparsemmError(
            f"the photo concept model reads images, but {collection.root} holds "
            f"{collection.manifest.get('image_kind')} embeddings; encode a folder of images "
            "(sparsemm up PHOTOS, or sparsemm encode PHOTOS -o COL)"
        )
    for it in collection.items:
        if not it.get("image"):
            raise SparsemmError(f"item {it['id']!r} of {collection.root} has no image path")
    return _evidence_of(collection.root, collection.items, reader, progress, ahead=False)


def read_ahead(
    collection_root: str | Path,
    items: Sequence[dict[str, Any]],
    reader: EvidenceReader,
    progress: bool = False,
) -> None:
    """Read and record the evidence of ``items``, photos the collection at
    ``collection_root`` does not hold yet (``sparsemm up`` about to add them), so that
    coding them once they are in costs no photo read: the collection keeps matching its
    index (and answering searches) while the photos are read."""
    _evidence_of(Path(collection_root), items, reader, progress, ahead=True)


def _evidence_of(
    root: Path,
    items: Sequence[dict[str, Any]],
    reader: EvidenceReader,
    progress: bool,
    ahead: bool,
) -> list[PhotoEvidence]:
    """The evidence of ``items`` (image files), read with ``reader`` for those that have
    none recorded in the collection at ``root`` yet, and recorded every
    :data:`EVIDENCE_CHUNK` photos, so a run stopped midway resumes where it was; ``ahead``:
    the items are not in the collection yet (their keys are kept all the same)."""
    keys = [photo_key(it) for it in items]
    known = read_evidence(root, reader.source)
    # entries of photos read ahead and since changed or removed are dropped once the
    # collection holds its photos: the file is rewritten when it holds a key no item has
    stale = not ahead and bool(set(known) - _keys_of(items))
    pending = _by_file_version(items, keys, known)  # recorded under content keys
    known.update(pending)
    missing = [i for i, k in enumerate(keys) if k not in known]
    if missing:
        log.info("reading concepts in %d photos", len(missing))
    from tqdm.auto import tqdm

    keep = set(keys) if ahead else set()
    writable = True
    regions = getattr(getattr(getattr(reader, "model", None), "config", None), "regions", False)
    desc = "classes, regions and faces" if regions else "classes and faces"
    bar = tqdm(total=len(missing), desc=desc, disable=not (progress and missing), unit="img")
    for at in range(0, len(missing), EVIDENCE_CHUNK):
        part = missing[at : at + EVIDENCE_CHUNK]
        got = reader.read([items[i]["image"] for i in part])
        bar.update(len(part))
        fresh = {keys[i]: ev for i, ev in zip(part, got, strict=True)}
        known.update(fresh)
        pending.update(fresh)
        if writable:
            writable, pending = _record(root, pending, reader.source, keep), {}
    bar.close()
    if (pending or (stale and not missing)) and writable:
        _record(root, pending, reader.source, keep)
    return [known[k] for k in keys]


def _by_file_version(
    items: Sequence[dict[str, Any]], keys: list[str], known: dict[str, PhotoEvidence]
) -> dict[str, PhotoEvidence]:
    """Evidence recorded under a photo's file version (before photos carried their digest)
    that its content key lacks: found once, then recorded under the content key."""
    out: dict[str, PhotoEvidence] = {}
    for it, key in zip(items, keys, strict=True):
        if key in known or not key.startswith("sha256:"):
            continue
        try:
            old = image_key(it["image"])
        except SparsemmError:
            continue
        if old in known:
            out[key] = known[old]
    return out


def _record(
    root: Path, fresh: dict[str, PhotoEvidence], source: dict[str, Any], keep: set[str]
) -> bool:
    """Record ``fresh``; False when the collection cannot be written (it still gets its
    codes)."""
    try:
        record_evidence(root, fresh, source, keep)
    except OSError as exc:
        log.warning("could not record the photo evidence in %s (%s)", root, exc)
        return False
    return True
