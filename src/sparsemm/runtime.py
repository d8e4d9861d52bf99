"""Process-level run settings shared by every layer (bottom layer): how many torch CPU
threads a block of work uses. torch is imported only when the context is entered."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with ``n`` torch CPU threads. The SPINE/SR layers are small: one thread
    avoids the synchronisation cost that makes two threads several times slower here, and
    a reduction summed by one thread adds in the same order every run."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
