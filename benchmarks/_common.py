"""Helpers shared by the benchmark scripts: synthetic sparse codes and the git commit.

Imported as ``_common`` by scripts run as ``python benchmarks/<script>.py`` (the script's
folder is on ``sys.path``).
"""

from __future__ import annotations

import subprocess

import numpy as np
import scipy.sparse as sp


def dim_probs(dims: int, zipf: float) -> np.ndarray | None:
    """Dimension popularity: None (uniform) or p_d proportional to 1 / (d + 1)^zipf."""
    if zipf <= 0:
        return None
    p = 1.0 / np.arange(1, dims + 1) ** zipf
    return p / p.sum()


def random_codes(
    n: int,
    dims: int,
    nnz: int,
    rng: np.random.Generator,
    p: np.ndarray | None,
    chunk: int = 250_000,
) -> sp.csr_matrix:
    """(n, dims) float32 CSR, ~nnz positive entries per row (duplicate draws are summed).

    Dims are drawn uniformly (``p`` None) or from ``p`` by inverse-CDF sampling;
    ``chunk`` rows are drawn at a time (bounds the (chunk, nnz) temporaries; it sets the
    order of the draws, so a different chunk gives different codes for n > chunk).
    """
    parts = []
    cdf = None if p is None else np.cumsum(p)
    for lo in range(0, n, chunk):
        m = min(chunk, n - lo)
        if cdf is None:
            cols = rng.integers(0, dims, size=(m, nnz))
        else:  # rng.choice(p=...) is slow for 30k categories
            cols = np.searchsorted(cdf, rng.random((m, nnz)), side="right")
            cols = np.minimum(cols, dims - 1)
        vals = rng.random((m, nnz), dtype=np.float32) + np.float32(0.01)
        rows = np.repeat(np.arange(m), nnz)
        parts.append(
            sp.csr_matrix((vals.ravel(), (rows, cols.ravel())), shape=(m, dims), dtype=np.float32)
        )
    codes = sp.vstack(parts, format="csr")
    codes.sum_duplicates()
    codes.sort_indices()
    return codes


def git_commit() -> str:
    """``git rev-parse HEAD`` in the working directory, else ``"unknown"``."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
