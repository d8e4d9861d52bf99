"""Quality of (sparse) word vectors: sparsity, word similarity and word intrusion, for
``sparsemm spine eval``, and a word's top dimensions, for ``sparsemm spine inspect``.

- ``wordsim_spearman``: Spearman correlation between cosine similarities and human ratings
  of WordSim-353 (Finkelstein et al. 2002).
- ``distance_ratio``: automatic word-intrusion score of Sun et al. 2016 ("Sparse word
  embeddings using l1 regularized online learning", IJCAI), as used by SPINE (Subramanian et
  al. 2018) to measure how interpretable the dimensions are. Higher is better.
- ``sparsity_stats``: share of exact zeros and mean number of active dimensions per word
  (``sparsemm spine train`` reports it).
- ``word_dims``: a word's top dimensions (``sparsemm spine inspect --word``); a dimension's
  top words are the library's (:func:`sparsemm.words.evaluate.top_words`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TypeAlias, TypedDict

import numpy as np
import scipy.sparse as sp
from scipy.stats import spearmanr

from sparsemm.errors import SparsemmError
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors

logger = logging.getLogger(__name__)

Matrix: TypeAlias = "np.ndarray | sp.spmatrix | sp.sparray"  # dense or scipy sparse (n, d)


class SparsityStats(TypedDict):
    zero_share: float
    mean_active_dims: float


def sparsity_stats(matrix: Matrix) -> SparsityStats:
    """``zero_share`` = share of entries exactly 0; ``mean_active_dims`` = mean number of
    non-zero entries per row. Works for dense arrays and scipy sparse matrices."""
    if sp.issparse(matrix):
        n, d = matrix.shape
        nnz = int(sp.csr_matrix(matrix).count_nonzero())  # ignores stored explicit zeros
    else:
        arr = np.asarray(matrix)
        if arr.ndim != 2:
            raise SparsemmError(f"expected a 2-D matrix, got shape {arr.shape}")
        n, d = arr.shape
        nnz = int(np.count_nonzero(arr))
    if n == 0 or d == 0:
        raise SparsemmError("sparsity_stats of an empty matrix is undefined")
    return {"zero_share": 1.0 - nnz / (n * d), "mean_active_dims": nnz / n}


def word_dims(sparse_vectors: SparseWordVectors, word: str, k: int = 10) -> list[tuple[int, float]]:
    """The ``k`` dimensions with the largest value for ``word`` (non-zero only)."""
    row = sparse_vectors.row(word)
    order = np.argsort(-row, kind="stable")[:k]
    return [(int(j), float(row[j])) for j in order if row[j] != 0]


def read_wordsim(path: str | Path) -> list[tuple[str, str, float]]:
    """Read a WordSim-353 style file: tab-separated ``word1 word2 score`` with a header."""
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"WordSim file not found: {path}")
    pairs: list[tuple[str, str, float]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.strip().split("\t")
        if lineno == 1 or parts == [""]:
            continue  # header ("Word 1, Word 2, Human (mean)") / blank line
        if len(parts) < 3:
            raise SparsemmError(f"{path}:{lineno}: expected 'word1<TAB>word2<TAB>score'")
        try:
            pairs.append((parts[0], parts[1], float(parts[2])))
        except ValueError as exc:
            raise SparsemmError(f"{path}:{lineno}: score {parts[2]!r} is not a number") from exc
    return pairs


def _lookup(vectors: WordVectors | SparseWordVectors, word: str) -> np.ndarray | None:
    """Vector of ``word`` (tried as written, then lower-cased), or None."""
    for w in (word, word.lower()):
        if w in vectors:
            if isinstance(vectors, SparseWordVectors):
                return vectors.row(w).astype(np.float64)
            vec = vectors.get(w)
            assert vec is not None
            return np.asarray(vec, dtype=np.float64)
    return None


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity; 0 when either vector is all zeros (a word with no active dim)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na == 0 or nb == 0 else float(a @ b) / (na * nb)


def wordsim_spearman(
    vectors: WordVectors | SparseWordVectors, wordsim_path: str | Path
) -> tuple[float, int]:
    """Spearman rho between cosine similarity and the human scores, and the number of pairs
    whose two words are both in the vocabulary (pairs with an unknown word are skipped)."""
    model_scores: list[float] = []
    human: list[float] = []
    for w1, w2, score in read_wordsim(wordsim_path):
        a, b = _lookup(vectors, w1), _lookup(vectors, w2)
        if a is None or b is None:
            continue
        model_scores.append(_cosine(a, b))
        human.append(score)
    if len(human) < 3:
        raise SparsemmError(
            f"only {len(human)} WordSim pairs have both words in the vocabulary; a larger "
            "vocabulary is needed for a meaningful correlation"
        )
    rho = spearmanr(model_scores, human).statistic
    return float(rho), len(human)


class DistRatioResult(TypedDict):
    dist_ratio: float
    n_dims_used: int
    n_dims_skipped: int


def _pairwise_mean(points: np.ndarray, metric: str) -> float:
    """Mean distance over ordered pairs i != j of ``points`` (k, d)."""
    k = points.shape[0]
    dist = _distances(points, points, metric)
    off_diagonal = ~np.eye(k, dtype=bool)  # d(w, w) is not a pair (and not exactly 0 in fp)
    return float(dist[off_diagonal].sum() / (k * (k - 1)))


def _distances(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    if metric == "euclidean":
        sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
        return np.sqrt(np.maximum(sq, 0.0))
    an = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    bn = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return 1.0 - an @ bn.T


def distance_ratio(
    matrix: Matrix,
    words: list[str],
    space: WordVectors,
    top_k: int = 5,
    bottom_share: float = 0.5,
    top_share: float = 0.1,
    metric: str = "euclidean",
    seed: int = 0,
) -> DistRatioResult:
    """Automatic word-intrusion score DistRatio (Sun et al. 2016); higher = more interpretable.

    For every dimension i of ``matrix`` (rows aligned with ``words``):

    - top words T_i: the ``top_k`` words with the largest values on i (ties: earlier row first);
    - intruder b_i: drawn uniformly (seeded) from the words in the bottom ``bottom_share`` on i
      (value <= the ``bottom_share`` quantile) that are in the top ``top_share`` of at least
      one other dimension (value >= that dimension's ``1 - top_share`` quantile and strictly
      above its ``bottom_share`` quantile, so a tie of zeros never counts as "top");
    - IntraDist_i = mean distance over pairs of distinct words in T_i;
      InterDist_i = mean distance from b_i to the words of T_i.

    DistRatio = mean over dimensions of InterDist_i / IntraDist_i.

    Distances are measured in ``space`` (``metric``: euclidean or cosine) - pass the ORIGINAL
    dense word vectors (e.g. GloVe) for both the raw and the SPINE matrix so the two scores
    are comparable. A dimension is skipped ("dead") when fewer than ``top_k`` words are
    strictly above its ``bottom_share`` quantile, when it has no intruder candidate, or when
    its top words coincide (IntraDist 0); the number skipped is returned.
    """
    if metric not in ("euclidean", "cosine"):
        raise SparsemmError(f"metric must be 'euclidean' or 'cosine', got {metric!r}")
    if top_k < 2:
        raise SparsemmError("top_k must be at least 2 (IntraDist needs a pair of words)")
    n, d = matrix.shape
    if len(words) != n:
        raise SparsemmError(f"{len(words)} words but the matrix has {n} rows")
    missing = [w for w in words if w not in space]
    if missing:
        raise SparsemmError(
            f"{len(missing)} word(s) (e.g. {missing[0]!r}) have no vector in the distance space"
        )
    emb = np.asarray(space.vectors[[space.index[w] for w in words]], dtype=np.float64)
    csc = sp.csc_matrix(matrix) if sp.issparse(matrix) else None
    dense = None if csc is not None else np.asarray(matrix)

    def column(j: int) -> np.ndarray:
        if csc is not None:
            return np.asarray(csc[:, [j]].toarray(), dtype=np.float64).ravel()
        assert dense is not None
        return np.asarray(dense[:, j], dtype=np.float64)

    # Pass 1: per-dimension quantiles and how many dimensions each word is "top" in.
    low_q = np.empty(d)
    top_count = np.zeros(n, dtype=np.int64)
    for j in range(d):
        col = column(j)
        low_q[j] = np.quantile(col, bottom_share)
        high = np.quantile(col, 1.0 - top_share)
        top_count += (col >= high) & (col > low_q[j])

    rng = np.random.default_rng(seed)
    ratios: list[float] = []
    skipped = 0
    for j in range(d):
        col = column(j)
        above = col > low_q[j]
        in_top_j = above & (col >= np.quantile(col, 1.0 - top_share))
        # A candidate is low on j (so not top on j) and top on some other dimension.
        candidates = np.flatnonzero(~above & (top_count - in_top_j > 0))
        if above.sum() < top_k or candidates.size == 0:
            skipped += 1
            continue
        top = np.argsort(-col, kind="stable")[:top_k]
        intruder = candidates[rng.integers(candidates.size)]
        intra = _pairwise_mean(emb[top], metric)
        if intra <= 0:
            skipped += 1
            continue
        inter = float(_distances(emb[[intruder]], emb[top], metric).mean())
        ratios.append(inter / intra)
    if not ratios:
        raise SparsemmError("no dimension has enough active words for a distance ratio")
    if skipped:
        logger.info("distance ratio: skipped %d of %d dimensions (dead or degenerate)", skipped, d)
    return {
        "dist_ratio": float(np.mean(ratios)),
        "n_dims_used": len(ratios),
        "n_dims_skipped": skipped,
    }
