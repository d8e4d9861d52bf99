"""The ImageNet concept model on a tiny fixture: item codes, query mapping, save/load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from fakes import term_word_encoder
from sparsemm.errors import SparsemmError
from sparsemm.models.concepts import ImageNetConceptModel, dimension_names, top_k_rows
from sparsemm.query.code_models import ConceptCodeModel, load_code_model

CLASSES = ["tabby, tabby cat", "tiger cat", "golden retriever", "coffee mug, mug", "crane"]
WORDS = ["tabby", "cat", "tiger", "golden", "retriever", "coffee", "mug", "crane", "person"]


def tiny_model(**config: object) -> ImageNetConceptModel:
    rng = np.random.default_rng(0)
    enc = term_word_encoder(WORDS)()
    enc.name, enc.dim = "keyword", len(WORDS)
    return ImageNetConceptModel.build(
        CLASSES,
        rng.normal(size=(len(CLASSES), 6)).astype(np.float32),
        rng.normal(size=len(CLASSES)).astype(np.float32),
        enc,
        **{"min_query_sim": 0.3, "query_margin": 0.2, **config},
    )


def query(model: ImageNetConceptModel, text: str) -> np.ndarray:
    enc = term_word_encoder(WORDS)()
    return model.encode_text(enc.encode_text([f"a photo of a {text}"])).toarray()[0]


def test_items_are_top_class_probabilities() -> None:
    model = tiny_model(item_top_k=2, min_prob=0.0)
    pooled = np.random.default_rng(1).normal(size=(3, 6)).astype(np.float32)
    probs = model.class_probabilities(pooled)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    codes = model.encode_pooled(pooled).toarray()
    for p, c in zip(probs, codes, strict=True):
        top = np.argsort(-p)[:2]
        assert set(np.flatnonzero(c)) == set(top)
        np.testing.assert_allclose(c[top], p[top], rtol=1e-6)
    # min_prob drops weak classes but never the best one
    sparse = top_k_rows(np.array([[0.5, 0.3, 0.2], [0.34, 0.33, 0.33]]), 3, 0.4).toarray()
    assert (sparse > 0).sum(axis=1).tolist() == [1, 1]


def test_query_maps_words_to_their_classes() -> None:
    model = tiny_model()
    cat = query(model, "cat")
    assert set(np.flatnonzero(cat)) == {0, 1}  # both cat classes, nothing else
    assert cat[0] == pytest.approx(cat[1])
    assert set(np.flatnonzero(query(model, "mug"))) == {3}
    assert not query(model, "person").any()  # no class: an empty code, not a guess


def test_dimension_names_are_unique() -> None:
    assert dimension_names(["crane", "crane", "mug, coffee mug"]) == [
        "crane (class 0)",
        "crane (class 1)",
        "mug",
    ]
    assert dimension_names(["crane, bird crane", "crane"])[0] == "crane (bird crane)"


def test_save_load_round_trip(tmp_path: Path) -> None:
    model = tiny_model()
    model.training_info = {"text_encoder": {"name": "keyword", "dim": len(WORDS)}}
    model.save_pretrained(tmp_path / "m")
    loaded = ImageNetConceptModel.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    assert loaded.training_info == model.training_info
    pooled = np.random.default_rng(2).normal(size=(4, 6)).astype(np.float32)
    np.testing.assert_array_equal(
        loaded.encode_pooled(pooled).toarray(), model.encode_pooled(pooled).toarray()
    )
    enc = term_word_encoder(WORDS)()
    emb = enc.encode_text(["a photo of a cat", "a photo of a coffee mug", "a photo of a crane"])
    np.testing.assert_array_equal(
        loaded.encode_text(emb).toarray(), model.encode_text(emb).toarray()
    )
    # dispatched like SR and VDR models
    code_model = load_code_model(tmp_path / "m")
    assert isinstance(code_model, ConceptCodeModel)
    assert code_model.dim_names() == [
        "tabby",
        "tiger cat",
        "golden retriever",
        "coffee mug",
        "crane",
    ]
    assert code_model.default_strategy == "filter"


def test_wrong_shapes_are_user_errors() -> None:
    model = tiny_model()
    with pytest.raises(SparsemmError, match="pooled features"):
        model.class_probabilities(np.zeros((2, 5), dtype=np.float32))
    with pytest.raises(SparsemmError, match="text embeddings"):
        model.encode_text(np.zeros((1, 3), dtype=np.float32))
