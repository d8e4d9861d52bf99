"""SpLiCE: the batched non-negative lasso against scikit-learn, and the decomposer."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Lasso

from fakes import SPLICE_CONCEPTS, splice_concept_embeddings
from sparsemm.baselines.splice import SpliceDecomposer, load_concepts, nonneg_lasso
from sparsemm.errors import SparsemmError
from testdata import SHARED_DATA


def lasso_objective(D: np.ndarray, Z: np.ndarray, W: np.ndarray, lam: float) -> np.ndarray:
    """(n,) values of ``0.5 ||z_i - w_i D||^2 + lam ||w_i||_1`` (D (a, k), Z (n, k), W (n, a))."""
    Wd = np.asarray(W, dtype=np.float64)
    r = np.asarray(Z, dtype=np.float64) - Wd @ np.asarray(D, dtype=np.float64)
    return 0.5 * (r * r).sum(axis=1) + lam * np.abs(Wd).sum(axis=1)


def _problem(a: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    D = rng.normal(size=(a, k))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    Z = rng.normal(size=(n, k))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    return D.astype(np.float32), Z.astype(np.float32)


def _sklearn(D: np.ndarray, Z: np.ndarray, lam: float) -> np.ndarray:
    """Reference: Lasso(positive) minimises 1/(2k)||z - D^T w||^2 + alpha|w|_1, alpha = lam/k."""
    k = D.shape[1]
    model = Lasso(alpha=lam / k, positive=True, fit_intercept=False, tol=1e-12, max_iter=200000)
    X = D.T.astype(np.float64)
    return np.stack([model.fit(X, z.astype(np.float64)).coef_.copy() for z in Z])


@pytest.mark.parametrize(("a", "k"), [(40, 12), (150, 20)])
@pytest.mark.parametrize("lam", [0.02, 0.1, 0.3])
def test_cd_matches_sklearn_positive_lasso(a: int, k: int, lam: float) -> None:
    D, Z = _problem(a, k, 6, seed=a + int(100 * lam))
    ref = _sklearn(D, Z, lam)
    # A working set of 8 atoms forces KKT rounds (violators entering) and set growth.
    W = nonneg_lasso(D, Z, lam, tol=1e-9, working_set=8).toarray()
    assert W.shape == (6, a)
    assert (W >= 0).all()
    np.testing.assert_allclose(W, ref, atol=2e-5)
    gap = lasso_objective(D, Z, W, lam) - lasso_objective(D, Z, ref, lam)
    assert np.abs(gap).max() < 1e-7
    np.testing.assert_array_equal(W > 1e-6, ref > 1e-6)  # same support


@pytest.mark.parametrize("lam", [0.05, 0.25])
def test_admm_matches_sklearn_positive_lasso(lam: float) -> None:
    D, Z = _problem(60, 16, 5, seed=7)
    ref = _sklearn(D, Z, lam)
    W = nonneg_lasso(D, Z, lam, method="admm", tol=1e-9, max_iter=20000).toarray()
    np.testing.assert_allclose(W, ref, atol=1e-4)
    gap = lasso_objective(D, Z, W, lam) - lasso_objective(D, Z, ref, lam)
    assert np.abs(gap).max() < 1e-6


def test_batches_and_working_sets_do_not_change_the_answer() -> None:
    D, Z = _problem(120, 16, 9, seed=3)
    one = nonneg_lasso(D, Z, 0.08, tol=1e-9, batch_size=1, working_set=120).toarray()
    many = nonneg_lasso(D, Z, 0.08, tol=1e-9, batch_size=4, working_set=6).toarray()
    np.testing.assert_allclose(one, many, atol=1e-6)


def test_large_penalty_gives_zero_codes_and_bad_inputs_raise() -> None:
    D, Z = _problem(30, 8, 3, seed=1)
    big = float(np.abs(Z @ D.T).max()) + 1e-3
    assert nonneg_lasso(D, Z, big).nnz == 0
    with pytest.raises(SparsemmError, match="l1 penalty"):
        nonneg_lasso(D, Z, -0.1)
    with pytest.raises(SparsemmError, match="dimension"):
        nonneg_lasso(D, Z[:, :5], 0.1)
    bad = Z.copy()
    bad[0, 0] = np.nan
    with pytest.raises(SparsemmError, match="NaN"):
        nonneg_lasso(D, bad, 0.1)
    with pytest.raises(SparsemmError, match="method"):
        nonneg_lasso(D, Z, 0.1, method="lars")


# ------------------------------------------------------------------------- decomposer

CONCEPTS = SPLICE_CONCEPTS


_concept_embeddings = splice_concept_embeddings


def test_decomposer_centres_and_recovers_a_concept() -> None:
    cemb = _concept_embeddings()
    # Image mean = concept mean, so an image equal to concept j centres onto atom j.
    dec = SpliceDecomposer(CONCEPTS, l1_penalty=0.05, tol=1e-8).fit(cemb, cemb)
    np.testing.assert_allclose(dec.image_mean_, cemb.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(dec.dictionary_, axis=1), 1.0, atol=1e-5)
    z = dec.center(cemb)
    np.testing.assert_allclose(z, dec.dictionary_, atol=1e-5)
    codes = dec.transform(cemb)
    assert sp.isspmatrix_csr(codes) and codes.shape == (len(CONCEPTS), len(CONCEPTS))
    assert (codes.data > 0).all()
    w = codes.toarray()
    np.testing.assert_array_equal(w.argmax(axis=1), np.arange(len(CONCEPTS)))
    np.testing.assert_allclose(w.max(axis=1), 1.0 - 0.05, atol=1e-3)  # soft-thresholded 1
    rebuilt = dec.recompose(codes)
    assert (rebuilt * (cemb / np.linalg.norm(cemb, axis=1, keepdims=True))).sum(1).min() > 0.99


def test_decomposer_text_mean_and_errors() -> None:
    cemb = _concept_embeddings()
    rng = np.random.default_rng(1)
    imgs = rng.normal(size=(10, 16)).astype(np.float32)
    texts = rng.normal(size=(7, 16)).astype(np.float32) + 2.0
    dec = SpliceDecomposer(CONCEPTS, l1_penalty=0.1).fit(imgs, cemb, texts)
    assert not np.allclose(dec.text_mean_, dec.image_mean_)
    # text targets are centred with the text mean, not the image mean
    assert not np.allclose(dec.center(texts[:3], "text"), dec.center(texts[:3], "image"))
    with pytest.raises(SparsemmError, match="not fitted"):
        SpliceDecomposer(CONCEPTS).transform(imgs)
    with pytest.raises(SparsemmError, match="concept embeddings"):
        SpliceDecomposer(CONCEPTS[:3]).fit(imgs, cemb)
    with pytest.raises(SparsemmError, match="dimension"):
        dec.transform(imgs[:, :4])
    with pytest.raises(SparsemmError, match="modality"):
        dec.transform(imgs, "audio")


def test_load_concepts_takes_the_most_frequent(tmp_path) -> None:
    f = tmp_path / "vocab.txt"
    f.write_text("rare\nmid\n\nmid\ncommon\nthe\n")  # least to most frequent
    assert load_concepts(f, 3) == ["the", "common", "mid"]
    assert load_concepts(f, None) == ["the", "common", "mid", "rare"]
    with pytest.raises(SparsemmError, match="not found"):
        load_concepts(tmp_path / "missing.txt")


@pytest.mark.skipif(not (SHARED_DATA / "splice" / "laion.txt").is_file(), reason="no shared data")
def test_real_laion_vocabulary() -> None:
    concepts = load_concepts(SHARED_DATA / "splice" / "laion.txt", 10000)
    assert len(concepts) == len(set(concepts)) == 10000
    assert concepts[:3] == ["-", "of", "the"]  # the file ends with the most frequent
