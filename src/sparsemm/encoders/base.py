"""The encoder protocol and registry.

An encoder maps texts and/or images to float32 ``(n, dim)`` arrays, L2-normalised by default.
A modality it does not support raises SparsemmError.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.lru import LRUCache

ImageInput = Any  # PIL.Image.Image | str | Path


@runtime_checkable
class Encoder(Protocol):
    name: str
    dim: int

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray: ...

    def encode_image(
        self,
        images: Sequence[ImageInput],
        batch_size: int = 32,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray: ...


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
            return self.base.encode_text(texts, batch_size, normalize=False, progress=progress)
        found = {t: self.cache.get(t) for t in dict.fromkeys(texts)}
        missing = [t for t, e in found.items() if e is None]
        if missing:
            emb = np.asarray(
                self.base.encode_text(missing, batch_size, progress=progress), dtype=np.float32
            )
            for t, e in zip(missing, emb, strict=True):
                self.cache[t] = found[t] = e
        if not texts:
            return np.zeros((0, int(self.base.dim)), dtype=np.float32)
        return np.stack([found[t] for t in texts])


def available_encoders() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_encoder(name: str, **kwargs: Any) -> Encoder:
    """Build a registered encoder by name (``minilm``, ``clip``, ``blip``, ``precomputed``)."""
    _load_builtin()
    if name not in _REGISTRY:
        raise SparsemmError(f"unknown encoder {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**kwargs)


# Row-wise L2 normalisation of encoder outputs (n, d) -> float32, zero rows stay zero.
l2_normalize = normalize_rows


def _load_builtin() -> None:
    # Importing the adapter modules registers them; heavy deps load lazily inside each.
    import importlib

    for mod in ("minilm", "hf", "precomputed", "efficientnet"):
        try:
            importlib.import_module(f"sparsemm.encoders.{mod}")
        except ModuleNotFoundError as exc:  # pragma: no cover - module not written yet
            if exc.name != f"sparsemm.encoders.{mod}":
                raise
