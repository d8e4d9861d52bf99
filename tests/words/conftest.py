"""Fixtures for the word-vector tests: a 200-word clustered toy vocabulary."""

from __future__ import annotations

import pytest

from fakes import toy_word_vectors
from sparsemm.words.vectors import WordVectors


@pytest.fixture(scope="session")
def toy_vectors() -> WordVectors:
    return toy_word_vectors()
