"""MTCNN face detection on real photographs (scikit-image's samples), NMS against a naive
reference, and damaged weights refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from sparsemm.encoders.faces import FaceDetector, load_weights, nms
from sparsemm.errors import SparsemmError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def detector() -> FaceDetector:
    return FaceDetector()


def test_faces_in_portraits_and_none_in_textures(detector: FaceDetector) -> None:
    data = pytest.importorskip("skimage.data", reason="scikit-image's sample photos")
    from PIL import Image

    astronaut = detector.detect(Image.fromarray(data.astronaut()))
    assert astronaut and astronaut[0].score > 0.95  # Eileen Collins
    x1, y1, x2, y2 = astronaut[0].box
    assert 100 < (x1 + x2) / 2 < 300 and 0 < (y1 + y2) / 2 < 200  # her face, upper left
    camera = detector.detect(Image.fromarray(data.camera()).convert("RGB"))
    assert camera and camera[0].score > 0.95  # the cameraman
    for texture in (data.gravel(), data.brick(), data.coins()):
        found = detector.detect(Image.fromarray(texture).convert("RGB"))
        assert all(f.score < 0.95 for f in found)


def test_large_photos_are_shrunk_and_boxes_come_back_in_their_pixels(
    detector: FaceDetector,
) -> None:
    data = pytest.importorskip("skimage.data", reason="scikit-image's sample photos")
    from PIL import Image

    img = Image.fromarray(data.astronaut()).resize((2048, 2048))
    faces = detector.detect(img)
    assert faces and faces[0].score > 0.95
    x1, _, x2, _ = faces[0].box
    assert 400 < (x1 + x2) / 2 < 1200 and x2 <= 2048 + 64


def test_nms_equals_a_naive_reference() -> None:
    rng = np.random.default_rng(0)
    xy = rng.uniform(0, 100, size=(60, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 40, size=(60, 2))], axis=1)
    scores = rng.random(60)

    def naive(iou: float) -> list[int]:
        order, keep = list(np.argsort(-scores, kind="stable")), []
        while order:
            i = order.pop(0)
            keep.append(int(i))
            rest = []
            for j in order:
                w = max(0.0, min(boxes[i, 2], boxes[j, 2]) - max(boxes[i, 0], boxes[j, 0]) + 1)
                h = max(0.0, min(boxes[i, 3], boxes[j, 3]) - max(boxes[i, 1], boxes[j, 1]) + 1)
                a_i = (boxes[i, 2] - boxes[i, 0] + 1) * (boxes[i, 3] - boxes[i, 1] + 1)
                a_j = (boxes[j, 2] - boxes[j, 0] + 1) * (boxes[j, 3] - boxes[j, 1] + 1)
                if w * h / (a_i + a_j - w * h) <= iou:
                    rest.append(j)
            order = rest
        return keep

    for iou in (0.3, 0.5, 0.7):
        assert nms(boxes, scores, iou).tolist() == naive(iou)
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.5).tolist() == []


def test_damaged_weights_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "mtcnn.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(SparsemmError, match="face detector weights"):
        load_weights(bad)
    import torch
    from safetensors.torch import save_file

    save_file({"pnet.conv1.weight": torch.zeros(1)}, str(bad))
    with pytest.raises(SparsemmError, match="do not fit MTCNN"):
        FaceDetector(weights=bad)
    with pytest.raises(SparsemmError):
        FaceDetector(min_face=4)
