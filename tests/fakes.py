"""Tiny deterministic fakes shared by the tests: a keyword one-hot text/image encoder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sparsemm.errors import SparsemmError


def keyword_vectors(texts: Sequence[str], keywords: Sequence[str]) -> np.ndarray:
    """(n, len(keywords)) counts of words starting with each keyword, L2-normalised."""
    out = np.zeros((len(texts), len(keywords)), dtype=np.float32)
    for i, text in enumerate(texts):
        words = text.lower().replace(".", " ").replace("/", " ").split()
        for j, kw in enumerate(keywords):
            out[i, j] = sum(w.startswith(kw) for w in words)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


class KeywordEncoder:
    """Fake encoder: text -> keyword counts; an image -> the keywords in its file name."""

    name = "kwfake"
    keywords: Sequence[str] = ("cat", "dog", "car", "red", "tree")
    calls = 0

    def __init__(
        self, model: str | None = None, images: bool = False, keywords: Sequence[str] | None = None
    ) -> None:
        if keywords is not None:
            self.keywords = tuple(keywords)
        self.dim = len(self.keywords)
        self.model_id = model or "keywords-v1"
        self.modalities = ("text", "image") if images else ("text",)

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False) -> np.ndarray:
        KeywordEncoder.calls += 1
        return keyword_vectors(list(texts), self.keywords)

    def encode_image(self, images, batch_size=32, normalize=True, progress=False) -> np.ndarray:
        if "image" not in self.modalities:
            raise SparsemmError("text only")
        return keyword_vectors([Path(p).stem.replace("_", " ") for p in images], self.keywords)
