"""The encoder protocols: an encoder defines only the modalities it embeds, and a caller
that needs the other one gets one clear SparsemmError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparsemm.data.encode import encode_items
from sparsemm.encoders.base import (
    CachedTextEncoder,
    Encoder,
    ImageEncoder,
    TextEncoder,
    as_image_encoder,
    as_text_encoder,
    modalities,
)
from sparsemm.encoders.batching import BatchingTextEncoder
from sparsemm.errors import SparsemmError


class Words:
    """Text only: no encode_image."""

    name, dim = "words", 2

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):  # type: ignore[no-untyped-def]
        out = np.array([[len(t), 1.0] for t in texts], dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True) if normalize else out


class Pixels:
    """Image only: no encode_text."""

    name, dim = "pixels", 2

    def encode_image(self, images, batch_size=32, normalize=True, progress=False):  # type: ignore[no-untyped-def]
        return np.ones((len(images), 2), dtype=np.float32) / np.sqrt(2.0)


class Table(Words, Pixels):
    """Both methods, but it says it serves images only (decided when it is built)."""

    name = "table"
    modalities = ("image",)


def test_modalities_follow_the_methods_or_what_the_encoder_says() -> None:
    assert modalities(Words()) == ("text",)
    assert modalities(Pixels()) == ("image",)
    assert modalities(Table()) == ("image",)
    assert isinstance(Words(), TextEncoder) and not isinstance(Words(), ImageEncoder)
    assert isinstance(Pixels(), ImageEncoder) and isinstance(Pixels(), Encoder)
    # a wrapper forwards what it does not define: it embeds what its base embeds
    assert modalities(CachedTextEncoder(Words())) == ("text",)


def test_a_wrong_modality_is_one_clear_error() -> None:
    words, pixels = Words(), Pixels()
    assert as_text_encoder(words) is words and as_image_encoder(pixels) is pixels
    with pytest.raises(SparsemmError, match="words encoder embeds text only, not images; use"):
        as_image_encoder(words)
    with pytest.raises(SparsemmError, match="pixels encoder embeds images only, not texts; use"):
        as_text_encoder(pixels)
    with pytest.raises(SparsemmError, match="images only, not texts; embed captions"):
        as_text_encoder(Table(), hint="embed captions elsewhere")
    # the text wrappers around an image-only encoder say so too (not an AttributeError)
    with pytest.raises(SparsemmError, match="pixels encoder embeds images only"):
        CachedTextEncoder(pixels).encode_text(["a cat"])
    batching = BatchingTextEncoder(pixels)
    try:
        with pytest.raises(SparsemmError, match="pixels encoder embeds images only"):
            batching.encode_text(["a cat"])
    finally:
        batching.close()


def test_a_text_only_encoder_gives_caption_views(tmp_path: Path) -> None:
    items = [
        {"id": "a", "image": str(tmp_path / "a.png"), "captions": ["a cat", "a small cat"]},
        {"id": "b", "image": str(tmp_path / "b.png"), "captions": ["a dog"]},
    ]
    col = encode_items(items, Words(), tmp_path / "col", progress=False)
    assert col.manifest["image_kind"] == "caption_view" and col.ids == ["a", "b"]


def test_a_builtin_encoder_imports_its_own_module_only() -> None:
    # MiniLM for a search's query texts: the Hugging Face adapters (and their tqdm/asyncio
    # imports) are not loaded; every built-in name still resolves, an unknown one is refused
    import subprocess
    import sys

    code = (
        "import sys; from sparsemm.encoders.base import get_encoder, available_encoders;"
        "get_encoder('minilm'); print('sparsemm.encoders.hf' in sys.modules);"
        "print(' '.join(available_encoders()))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded, names = res.stdout.splitlines()
    assert loaded == "False"
    assert {"minilm", "clip", "blip", "siglip", "precomputed", "efficientnet"} <= set(names.split())
    from sparsemm.encoders.base import get_encoder

    with pytest.raises(SparsemmError, match="unknown encoder"):
        get_encoder("no-such-encoder")
