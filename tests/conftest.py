"""Fixtures shared across the test folders (plain helpers live in tests/fakes.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread: tiny tensors on a shared 2-core machine (DESIGN.md).

    Opt in per module with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
