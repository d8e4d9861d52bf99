"""Shared helpers for the inverted-index tests: random codes, a naive reference search, and
rewriting an index in an older segment layout."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparsemm.index import Exclusion, InvertedIndex
from sparsemm.index import segments as segmod
from sparsemm.index.kernels import block_pointers, decode_rows

# Dyadic values (k / 4) keep every score exact in float32, so ties are real ties and the
# index must reproduce the reference ranking exactly, tie rule included.
DYADIC = np.array([0.25, 0.5, 0.75, 1.0, 1.5, 2.0], dtype=np.float32)


def random_codes(
    rng: np.random.Generator,
    n: int,
    dim: int,
    max_nnz: int,
    signed: bool = False,
    dyadic: bool = True,
) -> sp.csr_matrix:
    """(n, dim) float32 CSR with 0..max_nnz entries per row (some rows empty)."""
    rows, cols = [], []
    for i in range(n):
        m = int(rng.integers(0, max_nnz + 1))
        rows.extend([i] * m)
        cols.extend(rng.choice(dim, size=m, replace=False).tolist())
    if dyadic:
        vals = rng.choice(DYADIC, size=len(rows))
    else:
        vals = rng.random(len(rows), dtype=np.float32) + np.float32(0.01)
    if signed:
        vals = vals * rng.choice(np.array([-1.0, 1.0], np.float32), size=len(rows))
    return sp.csr_matrix((vals.astype(np.float32), (rows, cols)), shape=(n, dim), dtype=np.float32)


def reference_search(
    codes: sp.csr_matrix,
    query: np.ndarray,
    k: int,
    exclude: Exclusion | None = None,
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Naive brute force: (rows, scores float64) of the top k, ties by lower row."""
    x = sp.csc_matrix(codes, dtype=np.float64)
    scores = np.asarray(x @ np.asarray(query, np.float64)).ravel()
    keep = np.ones(x.shape[0], bool)
    if exclude is not None:
        dims = np.asarray(exclude.dims, np.int64)
        excluded = x[:, dims].toarray()  # (n, len(dims))
        if exclude.mode == "filter":
            keep &= ~(excluded > exclude.threshold).any(axis=1)
        else:
            w = np.ones(len(dims)) if exclude.weights is None else np.asarray(exclude.weights)
            scores = scores - exclude.penalty * (excluded @ w)
    if allowed is not None:
        keep &= allowed
    rows = np.flatnonzero(keep)
    order = np.lexsort((rows, -scores[rows]))
    top = rows[order][:k]
    return top, scores[top]


def write_old_layout(root: Path, layout: int) -> None:
    """Rewrite every segment of ``root`` in the v1 or v2 layout, as sparsemm wrote it before
    v2 or v3 (posting values as float32, from the row store's exact values)."""
    manifest = json.loads((root / "manifest.json").read_text())
    index = InvertedIndex.open(root)
    for meta, seg in zip(manifest["segments"], index._segments, strict=True):
        folder = root / meta["name"]
        indptr, dims, vals = decode_rows(seg.row_indptr, seg.row_dims, seg.row_vals)
        csc = sp.csr_matrix((vals, dims, indptr), shape=(seg.count, index.dim)).tocsc()
        csc.sort_indices()
        old: dict[str, np.ndarray] = {}
        if layout == 1:
            old["post_indptr"] = csc.indptr.astype(np.int64)
            old["post_rows"] = csc.indices.astype(np.int32)
        else:
            nb = max(1, -(-seg.count // segmod.ROW_BLOCK))
            rows = csc.indices.astype(np.int64)
            old["post_blocks"] = block_pointers(
                csc.indptr.astype(np.int64), rows, nb, segmod.BLOCK_SHIFT
            )
            old["post_rows"] = (rows & (segmod.ROW_BLOCK - 1)).astype(np.uint16)
        old["post_vals"] = csc.data.astype(np.float32)
        old["row_indptr"] = indptr
        old["row_dims"] = dims.astype(np.int32 if layout == 1 else np.uint16)
        old["row_vals"] = vals
        for name in ("post_blocks", "post_imps", "list_stats"):
            if name not in old:
                (folder / f"{name}.npy").unlink(missing_ok=True)
        for name, arr in old.items():  # new files: the open index still maps the old ones
            np.save(folder / f"{name}.tmp.npy", arr)
            (folder / f"{name}.tmp.npy").replace(folder / f"{name}.npy")
        meta["sha256"] = {
            fname: hashlib.sha256((folder / fname).read_bytes()).hexdigest()
            for fname in segmod.SEG_FILES[layout]
        }
    manifest["version"] = layout
    (root / "manifest.json").write_text(json.dumps(manifest))
