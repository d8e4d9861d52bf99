"""What a store's callers pass in and get back: the value types of a search
(:class:`Exclusion`, :class:`SearchResult`) and the checks that turn user input (codes, ids,
queries, exclusions, k) into canonical arrays or raise SparsemmError. Shared by every backend
(:class:`~sparsemm.index.inverted.InvertedIndex`, :mod:`sparsemm.index.qdrant`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.index.kernels import clean_query

QueryLike = Any  # 1-row sparse matrix | dense (dim,) array | (dims, weights) pair


# --------------------------------------------------------------------------------------------
# Public value types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Exclusion:
    """Dimensions to leave out of a search.

    ``mode="filter"``: drop every item whose value on any of ``dims`` is > ``threshold``
    (``weights`` are ignored; ``threshold`` must be >= 0 because items absent from a dim
    have value 0 there). ``mode="penalty"``: subtract ``penalty * sum_j w_j * x_ij`` over
    ``dims`` from each item's score (``weights`` default to 1).
    """

    dims: Sequence[int] | np.ndarray
    weights: Sequence[float] | np.ndarray | None = None
    threshold: float = 0.0
    mode: Literal["filter", "penalty"] = "filter"
    penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("filter", "penalty"):
            raise SparsemmError(f"exclusion mode must be 'filter' or 'penalty', got {self.mode!r}")
        if not np.isfinite(self.threshold) or self.threshold < 0:
            raise SparsemmError(
                f"exclusion threshold must be a finite number >= 0, got {self.threshold}"
            )
        if not np.isfinite(self.penalty):
            raise SparsemmError(f"exclusion penalty must be finite, got {self.penalty}")


@dataclass
class SearchResult:
    """Top-k hits, best first: ``rows`` (k,) int64, ``ids`` k strings, ``scores`` (k,) f32."""

    rows: np.ndarray
    ids: list[str]
    scores: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def check_codes(codes: Any, dim: int) -> sp.csr_matrix:
    """Validate and canonicalise a (n, dim) code matrix into a fresh float32 CSR copy."""
    if sp.issparse(codes):
        if codes.ndim != 2:
            raise SparsemmError(f"codes: expected a 2-D (n, {dim}) matrix, got {codes.shape}")
        csr = sp.csr_matrix(codes, dtype=np.float32, copy=True)
    else:
        arr = np.asarray(codes)
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
            raise SparsemmError(
                f"codes: expected a 2-D numeric (n, {dim}) matrix, got shape {arr.shape} "
                f"dtype {arr.dtype}"
            )
        csr = sp.csr_matrix(arr.astype(np.float32))
    if csr.shape[1] != dim:
        raise SparsemmError(f"codes: the index has dimension {dim}, got {csr.shape[1]}")
    if not np.isfinite(csr.data).all():
        bad_rows = np.unique(
            np.repeat(np.arange(csr.shape[0]), np.diff(csr.indptr))[~np.isfinite(csr.data)]
        )
        raise SparsemmError(
            f"codes: {len(bad_rows)} row(s) contain NaN or inf (first: row {bad_rows[0]}); "
            "re-encode those items"
        )
    csr.sum_duplicates()
    csr.eliminate_zeros()
    csr.sort_indices()
    return csr


def check_items(codes: Any, ids: Sequence[str], dim: int) -> tuple[sp.csr_matrix, list[str]]:
    """Validate items to add: (canonical float32 CSR (n, dim), n unique non-empty ids)."""
    if isinstance(ids, str):
        raise SparsemmError("ids must be a list of strings, not one string")
    csr = check_codes(codes, dim)
    id_list = [str(i) for i in ids]
    if len(id_list) != csr.shape[0]:
        raise SparsemmError(f"{csr.shape[0]} codes for {len(id_list)} ids; they must match")
    if any(not i for i in id_list):
        raise SparsemmError("every item needs a non-empty id")
    if len(set(id_list)) != len(id_list):
        seen: set[str] = set()
        for i in id_list:
            if i in seen:
                raise SparsemmError(f"duplicate id {i!r} in the items to add; ids must be unique")
            seen.add(i)
    return csr, id_list


def _check_dims(dims: Any, dim: int, what: str, unique: bool = False) -> np.ndarray:
    """Validate a 1-D list of dimensions in [0, dim) -> int64 array (sorted unique if asked)."""
    arr = np.asarray(dims)
    if arr.size == 0:
        return _EMPTY_I64
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise SparsemmError(f"{what}: expected a 1-D list of integer dimensions, got {arr!r}")
    if unique:
        arr = np.unique(arr)
        lo, hi = arr[0], arr[-1]
    else:
        lo, hi = arr.min(), arr.max()
    if lo < 0 or hi >= dim:
        raise SparsemmError(f"{what}: dimensions must lie in [0, {dim}), got {lo}..{hi}")
    return arr.astype(np.int64, copy=False)


def _check_weights(weights: Any, n: int, what: str) -> np.ndarray:
    arr = np.asarray(weights, dtype=np.float64)
    if arr.shape != (n,):
        raise SparsemmError(f"{what}: expected {n} weights, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise SparsemmError(f"{what}: weights contain NaN or inf")
    return arr


def as_query(query: QueryLike, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalise a query to (dims (m,) int64 ascending unique, weights (m,) float32)."""
    if sp.issparse(query):
        if query.shape != (1, dim):
            raise SparsemmError(f"query: expected a (1, {dim}) sparse row, got {query.shape}")
        q = query if query.format == "csr" else sp.csr_matrix(query)
        if not q.has_canonical_format:
            q = q.copy()
            q.sum_duplicates()
        dims, w = q.indices, q.data
    elif isinstance(query, tuple) and len(query) == 2:
        dims = _check_dims(query[0], dim, "query")
        w = np.asarray(query[1])
        if w.shape != dims.shape or not np.issubdtype(w.dtype, np.number):
            raise SparsemmError(
                f"query: {len(dims)} dims need {len(dims)} numeric weights, got {w.shape}"
            )
        if len(dims) > 1 and not (np.diff(dims) > 0).all():
            uniq, inv = np.unique(dims, return_inverse=True)
            w = np.bincount(inv, weights=w.astype(np.float64), minlength=len(uniq))
            dims = uniq
    else:
        arr = np.asarray(query)
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.shape != (dim,) or not np.issubdtype(arr.dtype, np.number):
            raise SparsemmError(
                f"query: expected a (1, {dim}) sparse row, a ({dim},) array or a "
                f"(dims, weights) pair, got {type(query).__name__} of shape {arr.shape}"
            )
        dims = np.flatnonzero(arr)
        w = arr[dims]
    if np.iscomplexobj(w):
        raise SparsemmError("query: weights must be real numbers")
    out_dims, out_w, bad = clean_query(dims, w)
    if bad:
        raise SparsemmError("query: weights contain NaN or inf; re-encode the query")
    return out_dims, out_w


_EMPTY_I64 = np.zeros(0, np.int64)
_EMPTY_F32 = np.zeros(0, np.float32)


class Plan(NamedTuple):
    """Resolved exclusion for the kernel: extra (dims, weights) and filtered dims."""

    extra_dims: np.ndarray = _EMPTY_I64
    extra_w: np.ndarray = _EMPTY_F32
    ban_dims: np.ndarray = _EMPTY_I64
    threshold: float = 0.0


NO_PLAN = Plan()


def plan_exclusion(exclude: Exclusion | None, dim: int) -> Plan:
    if exclude is None:
        return NO_PLAN
    if not isinstance(exclude, Exclusion):
        raise SparsemmError(f"exclude must be an Exclusion, got {type(exclude).__name__}")
    if exclude.mode == "filter":
        dims = _check_dims(exclude.dims, dim, "exclusion", unique=True)
        return Plan(ban_dims=dims, threshold=float(exclude.threshold))
    dims = _check_dims(exclude.dims, dim, "exclusion")
    w = (
        np.ones(len(dims))
        if exclude.weights is None
        else _check_weights(exclude.weights, len(dims), "exclusion")
    )
    # penalty * sum_j w_j x_ij is a scatter-add with negative weights
    return Plan(extra_dims=dims, extra_w=(-float(exclude.penalty) * w).astype(np.float32))


def check_k(k: Any) -> int:
    if type(k) is int and k >= 1:
        return k
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise SparsemmError(f"k must be a positive integer, got {k!r}")
    return int(k)
