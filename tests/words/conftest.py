"""Fixtures for the word-vector tests: a 200-word clustered toy vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from sparsemm.words.vectors import WordVectors

CLUSTERS = (
    "animal",
    "food",
    "sport",
    "room",
    "color",
    "vehicle",
    "music",
    "weather",
    "tool",
    "plant",
)


def toy_word_vectors(dim: int = 16, per_cluster: int = 20, seed: int = 0) -> WordVectors:
    """10 clusters x 20 words; word 0 of a cluster is the cluster name, the others are the
    name plus a letter suffix ("animalb", ...). Letters only, so the tokenizer keeps them."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, (len(CLUSTERS), dim)) * 2.0
    words: list[str] = []
    rows: list[np.ndarray] = []
    for c, name in enumerate(CLUSTERS):
        for i in range(per_cluster):
            words.append(name if i == 0 else name + chr(ord("a") + i))
            rows.append(centers[c] + 0.3 * rng.normal(0.0, 1.0, dim))
    return WordVectors(words, np.asarray(rows, dtype=np.float32))


@pytest.fixture(scope="session")
def toy_vectors() -> WordVectors:
    return toy_word_vectors()
