"""Word-vector quality for ``sparsemm spine eval``: WordSim-353 correlation and the
word-intrusion distance ratio."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors
from sparsemm_experiments.word_quality import distance_ratio, wordsim_spearman

WORDSIM = "Word 1\tWord 2\tHuman (mean)\nX\tp\t1.0\nx\tq\t3.0\nx\tr\t2.0\nx\ts\t4.0\nx\tzebra\t5\n"


def _sim_vectors() -> tuple[list[str], np.ndarray]:
    # cos(x, .) = 0, 0.707, 0.894, 0.995 for p, q, r, s
    words = ["x", "p", "q", "r", "s"]
    return words, np.array([[1, 0], [0, 1], [1, 1], [2, 1], [1, 0.1]], dtype=np.float32)


def test_wordsim_spearman_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "ws.tab"
    path.write_text(WORDSIM)
    words, vecs = _sim_vectors()
    # model ranks 1,2,3,4 vs human ranks 1,3,2,4: rho = 1 - 6*2 / (4*15) = 0.8;
    # "X" is found lower-cased, the zebra pair is skipped
    rho, n = wordsim_spearman(WordVectors(words, vecs), path)
    assert (rho, n) == (pytest.approx(0.8), 4)
    rho_s, n_s = wordsim_spearman(SparseWordVectors(words, sp.csr_matrix(vecs)), path)
    assert (rho_s, n_s) == (pytest.approx(0.8), 4)


def test_wordsim_errors(tmp_path: Path) -> None:
    words, vecs = _sim_vectors()
    wv = WordVectors(words, vecs)
    with pytest.raises(SparsemmError, match="not found"):
        wordsim_spearman(wv, tmp_path / "none.tab")
    bad = tmp_path / "bad.tab"
    bad.write_text("h\nx\tp\tlots\n")
    with pytest.raises(SparsemmError, match="not a number"):
        wordsim_spearman(wv, bad)
    few = tmp_path / "few.tab"
    few.write_text("h\nx\tp\t1\nx\tzebra\t2\n")
    with pytest.raises(SparsemmError, match="only 1"):
        wordsim_spearman(wv, few)


def _intrusion_case() -> tuple[np.ndarray, list[str], WordVectors]:
    words = [f"w{chr(97 + i)}" for i in range(6)]
    matrix = np.zeros((6, 3))
    matrix[:, 0] = [5, 4, 0, 0, 0, 0]  # top {wa, wb}; intruder must be wc (top on dim 1)
    matrix[:, 1] = [0, 0, 5, 4, 0, 0]  # top {wc, wd}; intruder must be wa (top on dim 0)
    # dim 2 all zero: dead, skipped
    space = np.array([[0, 0], [1, 0], [0, 3], [0, 4], [10, 10], [10, -10]], dtype=np.float32)
    return matrix, words, WordVectors(words, space)


def test_distance_ratio_by_hand() -> None:
    matrix, words, space = _intrusion_case()
    # dim 0: intra = d(wa, wb) = 1; inter = (d(wc, wa) + d(wc, wb)) / 2 = (3 + sqrt(10)) / 2
    # dim 1: intra = d(wc, wd) = 1; inter = (d(wa, wc) + d(wa, wd)) / 2 = (3 + 4) / 2
    expected = ((3 + np.sqrt(10)) / 2 + 3.5) / 2
    for m in (matrix, sp.csr_matrix(matrix)):
        res = distance_ratio(m, words, space, top_k=2, seed=0)
        assert res["dist_ratio"] == pytest.approx(expected, rel=1e-6)
        assert (res["n_dims_used"], res["n_dims_skipped"]) == (2, 1)


def test_distance_ratio_cosine_and_errors() -> None:
    matrix, words, space = _intrusion_case()
    # cosine: wc, wd are parallel (IntraDist 0) -> dim 1 skipped as degenerate;
    # dim 0: wa is the zero vector (distance 1 to all), wb ⟂ wc -> ratio 1
    res = distance_ratio(matrix[:, :2], words, space, top_k=2, metric="cosine")
    assert (res["n_dims_used"], res["n_dims_skipped"]) == (1, 1)
    assert res["dist_ratio"] == pytest.approx(1.0)
    with pytest.raises(SparsemmError, match="no vector"):
        distance_ratio(matrix, words, space.subset(words[:3]), top_k=2)
    with pytest.raises(SparsemmError, match="top_k"):
        distance_ratio(matrix, words, space, top_k=1)
    with pytest.raises(SparsemmError, match="no dimension"):
        distance_ratio(np.zeros((6, 2)), words, space, top_k=2)
