"""SpLiCE: non-negative sparse decomposition of dense embeddings over a concept vocabulary.

Bhalla, Oesterling, Srinivas, Calmon, Lakkaraju, "Interpreting CLIP with Sparse Linear
Concept Embeddings (SpLiCE)", NeurIPS 2024. An embedding is written as a non-negative,
sparse combination of the embeddings of human-readable concepts (words / bigrams embedded
with the same text encoder), so each code dimension *is* a concept word:

1. Concepts: ``c_j = normalize(normalize(e_j) - mu_c)`` with ``mu_c`` the mean of the
   unit-normalised concept embeddings (the dictionary ``C``, one row per concept).
2. Targets: ``z = normalize(normalize(x) - mu)`` with ``mu`` the mean of unit-normalised
   embeddings of the same modality (image embeddings for images; SpLiCE's image-side mean).
3. Codes: ``w = argmin_{w >= 0} ||z - C^T w||^2 + 2 lam ||w||_1`` (a non-negative lasso).

The solver (:func:`nonneg_lasso`) is batched over many targets in numpy. ``method="cd"``
(default) is coordinate descent on a per-target *working set* of atoms: start from the
``working_set`` atoms most correlated with the target, solve the small non-negative lasso on
their Gram matrix by cyclic coordinate descent (all targets of a batch at once, one
coordinate position at a time; every few sweeps an active-set step jumps to the exact
minimiser on the current support, which ends CD's slow zig-zag between near-duplicate
concepts), then check the optimality (KKT) conditions against *every*
atom with one ``(B, k) x (k, n_atoms)`` product; atoms that violate them (residual
correlation above ``lam``) enter the working set and the small problem is re-solved, warm
started, until no atom violates them. The working set grows when a solution's support
nearly fills it. ``method="admm"`` is ADMM on the full dictionary (Boyd et al. 2011, Sec.
6.4) with the ``x``-update ``(C C^T + rho I)^{-1}`` applied through the Woodbury identity
and a cached Cholesky factor of the ``(k, k)`` matrix ``rho I + C^T C``, ``rho`` adapted by
residual balancing. Both are checked against scikit-learn's ``Lasso(positive=True)`` with
``alpha = lam / k`` (its objective is ``1/(2k) ||z - C^T w||^2 + alpha ||w||_1``).

The CLIP/SigLIP concept model (:mod:`sparsemm.models.clip_concepts`) codes items with
:class:`SpliceDecomposer`. The research runs' concept-embedding cache, query coder,
code inspection and persistence are in :mod:`sparsemm_experiments.baselines.splice`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
from tqdm.auto import tqdm

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows

logger = logging.getLogger(__name__)

# One k-dim product per atom and target dominates the KKT check; this many targets at once
# keeps the (batch, n_atoms) float32 correlation block near 10 MB for 10k concepts.
DEFAULT_BATCH = 256
_CHUNK_ELEMS = 8_000_000  # float64 elements per working-set gather (about 64 MB)


@contextlib.contextmanager
def blas_threads(n: int | None) -> Iterator[None]:
    """Limit the BLAS/LAPACK threads of numpy and scipy to ``n`` for a block (None: as is).

    The batched small solves call LAPACK once per target; on a shared 2-core machine a
    multi-threaded OpenBLAS spends most of that time spinning (measured: 13 s instead of
    0.16 s for one working-set round under load). Uses ``threadpoolctl`` when installed.
    """
    if n is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        logger.debug("threadpoolctl not installed; BLAS threads left as they are")
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield


def _dense(x: Any) -> np.ndarray:
    """A dense ndarray copy of a scipy sparse matrix or array-like."""
    if sp.issparse(x):
        return np.asarray(x.toarray())
    return np.asarray(x)


def check_matrix(x: np.ndarray, dim: int | None, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise SparsemmError(f"{what}: expected a 2-D (n, d) array, got shape {x.shape}")
    if dim is not None and x.shape[1] != dim:
        raise SparsemmError(
            f"{what}: expected dimension {dim}, got {x.shape[1]}; embed them with the encoder "
            "the concepts were embedded with"
        )
    if not np.isfinite(x).all():
        raise SparsemmError(f"{what}: contains NaN or inf; re-encode those rows")
    return x


# ---------------------------------------------------------------------------- solvers


def _face_minimiser(G: np.ndarray, c: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Minimiser of ``0.5 w'Gw - c'w`` with w fixed to 0 outside the support ``P``.

    G (b, m, m), c (b, m), P (b, m) bool -> (b, m): solves G_PP w_P = c_P per row. Each
    row's support is moved to the front and the systems are cut to the largest support p
    (padding rows/columns = identity, right-hand side 0); a 1e-12 ridge keeps a
    rank-deficient support solvable.
    """
    b = P.shape[0]
    p = int(P.sum(axis=1).max())
    out = np.zeros_like(c)
    if p == 0:
        return out
    order = np.argsort(~P, axis=1, kind="stable")[:, :p]  # support positions first
    Ps = np.take_along_axis(P, order, axis=1)
    Gs = G[np.arange(b)[:, None, None], order[:, :, None], order[:, None, :]]
    both = Ps[:, :, None] & Ps[:, None, :]
    eye = np.eye(p, dtype=bool)[None]
    A = np.where(both, Gs, 0.0) + np.where(eye, np.where(Ps[:, :, None], 1e-12, 1.0), 0.0)
    rhs = np.where(Ps, np.take_along_axis(c, order, axis=1), 0.0)
    try:
        sol = np.linalg.solve(A, rhs[:, :, None])[:, :, 0]
    except np.linalg.LinAlgError:  # pragma: no cover - the ridge makes A non-singular
        return np.full_like(c, np.nan)
    np.put_along_axis(out, order, np.where(Ps, sol, 0.0), axis=1)
    return out


def _newton_step(
    G: np.ndarray, c: np.ndarray, w: np.ndarray, g: np.ndarray, tol: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One active-set step of ``min_{w>=0} 0.5 w'Gw - c'w`` (Lawson-Hanson style).

    Moves each row from ``w`` towards the minimiser on its current support's face, as far as
    w stays non-negative (a coordinate that reaches 0 leaves the support). Rows whose
    objective would not decrease keep ``w``. Returns (w, gradient, optimal) with
    ``optimal`` true where the full step was taken and no zero coordinate has a gradient
    below ``-tol`` (the KKT conditions hold exactly up to ``tol``).
    """
    P = w > 0
    wp = _face_minimiser(G, c, P)
    neg = P & (wp < 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(neg, w / (w - wp), np.inf)
    alpha = np.minimum(1.0, ratio.min(axis=1))
    wn = w + alpha[:, None] * (wp - w)
    wn = np.where(neg & (ratio <= alpha[:, None]), 0.0, np.maximum(wn, 0.0))
    gn = np.matmul(G, wn[:, :, None])[:, :, 0] - c
    f_old = 0.5 * ((w * g).sum(axis=1) - (c * w).sum(axis=1))  # 0.5 w'Gw - c'w
    f_new = 0.5 * ((wn * gn).sum(axis=1) - (c * wn).sum(axis=1))
    take = np.isfinite(wn).all(axis=1) & (f_new <= f_old + 1e-12 * np.abs(f_old))
    w_out = np.where(take[:, None], wn, w)
    g_out = np.where(take[:, None], gn, g)
    optimal = take & (alpha >= 1.0) & np.where(wn > 0, True, gn >= -tol).all(axis=1)
    return w_out, g_out, optimal


def _cd_small(
    G: np.ndarray,
    q: np.ndarray,
    lam: float,
    w: np.ndarray,
    tol: float,
    max_sweeps: int,
    newton_every: int = 4,
) -> tuple[np.ndarray, int]:
    """Batched cyclic coordinate descent for ``min_{w>=0} 0.5 w'Gw - q'w + lam 1'w``.

    G (B, m, m) symmetric PSD with positive diagonal, q (B, m), w (B, m) warm start (updated
    in place and returned). Every ``newton_every`` sweeps an active-set step towards the
    current support's exact minimiser (:func:`_newton_step`) cuts the slow zig-zag of CD
    between correlated atoms. A target is done when that step lands on a KKT point, or when
    a sweep moves no coordinate by more than ``tol`` x its largest coefficient. Returns
    (w, sweeps run).
    """
    B, m = q.shape
    c = q - lam  # the l1 term is linear on w >= 0
    g = np.matmul(G, w[:, :, None])[:, :, 0] - c  # gradient
    inv_diag = 1.0 / np.maximum(np.einsum("bii->bi", G), 1e-12)
    rows = np.arange(B)
    Ga, ga, wa, ia, ca = G, g, w, inv_diag, c
    done = np.zeros(B, dtype=bool)
    sweeps = 0
    for sweeps in range(1, max_sweeps + 1):
        step = np.zeros(len(rows))
        for j in range(m):
            old = wa[:, j]
            new = np.maximum(old - ga[:, j] * ia[:, j], 0.0)
            delta = new - old
            if not delta.any():
                continue
            wa[:, j] = new
            ga += Ga[:, j, :] * delta[:, None]
            np.maximum(step, np.abs(delta), out=step)
        done |= step <= tol * np.maximum(wa.max(axis=1), 1e-12)
        if sweeps % newton_every == 0:
            wa, ga, optimal = _newton_step(Ga, ca, wa, ga, tol)
            done |= optimal
        n_done = int(done.sum())
        if n_done == len(rows) or n_done >= max(1, len(rows) // 4):
            w[rows] = wa  # finished rows leave the batch (compaction copies, so not per row)
            keep = ~done
            rows, done = rows[keep], done[keep]
            if not len(rows):
                break
            Ga, ga, wa, ia, ca = Ga[keep], ga[keep], wa[keep], ia[keep], ca[keep]
    if len(rows):
        w[rows] = wa
    return w, sweeps


def _carry(prev_s: np.ndarray, prev_w: np.ndarray, new_s: np.ndarray) -> np.ndarray:
    """Values of ``prev_w`` (at atoms ``prev_s``) at the atoms ``new_s`` (0 where absent)."""
    b = new_s.shape[0]
    if prev_s.shape[1] == 0:
        return np.zeros(new_s.shape)
    span = int(max(prev_s.max(), new_s.max())) + 1
    off = np.arange(b, dtype=np.int64)[:, None] * span
    keys = (prev_s.astype(np.int64) + off).ravel()
    order = np.argsort(keys, kind="stable")
    keys, vals = keys[order], prev_w.ravel()[order]
    want = (new_s.astype(np.int64) + off).ravel()
    pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    out = np.where(keys[pos] == want, vals[pos], 0.0)
    return out.reshape(new_s.shape)


def _cd_batch(
    D: np.ndarray,
    D64: np.ndarray,
    Z: np.ndarray,
    lam: float,
    tol: float,
    max_sweeps: int,
    working_set: int,
    max_outer: int,
) -> tuple[sp.csr_matrix, dict[str, int]]:
    """Working-set coordinate descent for one batch: D (a, k), Z (B, k) -> csr (B, a).

    ``D`` (float32) serves the full-dictionary products (KKT checks), ``D64`` the small
    Gram systems, which run in float64 so round-off does not stall the sweeps near ``tol``.
    """
    a = D.shape[0]
    B = Z.shape[0]
    Z64 = Z.astype(np.float64)
    corr = Z @ D.T  # (B, a) residual correlations d_j . (z - w D); w = 0 to start
    todo = np.flatnonzero(corr.max(axis=1) > lam)  # lam >= max_j d_j.z: w = 0 is optimal
    corr = corr[todo]
    prev_s = np.zeros((len(todo), 0), dtype=np.int64)
    prev_w = np.zeros((len(todo), 0))
    final: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    m = min(a, working_set)
    stats = {"outer": 0, "sweeps": 0, "working_set": m}
    outer = 0
    for outer in range(1, max_outer + 1):  # noqa: B007 - reported after the loop
        if not len(todo):
            break
        n_supp = int((prev_w > 0).sum(axis=1).max()) if prev_w.size else 0
        while m < a and n_supp > m - max(2, m // 4):
            m = min(a, m + m // 2)  # a support that nearly fills the set leaves no room
        stats["working_set"] = max(stats["working_set"], m)
        if m >= a:
            S = np.broadcast_to(np.arange(a), (len(todo), a))
        else:
            # The support first (+inf), then the largest residual correlations: violators.
            if prev_s.shape[1]:
                r = np.arange(len(todo))[:, None]
                corr[r, prev_s] = np.where(prev_w > 0, np.inf, corr[r, prev_s])
            S = np.argpartition(-corr, m - 1, axis=1)[:, :m]
        w_all = _carry(prev_s, prev_w, S)
        # Chunks keep the (b, m, max(m, k)) float64 gathers near 64 MB as the set grows.
        step = max(1, _CHUNK_ELEMS // (m * max(m, D.shape[1])))
        keep = np.zeros(len(todo), dtype=bool)
        corr_next = np.empty((len(todo), a), dtype=D.dtype) if m < a else corr
        for lo in range(0, len(todo), step):
            sl = slice(lo, lo + step)
            rows, Sc = todo[sl], S[sl]
            DS = D64[Sc]  # (b, m, k)
            G = np.matmul(DS, DS.transpose(0, 2, 1))
            q = np.einsum("bmk,bk->bm", DS, Z64[rows])
            w, sweeps = _cd_small(G, q, lam, np.ascontiguousarray(w_all[sl]), tol, max_sweeps)
            w_all[sl] = w
            stats["sweeps"] = max(stats["sweeps"], sweeps)
            for i, row in enumerate(rows):
                nz = w[i] > 0
                final[int(row)] = (Sc[i][nz], w[i][nz])
            if m >= a:
                continue  # the whole dictionary was the working set: nothing outside it
            resid = (Z64[rows] - np.einsum("bm,bmk->bk", w, DS)).astype(D.dtype)
            cc = resid @ D.T  # (b, a) residual correlations
            cc[np.arange(len(rows))[:, None], Sc] = -np.inf  # the inner solve answers for S
            keep[sl] = cc.max(axis=1) - lam > tol
            corr_next[sl] = cc
        todo, corr = todo[keep], corr_next[keep]
        prev_s, prev_w = np.asarray(S)[keep], w_all[keep]
    stats["outer"] = outer
    if len(todo):
        logger.warning(
            "non-negative lasso: %d target(s) still violate optimality after %d working-set "
            "rounds; raise max_outer",
            len(todo),
            max_outer,
        )
    indptr = np.zeros(B + 1, dtype=np.int64)
    for row, (idx, _) in final.items():
        indptr[row + 1] = len(idx)
    indptr = np.cumsum(indptr)
    indices = np.zeros(indptr[-1], dtype=np.int64)
    data = np.zeros(indptr[-1], dtype=np.float32)
    for row, (idx, val) in final.items():
        indices[indptr[row] : indptr[row + 1]] = idx
        data[indptr[row] : indptr[row + 1]] = val
    out = sp.csr_matrix((data, indices, indptr), shape=(B, a))
    out.sort_indices()
    return out, stats


def _admm_batch(
    D: np.ndarray,
    Z: np.ndarray,
    lam: float,
    tol: float,
    max_iter: int,
    rho: float,
) -> tuple[np.ndarray, dict[str, int]]:
    """ADMM on the full dictionary for one batch: D (a, k), Z (B, k) -> W (B, a) dense.

    min 0.5||z - D^T x||^2 + lam 1'v + [v >= 0]  s.t. x = v  (scaled form, Boyd et al. 2011).
    x-update: (D D^T + rho I_a)^{-1} r = (r - D M^{-1} D^T r) / rho, M = rho I_k + D^T D.
    """
    D64 = D.astype(np.float64)
    a, k = D64.shape
    Z64 = Z.astype(np.float64)
    DtD = D64.T @ D64
    Dz = Z64 @ D64.T  # (B, a)
    B = Z64.shape[0]
    v = np.zeros((B, a))
    u = np.zeros((B, a))

    def factor(r: float) -> Any:
        return sla.cho_factor(r * np.eye(k) + DtD, lower=True)

    cho = factor(rho)
    eps_abs = tol
    eps_rel = tol
    it = 0
    for it in range(1, max_iter + 1):
        rhs = Dz + rho * (v - u)
        x = (rhs - sla.cho_solve(cho, (rhs @ D64).T).T @ D64.T) / rho
        v_old = v
        v = np.maximum(x + u - lam / rho, 0.0)
        u = u + x - v
        r = np.linalg.norm(x - v, axis=1)
        s = rho * np.linalg.norm(v - v_old, axis=1)
        eps_pri = np.sqrt(a) * eps_abs + eps_rel * np.maximum(
            np.linalg.norm(x, axis=1), np.linalg.norm(v, axis=1)
        )
        eps_dual = np.sqrt(a) * eps_abs + eps_rel * rho * np.linalg.norm(u, axis=1)
        if (r <= eps_pri).all() and (s <= eps_dual).all():
            break
        # Residual balancing (Boyd et al. 2011, Sec. 3.4.1), one rho for the whole batch.
        rm, sm = float(np.median(r)), float(np.median(s))
        if it % 10 == 0 and (rm > 10 * sm or sm > 10 * rm):
            f = 2.0 if rm > 10 * sm else 0.5
            rho *= f
            u /= f
            cho = factor(rho)
    else:
        logger.warning("ADMM non-negative lasso stopped at max_iter=%d before converging", max_iter)
    return v.astype(D.dtype), {"iterations": it}


def nonneg_lasso(
    D: np.ndarray,
    Z: np.ndarray,
    lam: float,
    *,
    method: str = "cd",
    tol: float = 1e-4,
    max_iter: int | None = None,
    working_set: int = 64,
    max_outer: int = 50,
    rho: float = 1.0,
    batch_size: int = DEFAULT_BATCH,
    threads: int | None = 1,
    progress: bool = False,
) -> sp.csr_matrix:
    """Non-negative lasso for many targets: ``argmin_{w>=0} ||z - w D||^2 + 2 lam ||w||_1``.

    D (n_atoms, k) dictionary (rows = atoms), Z (n, k) targets -> csr (n, n_atoms) codes,
    float32. Equivalent to ``0.5 ||z - w D||^2 + lam ||w||_1`` and to scikit-learn's
    ``Lasso(alpha=lam / k, positive=True, fit_intercept=False)`` fitted on ``(D.T, z)``.
    ``method``: ``"cd"`` (working-set coordinate descent, the default; ``max_iter`` =
    sweeps per working-set round, default 1000) or ``"admm"`` (``max_iter`` = iterations,
    default 5000). ``tol``: coordinate-change / KKT tolerance (cd) or ADMM residual
    tolerance. ``threads``: BLAS threads while solving (:func:`blas_threads`).
    See the module docstring for the algorithms.
    """
    if lam < 0:
        raise SparsemmError(f"the l1 penalty must be >= 0, got {lam}")
    D = np.ascontiguousarray(check_matrix(D, None, "dictionary"), dtype=np.float32)
    Z = np.ascontiguousarray(check_matrix(Z, D.shape[1], "targets"), dtype=np.float32)
    if method not in ("cd", "admm"):
        raise SparsemmError(f"unknown non-negative lasso method {method!r}; use 'cd' or 'admm'")
    D64 = D.astype(np.float64) if method == "cd" else D
    n = Z.shape[0]
    blocks: list[sp.csr_matrix] = []
    batch_size = max(1, int(batch_size))
    starts = range(0, n, batch_size)
    bar = tqdm(starts, desc=f"nn-lasso ({method})", disable=not progress, unit="batch")
    t0 = time.perf_counter()
    with blas_threads(threads):
        for start in bar:
            Zb = Z[start : start + batch_size]
            if method == "cd":
                Wb, _ = _cd_batch(D, D64, Zb, lam, tol, max_iter or 1000, working_set, max_outer)
            else:
                Wb, _ = _admm_batch(D, Zb, lam, tol, max_iter or 5000, rho)
            blocks.append(sp.csr_matrix(Wb, dtype=np.float32))
    out = sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, D.shape[0]))
    out = sp.csr_matrix(out, dtype=np.float32)
    out.eliminate_zeros()
    out.sort_indices()
    logger.debug(
        "non-negative lasso (%s, lam=%g): %d targets, %.1f non-zeros each, %.2f s",
        method,
        lam,
        n,
        out.getnnz() / max(n, 1),
        time.perf_counter() - t0,
    )
    return out


# ------------------------------------------------------------------------- concepts


def load_concepts(path: str | Path, n: int | None = 10000) -> list[str]:
    """The ``n`` most frequent concepts of a SpLiCE vocabulary file, most frequent first.

    The files list one concept a line, least to most frequent (SpLiCE's ``laion.txt`` etc.),
    so this takes the last ``n`` distinct non-empty lines, in reverse order.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise SparsemmError(
            f"concept vocabulary not found: {path}; pass a SpLiCE vocabulary file "
            "(one concept a line, least to most frequent), e.g. shared/data/splice/laion.txt"
        )
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    out: list[str] = []
    seen: set[str] = set()
    for c in reversed(lines):
        if c and c not in seen:
            seen.add(c)
            out.append(c)
            if n is not None and len(out) >= n:
                break
    if not out:
        raise SparsemmError(f"{path} holds no concepts")
    if n is not None and len(out) < n:
        logger.warning("%s has only %d distinct concepts (asked for %d)", path, len(out), n)
    return out


# ------------------------------------------------------------------------- decomposer


class SpliceDecomposer:
    """SpLiCE as a fitted transform: dense embeddings -> non-negative sparse concept codes.

    ``concepts`` names the dictionary's atoms (code dimension j = ``concepts[j]``);
    ``l1_penalty`` is SpLiCE's lambda in ``||z - C^T w||^2 + 2 lambda ||w||_1``. ``fit``
    takes image (or image-view) embeddings for the image-side mean, the concepts' text
    embeddings (same encoder as the queries) and optionally text embeddings for a text-side
    mean used by ``transform(..., modality="text")``; without them text targets are centred
    with the image mean. Learned: ``dictionary_`` (n_concepts, k) centred unit atoms,
    ``concept_mean_``, ``image_mean_``, ``text_mean_`` (k,), ``image_scale_`` /
    ``text_scale_`` (mean norm of the centred fit embeddings, used by :meth:`recompose`).
    """

    def __init__(
        self,
        concepts: Sequence[str],
        l1_penalty: float = 0.25,
        solver: str = "cd",
        tol: float = 1e-4,
        max_iter: int | None = None,
        working_set: int = 64,
        batch_size: int = DEFAULT_BATCH,
        progress: bool = False,
    ) -> None:
        self.concepts = list(concepts)
        self.l1_penalty = float(l1_penalty)
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.working_set = working_set
        self.batch_size = batch_size
        self.progress = progress

    # -- fitting ---------------------------------------------------------------------------
    def fit(
        self,
        image_embeddings: np.ndarray,
        concept_embeddings: np.ndarray,
        text_embeddings: np.ndarray | None = None,
    ) -> SpliceDecomposer:
        """Compute the means and the centred dictionary; returns self."""
        cemb = check_matrix(concept_embeddings, None, "concept embeddings")
        if cemb.shape[0] != len(self.concepts):
            raise SparsemmError(
                f"{cemb.shape[0]} concept embeddings for {len(self.concepts)} concepts; embed "
                "exactly the concept list the decomposer was built with"
            )
        k = cemb.shape[1]
        img = normalize_rows(check_matrix(image_embeddings, k, "image embeddings"))
        if not len(img):
            raise SparsemmError("fit needs at least one image embedding for the image mean")
        c = normalize_rows(cemb)
        self.concept_mean_ = c.mean(axis=0)
        self.dictionary_ = normalize_rows(c - self.concept_mean_)
        self.image_mean_ = img.mean(axis=0)
        self.image_scale_ = float(np.linalg.norm(img - self.image_mean_, axis=1).mean())
        if text_embeddings is not None and len(text_embeddings):
            txt = normalize_rows(check_matrix(text_embeddings, k, "text embeddings"))
            self.text_mean_ = txt.mean(axis=0)
            self.text_scale_ = float(np.linalg.norm(txt - self.text_mean_, axis=1).mean())
        else:
            self.text_mean_ = self.image_mean_.copy()
            self.text_scale_ = self.image_scale_
        return self

    def require_fitted(self) -> None:
        if not hasattr(self, "dictionary_"):
            raise SparsemmError("the SpLiCE decomposer is not fitted; call fit() first")

    @property
    def dim(self) -> int:
        """Input embedding dimension k."""
        self.require_fitted()
        return int(self.dictionary_.shape[1])

    def _mean(self, modality: str) -> tuple[np.ndarray, float]:
        self.require_fitted()
        if modality == "image":
            return self.image_mean_, self.image_scale_
        if modality == "text":
            return self.text_mean_, self.text_scale_
        raise SparsemmError(f"modality must be 'image' or 'text', not {modality!r}")

    # -- transform -------------------------------------------------------------------------
    def center(self, embeddings: np.ndarray, modality: str = "image") -> np.ndarray:
        """(n, k) SpLiCE targets: normalize(normalize(x) - mean of the modality)."""
        mean, _ = self._mean(modality)
        x = normalize_rows(check_matrix(embeddings, self.dim, f"{modality} embeddings"))
        return normalize_rows(x - mean)

    def transform(
        self, embeddings: np.ndarray, modality: str = "image", l1_penalty: float | None = None
    ) -> sp.csr_matrix:
        """(n, k) embeddings -> csr (n, n_concepts) non-negative sparse concept weights."""
        self.require_fitted()
        lam = self.l1_penalty if l1_penalty is None else float(l1_penalty)
        return nonneg_lasso(
            self.dictionary_,
            self.center(embeddings, modality),
            lam,
            method=self.solver,
            tol=self.tol,
            max_iter=self.max_iter,
            working_set=self.working_set,
            batch_size=self.batch_size,
            progress=self.progress,
        )

    def recompose(self, codes: sp.csr_matrix | np.ndarray, modality: str = "image") -> np.ndarray:
        """(n, k) unit embeddings rebuilt from codes: normalize(s * w C + mean).

        ``s`` is the mean norm of the centred fit embeddings (the centring's lost scale).
        """
        mean, scale = self._mean(modality)
        w = _dense(codes)
        return normalize_rows(scale * (w @ self.dictionary_) + mean)
