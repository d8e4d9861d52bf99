"""The encoder protocols and registry.

An encoder maps texts and/or images to float32 ``(n, dim)`` arrays, L2-normalised by default:
a :class:`TextEncoder` has ``encode_text``, an :class:`ImageEncoder` has ``encode_image``,
and an encoder of both modalities (CLIP, BLIP) is both. A text-only encoder does not define
``encode_image`` (nor an image-only one ``encode_text``); :func:`modalities` says what an
encoder embeds, and :func:`as_text_encoder` / :func:`as_image_encoder` turn a wrong modality
into one clear SparsemmError.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias, cast, runtime_checkable

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.lru import LRUCache

ImageInput = Any  # PIL.Image.Image | str | Path


@runtime_checkable
class TextEncoder(Protocol):
    """Embeds texts."""

    name: str
    dim: int

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray: ...


@runtime_checkable
class ImageEncoder(Protocol):
    """Embeds images (PIL images or paths)."""

    name: str
    dim: int

    def encode_image(
        self,
        images: Sequence[ImageInput],
        batch_size: int = 32,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray: ...


# Any registered encoder: one modality or both.
Encoder: TypeAlias = TextEncoder | ImageEncoder

MODALITIES = ("text", "image")
# What to use instead, when an encoder lacks the modality a caller needs.
_OTHER = {
    "text": "use a text encoder (--encoder minilm, clip or blip, or --text-encoder minilm)",
    "image": "use an image encoder (--encoder clip, blip or efficientnet)",
}


def modalities(encoder: Any) -> tuple[str, ...]:
    """What ``encoder`` embeds, a subset of ``("text", "image")``: its ``modalities``
    attribute when it has one (an encoder that knows only once built, e.g. a table of
    precomputed rows, or a wrapper that serves one side), else the ``encode_text`` /
    ``encode_image`` methods it defines."""
    declared = getattr(encoder, "modalities", None)
    if declared is not None:
        return tuple(declared)
    return tuple(m for m in MODALITIES if callable(getattr(encoder, f"encode_{m}", None)))


def _require(encoder: Any, modality: str, hint: str | None) -> None:
    if modality in modalities(encoder):
        return
    has = " and ".join("images" if m == "image" else m for m in modalities(encoder)) or "nothing"
    name = getattr(encoder, "name", type(encoder).__name__)
    raise SparsemmError(
        f"the {name} encoder embeds {has} only, not {modality}s; {hint or _OTHER[modality]}"
    )


def as_text_encoder(encoder: Any, hint: str | None = None) -> TextEncoder:
    """``encoder`` when it embeds texts; otherwise SparsemmError saying what it embeds and
    what to do (``hint``, else which encoders to use)."""
    _require(encoder, "text", hint)
    return cast(TextEncoder, encoder)


def as_image_encoder(encoder: Any, hint: str | None = None) -> ImageEncoder:
    """``encoder`` when it embeds images; otherwise SparsemmError saying what it embeds and
    what to do (``hint``, else which encoders to use)."""
    _require(encoder, "image", hint)
    return cast(ImageEncoder, encoder)


_REGISTRY: dict[str, Callable[..., Encoder]] = {}


def register_encoder(name: str) -> Callable[[Callable[..., Encoder]], Callable[..., Encoder]]:
    def deco(factory: Callable[..., Encoder]) -> Callable[..., Encoder]:
        _REGISTRY[name] = factory
        return factory

    return deco


class CachedTextEncoder:
    """``base`` with a bounded cache of its text embeddings, for one encoder that several
    readers share: the searcher's aligned dense space and the SR query coder both embed a
    query's texts with the same backbone, which then runs once per text rather than twice.
    Everything but ``encode_text`` is ``base``'s own. Only default calls (unit rows) are
    cached; ``normalize=False`` goes to ``base`` every time."""

    def __init__(self, base: Any, size: int = 4096) -> None:
        self.base = base
        self.cache = LRUCache(size)  # text -> (dim,) float32 unit embedding

    def __getattr__(self, name: str) -> Any:  # name, dim, encode_image, ...
        return getattr(self.base, name)

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        texts = list(texts)
        if not normalize:
            base = as_text_encoder(self.base)
            return base.encode_text(texts, batch_size, normalize=False, progress=progress)
        found = {t: self.cache.get(t) for t in dict.fromkeys(texts)}
        missing = [t for t, e in found.items() if e is None]
        if missing:
            base = as_text_encoder(self.base)
            emb = np.asarray(base.encode_text(missing, batch_size, progress=progress), np.float32)
            for t, e in zip(missing, emb, strict=True):
                self.cache[t] = found[t] = e
        if not texts:
            return np.zeros((0, int(self.base.dim)), dtype=np.float32)
        return np.stack([found[t] for t in texts])


def available_encoders() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_encoder(name: str, **kwargs: Any) -> Encoder:
    """Build a registered encoder by name (``minilm``, ``clip``, ``blip``, ``precomputed``).

    A built-in name imports its own adapter module only: a search's MiniLM does not import
    the Hugging Face adapters (and their progress-bar and asyncio imports)."""
    home = _BUILTIN_HOMES.get(name)
    if home is not None:
        _import_builtin(home)
    if name not in _REGISTRY:
        _load_builtin()
    if name not in _REGISTRY:
        raise SparsemmError(f"unknown encoder {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**kwargs)


def collection_encoder(info: dict[str, Any], dim: int, side: str) -> Encoder:
    """The encoder a collection manifest names for its ``side`` ("images" or "texts"),
    checked to give the collection's ``dim``-d vectors. A text encoder gets the recorded
    model; an image encoder only a local model folder (a packaged one, efficientnet-lite0,
    is recorded by its name)."""
    model = info.get("model")
    local = bool(model) and Path(str(model)).expanduser().is_dir()
    kwargs = {"model": model} if model and (side == "texts" or local) else {}
    enc = get_encoder(str(info["name"]), **kwargs)
    if int(enc.dim) != dim:
        raise SparsemmError(
            f"the {info['name']} encoder gives {enc.dim}-d vectors but the collection's "
            f"{side} are {dim}-d; re-encode the collection"
        )
    return enc


# Row-wise L2 normalisation of encoder outputs (n, d) -> float32, zero rows stay zero.
l2_normalize = normalize_rows


# The module of sparsemm.encoders that registers each built-in encoder name.
_BUILTIN_HOMES = {
    "minilm": "minilm",
    "clip": "hf",
    "blip": "hf",
    "siglip": "hf",
    "precomputed": "precomputed",
    "efficientnet": "efficientnet",
}


def _import_builtin(mod: str) -> None:
    # Importing an adapter module registers it; heavy deps load lazily inside each.
    import importlib

    try:
        importlib.import_module(f"sparsemm.encoders.{mod}")
    except ModuleNotFoundError as exc:  # pragma: no cover - module not written yet
        if exc.name != f"sparsemm.encoders.{mod}":
            raise


def _load_builtin() -> None:
    for mod in dict.fromkeys(_BUILTIN_HOMES.values()):
        _import_builtin(mod)
