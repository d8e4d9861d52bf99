"""Offline face detection: MTCNN, so that photos without captions can answer "person".

MTCNN (Zhang, Zhang, Li and Qiao, "Joint Face Detection and Alignment using Multi-task
Cascaded Convolutional Networks", IEEE SPL 2016) runs three small networks in a cascade:

1. **P-Net**, fully convolutional, slides over an image pyramid (scale factor 0.709, the
   smallest face ``min_face`` pixels) and proposes 12x12 windows with a face probability
   and a box correction; proposals are merged by non-maximum suppression (NMS);
2. **R-Net** re-scores each proposal cropped to 24x24;
3. **O-Net** re-scores the survivors at 48x48 (it also gives five landmarks, unused here).

The networks are written here from the paper and the key names and shapes of the weights.
The weights are those of the MIT-licensed ``facenet-pytorch`` 2.6.0 wheel (ported from
Zhang et al.'s release through David Sandberg's ``facenet``), converted once to
safetensors by ``scripts/derive_mtcnn.py`` and shipped in the package
(``encoders/data/mtcnn.safetensors``, licence in ``encoders/data/MTCNN-LICENSE``); their
SHA-256 is checked on load. Two conventions of those weights: pixels enter as
``(p - 127.5) / 128`` in RGB order, and the dense layers of R-Net and O-Net read their
input flattened in (width, height, channel) order (the original Caffe models saw images
transposed).

:class:`FaceDetector` gives, per image, the faces found (box and probability); the concept
model reads the largest probability as the evidence that a person is in the photo. Faces
turned away, tiny or hidden are not found: a photo of a person seen from behind has no
"person" evidence (docs/own-photos.md).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sparsemm.errors import SparsemmError

WEIGHTS_FILE = "mtcnn.safetensors"
# SHA-256 of the shipped weights (scripts/derive_mtcnn.py prints it)
WEIGHTS_SHA256 = "45209c89a01a216d7ae9baf3fa8e506dfb0e8ff1269007ce26e28338a9148cd3"


def _flatten_whc(x: torch.Tensor) -> torch.Tensor:
    """(n, c, h, w) -> (n, w * h * c): the dense layers' input order of these weights."""
    return x.permute(0, 3, 2, 1).reshape(len(x), -1)


class PNet(nn.Module):
    """Proposal network: 12x12 receptive field, stride 2; outputs (face logits, box deltas)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, 1)
        self.conv4_2 = nn.Conv2d(32, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 2, 2, ceil_mode=True)
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_1(x), self.conv4_2(x)


class RNet(nn.Module):
    """Refinement network on 24x24 crops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 28, 3), nn.PReLU(28)
        self.conv2, self.prelu2 = nn.Conv2d(28, 48, 3), nn.PReLU(48)
        self.conv3, self.prelu3 = nn.Conv2d(48, 64, 2), nn.PReLU(64)
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu2(self.conv2(x)), 3, 2, ceil_mode=True)
        x = self.prelu4(self.dense4(_flatten_whc(self.prelu3(self.conv3(x)))))
        return self.dense5_1(x), self.dense5_2(x)


class ONet(nn.Module):
    """Output network on 48x48 crops (its landmark head ``dense6_3`` is loaded, not used)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.max_pool2d(self.prelu1(self.conv1(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu2(self.conv2(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.prelu3(self.conv3(x)), 2, 2, ceil_mode=True)
        x = self.prelu5(self.dense5(_flatten_whc(self.prelu4(self.conv4(x)))))
        return self.dense6_1(x), self.dense6_2(x)


@dataclass(frozen=True)
class Face:
    """One detected face: box (x1, y1, x2, y2) in the image's pixels, and its probability."""

    box: tuple[float, float, float, float]
    score: float


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float, mode: str = "union") -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, best first. ``mode="min"`` divides
    the overlap by the smaller box (the cascade's last stage, as in the paper's code)."""
    if not len(boxes):
        return np.zeros(0, dtype=np.int64)
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    area = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while len(order):
        i, rest = order[0], order[1:]
        keep.append(i)
        w = np.maximum(0.0, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + 1)
        inter = w * h
        denom = np.minimum(area[i], area[rest]) if mode == "min" else area[i] + area[rest] - inter
        order = rest[inter / denom <= iou]
    return np.asarray(keep, dtype=np.int64)


def _regress(boxes: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Apply box corrections (fractions of the box's width and height)."""
    w = boxes[:, 2] - boxes[:, 0] + 1
    h = boxes[:, 3] - boxes[:, 1] + 1
    out = boxes.copy()
    out[:, 0] += deltas[:, 0] * w
    out[:, 1] += deltas[:, 1] * h
    out[:, 2] += deltas[:, 2] * w
    out[:, 3] += deltas[:, 3] * h
    return out


def _square(boxes: np.ndarray) -> np.ndarray:
    """Boxes made square around their centres (side = the longer side)."""
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    side = np.maximum(w, h)
    out = boxes.copy()
    out[:, 0] = boxes[:, 0] + w * 0.5 - side * 0.5
    out[:, 1] = boxes[:, 1] + h * 0.5 - side * 0.5
    out[:, 2] = out[:, 0] + side
    out[:, 3] = out[:, 1] + side
    return out


def load_weights(path: Any = None) -> dict[str, torch.Tensor]:
    """The three networks' state dicts in one flat dict (``pnet.conv1.weight`` ...), read
    from safetensors and checked against :data:`WEIGHTS_SHA256` (a damaged file is refused)."""
    from safetensors.torch import load as load_bytes

    if path is None:
        data = resources.files("sparsemm.encoders").joinpath("data", WEIGHTS_FILE).read_bytes()
        if hashlib.sha256(data).hexdigest() != WEIGHTS_SHA256:
            raise SparsemmError(
                f"the packaged face detector weights ({WEIGHTS_FILE}) are damaged; reinstall "
                "sparsemm"
            )
    else:
        data = open(path, "rb").read()
    try:
        return load_bytes(data)
    except Exception as exc:  # safetensors raises its own error types
        raise SparsemmError(f"cannot read face detector weights ({exc})") from exc


class FaceDetector:
    """MTCNN face detection on CPU (see the module docstring).

    ``min_face``: smallest face side in pixels after the image is shrunk to at most
    ``max_side`` pixels on its longer side (large photos are shrunk first: a 4000-pixel
    pyramid costs seconds); ``thresholds``: probability each stage needs.
    """

    def __init__(
        self,
        weights: Any = None,
        min_face: int = 20,
        max_side: int = 800,
        thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7),
        factor: float = 0.709,
    ) -> None:
        if min_face < 12 or max_side < 48 or not 0.0 < factor < 1.0:
            raise SparsemmError("min_face >= 12, max_side >= 48 and 0 < factor < 1 required")
        state = load_weights(weights)
        self.pnet, self.rnet, self.onet = PNet(), RNet(), ONet()
        for name, net in (("pnet", self.pnet), ("rnet", self.rnet), ("onet", self.onet)):
            sub = {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")}
            try:
                net.load_state_dict(sub, strict=True)
            except RuntimeError as exc:
                raise SparsemmError(f"the face detector weights do not fit MTCNN ({exc})") from exc
            net.eval()
        self.min_face = int(min_face)
        self.max_side = int(max_side)
        self.thresholds = tuple(float(t) for t in thresholds)
        self.factor = float(factor)

    def _pixels(self, image: Any) -> tuple[torch.Tensor, float]:
        """(1, 3, h, w) network input of a PIL image shrunk to ``max_side``, and the factor
        back to the original pixels."""
        img = image.convert("RGB")
        scale = min(1.0, self.max_side / max(img.size))
        if scale < 1.0:
            size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
            img = img.resize(size, resample=2)  # bilinear, antialiased when shrinking
        arr = np.asarray(img, dtype=np.float32)
        x = torch.from_numpy((arr - 127.5) / 128.0).permute(2, 0, 1)[None].contiguous()
        return x, 1.0 / scale

    def _proposals(self, x: torch.Tensor) -> np.ndarray:
        """Stage 1: (m, 5) boxes (x1, y1, x2, y2, score) over the image pyramid."""
        h, w = x.shape[2:]
        m = 12.0 / self.min_face
        side = min(h, w) * m
        out = []
        scale = m
        while side >= 12:
            sh, sw = max(12, math.ceil(h * scale)), max(12, math.ceil(w * scale))
            level = F.interpolate(x, size=(sh, sw), mode="area")
            logits, deltas = self.pnet(level)
            prob = logits.softmax(dim=1)[0, 1].numpy()
            ys, xs = np.nonzero(prob >= self.thresholds[0])
            if len(ys):
                boxes = np.stack(
                    [
                        np.floor((2 * xs + 1) / scale),
                        np.floor((2 * ys + 1) / scale),
                        np.floor((2 * xs + 12) / scale),
                        np.floor((2 * ys + 12) / scale),
                        prob[ys, xs],
                    ],
                    axis=1,
                )
                d = deltas[0].numpy()[:, ys, xs].T  # (m, 4)
                keep = nms(boxes[:, :4], boxes[:, 4], 0.5)
                out.append(np.concatenate([boxes[keep], d[keep]], axis=1))
            scale *= self.factor
            side *= self.factor
        if not out:
            return np.zeros((0, 5), dtype=np.float64)
        allb = np.concatenate(out)
        keep = nms(allb[:, :4], allb[:, 4], 0.7)
        allb = allb[keep]
        boxes = _square(_regress(allb[:, :4], allb[:, 5:9]))
        return np.concatenate([boxes, allb[:, 4:5]], axis=1)

    @staticmethod
    def _crops(x: torch.Tensor, boxes: np.ndarray, size: int) -> torch.Tensor:
        """(m, 3, size, size) crops of ``boxes`` (zero outside the image)."""
        h, w = x.shape[2:]
        crops = []
        for x1, y1, x2, y2 in np.round(boxes[:, :4]).astype(np.int64):
            bw, bh = max(1, x2 - x1 + 1), max(1, y2 - y1 + 1)
            patch = torch.zeros((1, 3, bh, bw))
            sx1, sy1, sx2, sy2 = max(0, x1), max(0, y1), min(w, x2 + 1), min(h, y2 + 1)
            if sx2 > sx1 and sy2 > sy1:
                patch[:, :, sy1 - y1 : sy2 - y1, sx1 - x1 : sx2 - x1] = x[:, :, sy1:sy2, sx1:sx2]
            crops.append(F.interpolate(patch, size=(size, size), mode="area"))
        return torch.cat(crops) if crops else torch.zeros((0, 3, size, size))

    def _refine(
        self, x: torch.Tensor, boxes: np.ndarray, net: nn.Module, size: int, stage: int
    ) -> np.ndarray:
        if not len(boxes):
            return boxes
        logits, deltas = net(self._crops(x, boxes, size))
        prob = logits.softmax(dim=1)[:, 1].numpy()
        keep = prob >= self.thresholds[stage]
        boxes = _regress(boxes[keep, :4], deltas.numpy()[keep])
        scored = np.concatenate([boxes, prob[keep, None]], axis=1)
        idx = nms(scored[:, :4], scored[:, 4], 0.7, "min" if stage == 2 else "union")
        scored = scored[idx]
        if stage == 1:
            scored[:, :4] = _square(scored[:, :4])
        return scored

    def detect(self, image: Any) -> list[Face]:
        """Faces in one PIL image, most probable first."""
        x, back = self._pixels(image)
        with torch.inference_mode():
            boxes = self._proposals(x)
            boxes = self._refine(x, boxes, self.rnet, 24, 1)
            boxes = self._refine(x, boxes, self.onet, 48, 2)
        order = np.argsort(-boxes[:, 4], kind="stable") if len(boxes) else np.zeros(0, np.int64)
        return [
            Face(tuple(float(v) * back for v in boxes[i, :4]), float(boxes[i, 4]))  # type: ignore[arg-type]
            for i in order
        ]
