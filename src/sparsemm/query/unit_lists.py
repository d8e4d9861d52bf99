"""Per-unit top lists: the items most likely to show each detector, for the served ``match``.

The served path (:meth:`Match.rank_store
<sparsemm.query.strategies.match.Match.rank_store>`) must prove that no item left out of its
candidates ranks in the top k. For SR, an include term's probability P(u | x) = sigmoid(a
(w_u . x + b_u) + g cos(q_u, x) + c) is read from a detector whose weights w_u have negative
entries, and the index can only bound it through their positive part, which is loose: on
COCO codes resampled to 100,000 items, "car" is bounded above 0.5 for most items while under
10% have P(car) > 0.5. So many queries had to scan every item.

This module computes P(u | x) once for every item and every detector unit (the same
formula as :class:`~sparsemm.query.scorers.DetectorScorer`) when the index is built, and
keeps, per unit, the ``length`` items with the highest probability, best first:

- ``rows`` (V, L) int32: collection rows (-1 past the end when the collection is smaller);
- ``ub`` (V, L) float16: an upper bound of each listed item's logit z_u(x) (the computed
  logit plus :data:`MARGIN`, rounded up), non-increasing along a list;
- ``theta`` (V,) float32: an upper bound of the logit of every item not in u's list (the
  list's last bound: the list holds the items with the highest logits).

An item outside the first n rows of unit u's list has P(u | x) <= sigmoid(ub[u, n]) (or
sigmoid(theta[u]) past the list), which certifies a top k with a pool of a few hundred rows.
Bounds are kept as logits because the match scorer ranks by P at 1%: most units reach
P > 0.99 on some items, and only a logit tells 0.995 from 0.9999 (a byte of probability
read both as 1.0, the next step up, so nothing in the top step could be certified). The lists are
tied to what they were computed from: the detectors and their calibration (a fingerprint of
their arrays and words) and the index's segment list; a Searcher that finds them stale
ignores them (results stay exact, the search is slower) and says ``sparsemm index`` builds
them again. Collections under :data:`MIN_ITEMS` items have none: a scan costs a few ms.

Files in ``COLLECTION/unit_lists/``: ``rows.npy``, ``ub.npy``, ``theta.npy`` and
``meta.json`` (format, version, fingerprint, index digest, count, the files' SHA-256).
Lists of version 1 (probability bytes) are not read: ``sparsemm index`` builds them again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.io import (
    check_digests,
    find_dir,
    load_npy,
    old_dir,
    read_json,
    record_digests,
    replace_dir,
    save_npy,
    write_json,
)

log = logging.getLogger(__name__)

DIR = "unit_lists"
FORMAT = "sparsemm.unit-lists"
VERSION = 2  # 2: logit bounds (float16), 1: probability bytes
MIN_ITEMS = 20_000  # below this a scan of every item costs a few milliseconds
# float32 rounding between this computation and the query's, in logit units: a logit sums
# ~100 float32 products of magnitude < 1, so their rounding stays far below this
MARGIN = 2e-3
CHUNK = 16384  # items per block of the computation
UNIT_GROUP = 256  # units merged into their lists at a time
_FILES = ["rows.npy", "ub.npy", "theta.npy"]


def list_length(n_items: int) -> int:
    """Items kept per unit: 1/64 of the collection, from 1,024 to 16,384."""
    return int(min(n_items, max(1024, min(16384, n_items // 64))))


def fingerprint(detectors: Any) -> str:
    """What the probabilities are computed from: the detectors' weights, biases, words,
    label flags, calibration and term codes (16 hex digits of a SHA-256). Detectors without
    term codes have their words coded by the collection's text encoder, which the lists'
    index digest ties them to."""
    h = hashlib.sha256()
    for arr in (detectors.weights, detectors.bias, detectors.label_terms):
        h.update(np.ascontiguousarray(arr).tobytes())
    for arr in (getattr(detectors, "calibration", None), getattr(detectors, "term_codes", None)):
        h.update(b"none" if arr is None else np.ascontiguousarray(arr).tobytes())
    h.update(json.dumps(list(detectors.terms)).encode())
    h.update(str(float(detectors.config.scale)).encode())
    return h.hexdigest()[:16]


def index_digest(index: Any) -> str:
    """The index's digest of its segment list (changes with every commit that changes its
    items): :attr:`sparsemm.index.InvertedIndex.digest`."""
    return str(index.digest)


@dataclass
class UnitLists:
    """Per detector unit, the items most likely to show it (see the module docstring)."""

    rows: np.ndarray  # (V, L) int32
    ub: np.ndarray  # (V, L) float16 logit bounds
    theta: np.ndarray  # (V,) float32 logit bound past the list
    fingerprint: str
    index_digest: str
    count: int

    @property
    def length(self) -> int:
        return int(self.rows.shape[1])

    def top(self, unit: int, n: int) -> tuple[np.ndarray, float]:
        """(rows, bound): the first ``n`` rows of ``unit``'s list and an upper bound of
        P(unit | x) for every item not among them (-inf when they are every item)."""
        n = min(n, self.length)
        rows = np.asarray(self.rows[unit, :n], dtype=np.int64)
        rows = rows[rows >= 0]
        if n < self.length:
            return rows, _sigmoid(float(self.ub[unit, n]))
        if self.length >= self.count:
            return rows, -np.inf
        return rows, _sigmoid(float(self.theta[unit]))

    def save(self, collection_root: str | Path) -> Path:
        """Write ``COLLECTION/unit_lists/`` atomically (a temp folder swapped in)."""
        target = Path(collection_root) / DIR
        tmp = Path(tempfile.mkdtemp(prefix=".unit-lists-", dir=collection_root))
        try:
            save_npy(tmp / "rows.npy", self.rows)
            save_npy(tmp / "ub.npy", self.ub)
            save_npy(tmp / "theta.npy", self.theta)
            write_json(
                tmp / "meta.json",
                {
                    "format": FORMAT,
                    "version": VERSION,
                    "fingerprint": self.fingerprint,
                    "index_digest": self.index_digest,
                    "count": self.count,
                    "sha256": record_digests(tmp, _FILES),
                },
            )
            replace_dir(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return target

    @classmethod
    def load(cls, collection_root: str | Path) -> UnitLists | None:
        """The lists saved in a collection (None when it has none); SparsemmError when they
        are damaged."""
        folder = find_dir(Path(collection_root) / DIR)
        if not (folder / "meta.json").is_file():
            return None
        remedy = "run `sparsemm index` on the collection to build them again"
        meta = read_json(folder / "meta.json")
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SparsemmError(f"{folder} holds no sparsemm unit lists; {remedy}")
        if meta.get("version") != VERSION:
            raise SparsemmError(
                f"{folder} was written by another sparsemm (version {meta.get('version')}); "
                f"{remedy}"
            )
        if meta.get("sha256") is None:  # derived data: trusted only with its checksums
            raise SparsemmError(f"{folder} records no checksums of its files; {remedy}")
        check_digests(folder, meta.get("sha256"), _FILES, remedy)
        rows = load_npy(folder / "rows.npy", mmap=True)
        ub = load_npy(folder / "ub.npy", mmap=True)
        theta = load_npy(folder / "theta.npy")
        count = meta.get("count")
        ok = (
            isinstance(count, int)
            and rows.ndim == 2
            and rows.dtype == np.int32
            and ub.dtype == np.float16
            and ub.shape == rows.shape
            and theta.dtype == np.float32
            and theta.shape == (rows.shape[0],)
            and not bool(np.isnan(theta).any())
            and not bool(np.isnan(ub).any())
            and rows.shape[1] <= count
        )
        if not ok:
            raise SparsemmError(f"{folder}: the unit lists have wrong shapes or types; {remedy}")
        assert isinstance(count, int)
        return cls(
            rows, ub, theta, str(meta.get("fingerprint")), str(meta.get("index_digest")), count
        )

    def fits(self, detectors: Any, index: Any) -> bool:
        """True when the lists were computed from these detectors over this index."""
        return (
            self.fingerprint == fingerprint(detectors)
            and self.count == len(index)
            and self.index_digest == index_digest(index)
            and self.rows.shape[0] == len(detectors)
        )


def _sigmoid(z: float) -> float:
    """P of a logit bound, in float64 (exact enough to tell 0.995 from 0.9999)."""
    return float(np.exp(-np.logaddexp(0.0, -z)))


def _round_up16(z: np.ndarray) -> np.ndarray:
    """float16 values >= ``z`` (float32): the nearest, or the next one up where that is
    below."""
    h = z.astype(np.float16)
    low = h.astype(np.float32) < z
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


def remove_unit_lists(collection_root: str | Path) -> None:
    """Remove a collection's unit lists (they no longer fit its index or model)."""
    for folder in (Path(collection_root) / DIR, old_dir(Path(collection_root) / DIR)):
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)


def _unit_matrix(scorer: Any, ctx: Any) -> tuple[np.ndarray, np.ndarray]:
    """(M (d, V) float32, offset (V,)): z_u(x) = x . M[:, u] + offset[u] for a unit code x,
    the logit of :meth:`~sparsemm.query.scorers.DetectorScorer.unit_probability`."""
    det = scorer.detectors
    terms = [str(t) for t in det.terms]
    if det.term_codes is None:
        ctx.prefetch(terms, codes=True)
    m = np.zeros((det.weights.shape[0], len(terms)), dtype=np.float64)
    offset = np.zeros(len(terms))
    for u in range(len(terms)):
        a, g, c = scorer.calibration.of(bool(det.label_terms[u]))
        w, b, _ = det.column_at(u)
        m[:, u] = a * np.asarray(w, dtype=np.float64)
        if g:
            q = np.asarray(scorer.term_code(u, ctx), dtype=np.float64)
            nrm = float(np.linalg.norm(q))
            if nrm > 0.0:
                m[:, u] += g * q / nrm
        offset[u] = a * b + c
    return m.astype(np.float32), offset


def build_unit_lists(
    scorer: Any,
    ctx: Any,
    codes: sp.csr_matrix,
    index: Any,
    length: int | None = None,
    progress: bool = False,
) -> UnitLists:
    """The lists of ``scorer``'s detector units over ``codes`` (the index's unit codes, in
    its row order); ``ctx`` codes the detectors' words as a query would."""
    from tqdm.auto import tqdm

    n = codes.shape[0]
    if n == 0:
        raise SparsemmError("no items to build unit lists for")
    if n != len(index):
        raise SparsemmError(f"{n} codes for an index of {len(index)} items")
    length = list_length(n) if length is None else max(1, min(int(length), n))
    m, offset = _unit_matrix(scorer, ctx)
    v = m.shape[1]
    # logits, not probabilities: the order is the same and no exp is needed
    best_z = np.full((v, length), -np.inf, dtype=np.float32)
    best_r = np.full((v, length), -1, dtype=np.int32)
    # a list's smallest logit (-inf until it is full): only an item above it can enter, which
    # after the first blocks is a few percent of them, so most of a block is never sorted
    floor = np.full(v, -np.inf, dtype=np.float32)
    codes = sp.csr_matrix(codes, dtype=np.float32)
    norms = np.sqrt(np.asarray(codes.multiply(codes).sum(axis=1), dtype=np.float64).ravel())
    off = offset.astype(np.float32)
    for lo in tqdm(range(0, n, CHUNK), desc="unit lists", disable=not progress, unit="block"):
        hi = min(lo + CHUNK, n)
        scale = (1.0 / np.maximum(norms[lo:hi], 1e-12)).astype(np.float32)
        dense = np.asarray(codes[lo:hi].toarray(), dtype=np.float32) * scale[:, None]
        z = dense @ m + off  # (block, V)
        for g in range(0, v, UNIT_GROUP):  # bounded temporaries: a group of units at a time
            zg = z[:, g : g + UNIT_GROUP]
            at, unit = np.nonzero(zg > floor[g : g + UNIT_GROUP])
            if not len(at):
                continue
            order = np.argsort(unit, kind="stable")
            at, unit = at[order], unit[order]
            vals = zg[at, unit]
            cuts = np.searchsorted(unit, np.arange(zg.shape[1] + 1))
            for j in np.flatnonzero(cuts[1:] > cuts[:-1]):
                u = g + int(j)
                new_z = np.concatenate([best_z[u], vals[cuts[j] : cuts[j + 1]]])
                new_r = np.concatenate(
                    [best_r[u], (at[cuts[j] : cuts[j + 1]] + lo).astype(np.int32)]
                )
                keep = np.argpartition(-new_z, length - 1)[:length]
                best_z[u], best_r[u] = new_z[keep], new_r[keep]
                floor[u] = best_z[u].min()
    # best first, ties by row
    order = np.lexsort((best_r, -best_z), axis=1)
    best_z = np.take_along_axis(best_z, order, axis=1)
    best_r = np.take_along_axis(best_r, order, axis=1)
    # past the end of a short collection: logit -inf (P = 0), kept finite for float16
    ub = _round_up16(np.maximum(best_z, -6e4) + np.float32(MARGIN))
    # an item outside a list is at most its smallest logit (the list holds the top ones)
    theta_ub = ub[:, -1].astype(np.float32)
    return UnitLists(
        best_r,
        ub,
        theta_ub.astype(np.float32),
        fingerprint(scorer.detectors),
        index_digest(index),
        n,
    )
