"""Fixtures shared across the test folders (plain helpers live in tests/fakes.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`sparsemm serve` records running servers in the runtime dir
    (sparsemm.pipeline.running): keep the tests' records out of the user's."""
    before = os.environ.get("SPARSEMM_RUNTIME_DIR")
    os.environ["SPARSEMM_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("runtime"))
    # and the query-text embeddings a search stores (sparsemm.encoders.text_store)
    store = os.environ.get("SPARSEMM_TEXT_STORE")
    os.environ["SPARSEMM_TEXT_STORE"] = str(tmp_path_factory.mktemp("text-store"))
    yield
    if store is None:
        os.environ.pop("SPARSEMM_TEXT_STORE", None)
    else:
        os.environ["SPARSEMM_TEXT_STORE"] = store
    if before is None:
        os.environ.pop("SPARSEMM_RUNTIME_DIR", None)
    else:
        os.environ["SPARSEMM_RUNTIME_DIR"] = before


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread: the tests' tensors are tiny, so more threads only contend
    for the cores that other test runs share.

    Opt in per module with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
