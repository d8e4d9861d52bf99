"""SpLiCE: the batched non-negative lasso against scikit-learn, the decomposer, the run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Lasso

from fakes import term_word_encoder
from sparsemm.baselines.splice import (
    SpliceDecomposer,
    embed_concepts,
    lasso_objective,
    load_concepts,
    nonneg_lasso,
    splice_query_coder,
)
from sparsemm.data.collection import write_collection
from sparsemm.errors import SparsemmError
from testdata import SHARED_DATA


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

CONCEPTS = ["dog", "cat", "car", "tree", "person", "ball", "bench", "kite"]


def _concept_embeddings(k: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(len(CONCEPTS), k)).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


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
    for j, word in enumerate(CONCEPTS):
        top = dec.top_concepts(codes, j, n=3)
        assert top[0][0] == word
        assert top[0][1] == pytest.approx(1.0 - 0.05, abs=1e-3)  # soft-thresholded 1
    cos = dec.reconstruction_cosine(cemb, codes)
    assert cos["cosine_centered"] > 0.99 and cos["cosine"] > 0.99
    assert dec.explain(cemb[:2], n=1) == [
        [("dog", pytest.approx(0.95, abs=1e-3))],
        [("cat", pytest.approx(0.95, abs=1e-3))],
    ]


def test_decomposer_text_mean_and_errors() -> None:
    cemb = _concept_embeddings()
    rng = np.random.default_rng(1)
    imgs = rng.normal(size=(10, 16)).astype(np.float32)
    texts = rng.normal(size=(7, 16)).astype(np.float32) + 2.0
    dec = SpliceDecomposer(CONCEPTS, l1_penalty=0.1).fit(imgs, cemb, texts)
    assert not np.allclose(dec.text_mean_, dec.image_mean_)
    qc = splice_query_coder(dec)
    out = qc(texts[:3], ["a", "b", "c"])
    assert out.shape == (3, len(CONCEPTS))
    np.testing.assert_allclose(out.toarray(), dec.transform(texts[:3], "text").toarray())
    with pytest.raises(SparsemmError, match="not fitted"):
        SpliceDecomposer(CONCEPTS).transform(imgs)
    with pytest.raises(SparsemmError, match="concept embeddings"):
        SpliceDecomposer(CONCEPTS[:3]).fit(imgs, cemb)
    with pytest.raises(SparsemmError, match="dimension"):
        dec.transform(imgs[:, :4])
    with pytest.raises(SparsemmError, match="modality"):
        dec.transform(imgs, "audio")
    with pytest.raises(SparsemmError, match="out of range"):
        dec.top_concepts(dec.transform(imgs[:1]), 3)


def test_save_and_load_round_trip(tmp_path) -> None:
    cemb = _concept_embeddings()
    imgs = np.random.default_rng(2).normal(size=(12, 16)).astype(np.float32)
    dec = SpliceDecomposer(CONCEPTS, l1_penalty=0.07).fit(imgs, cemb)
    dec.save_pretrained(tmp_path / "m")
    back = SpliceDecomposer.from_pretrained(tmp_path / "m")
    assert back.concepts == CONCEPTS and back.l1_penalty == 0.07
    np.testing.assert_array_equal(back.transform(imgs).toarray(), dec.transform(imgs).toarray())
    (tmp_path / "m" / "concepts.json").write_text(json.dumps(CONCEPTS[:2]))
    with pytest.raises(SparsemmError, match="does not match"):
        SpliceDecomposer.from_pretrained(tmp_path / "m")
    with pytest.raises(SparsemmError, match="not a saved SpLiCE"):
        SpliceDecomposer.from_pretrained(tmp_path / "nothing")


def test_load_concepts_takes_the_most_frequent(tmp_path) -> None:
    f = tmp_path / "vocab.txt"
    f.write_text("rare\nmid\n\nmid\ncommon\nthe\n")  # least to most frequent
    assert load_concepts(f, 3) == ["the", "common", "mid"]
    assert load_concepts(f, None) == ["the", "common", "mid", "rare"]
    with pytest.raises(SparsemmError, match="not found"):
        load_concepts(tmp_path / "missing.txt")


class _CountingEncoder:
    name = "counting"
    model_id = "v1"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        self.calls.append(list(texts))
        rng = np.random.default_rng(len(texts))
        return rng.normal(size=(len(texts), 6)).astype(np.float32)


def test_concept_embeddings_are_cached_by_fingerprint(tmp_path) -> None:
    enc = _CountingEncoder()
    first = embed_concepts(CONCEPTS, enc, tmp_path)
    again = embed_concepts(CONCEPTS, enc, tmp_path)
    np.testing.assert_array_equal(first, again)
    assert len(enc.calls) == 1
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    embed_concepts(CONCEPTS, enc, tmp_path, template="a photo of {}")
    assert enc.calls[-1][0] == "a photo of dog" and len(enc.calls) == 2
    embed_concepts(CONCEPTS[:4], enc, tmp_path)
    assert len(enc.calls) == 3
    assert len(list(tmp_path.glob("concepts-*.npy"))) == 3


# ----------------------------------------------------------------- run on a collection

WORDS = ["dog", "cat", "car", "tree", "person", "ball", "bench", "kite"]
FILLER = ["park", "street", "grass", "sky"]
DIM = len(WORDS) + len(FILLER)


KeywordEncoder = term_word_encoder(
    WORDS + FILLER, "keyword-splice-test", fallback=True, register=True
)


def _collection(path, n_train: int = 60, n_test: int = 40):
    rng = np.random.default_rng(0)
    enc = KeywordEncoder()
    items, texts = [], []
    for i in range(n_train + n_test):
        labels = sorted(rng.choice(WORDS, size=int(rng.integers(1, 4)), replace=False).tolist())
        caps = []
        for _ in range(3):
            said = [w for w in labels if rng.random() < 0.8] or labels[:1]
            caps.append(f"a {' and a '.join(said)} in the {rng.choice(FILLER)}")
        split = "train" if i < n_train else "test"
        items.append({"id": str(i), "labels": labels, "captions": caps, "split": split})
        texts += [{"item": i, "text": c} for c in caps]
    text_emb = enc.encode_text([t["text"] for t in texts])
    owner = np.array([t["item"] for t in texts])
    views = np.stack([text_emb[owner == i].mean(axis=0) for i in range(len(items))])
    views /= np.linalg.norm(views, axis=1, keepdims=True)
    return write_collection(
        path,
        items,
        {"name": "keyword-splice-test", "dim": DIM},
        image_emb=views,
        text_emb=text_emb,
        texts=texts,
    )


def test_run_splice_bench_end_to_end(tmp_path) -> None:
    from sparsemm_experiments.splice_runs import run_splice_bench

    col_dir = tmp_path / "collection"
    _collection(col_dir)
    vocab = tmp_path / "vocab.txt"
    # least to most frequent; "zebra" is never in any caption
    vocab.write_text("\n".join(["zebra", *FILLER, *WORDS]) + "\n")
    out = tmp_path / "run"
    content = run_splice_bench(
        col_dir,
        out,
        vocab,
        n_concepts=len(WORDS) + len(FILLER),
        l1_grid=(0.05, 0.2),
        methods=("avg_emb_0.5", "cbe", "code_a", "paper"),
        cache_dir=tmp_path / "cache",
        quick=True,  # two grid points per strategy (the fixture is below the item limit)
    )
    info = content["splice"]
    assert info["l1_penalty"] in (0.05, 0.2)
    assert [r["l1"] for r in info["sweep"]] == [0.2, 0.05]
    assert sum(r["chosen"] for r in info["sweep"]) == 1
    # a larger penalty gives sparser codes
    assert info["sweep"][0]["nnz"] < info["sweep"][1]["nnz"]
    means = content["subsets"]["all"]["means"]
    assert {"paper", "cbe", "code_a", "avg_emb_0.5"} <= set(means)
    assert 0.0 <= means["paper"]["ap@10"] <= 1.0
    assert (out / "splice.json").is_file() and (out / "codes.npz").is_file()
    assert "## SpLiCE" in (out / "report.md").read_text()
    # Keyword views are sums of word one-hots, so the top concepts are caption words.
    ex = info["examples"][0]
    assert ex["top_concepts"][0][0] in set(WORDS + FILLER)
    assert len(list((tmp_path / "cache").glob("concepts-*.npy"))) == 1
    back = SpliceDecomposer.from_pretrained(out / "splice_model")
    assert back.l1_penalty == info["l1_penalty"]


def test_run_splice_bench_refuses_a_bad_selection_rule(tmp_path) -> None:
    from sparsemm_experiments.splice_runs import run_splice_bench

    with pytest.raises(SparsemmError, match="select_by"):
        run_splice_bench(tmp_path / "c", tmp_path / "o", tmp_path / "v.txt", select_by="bm25")


@pytest.mark.skipif(not (SHARED_DATA / "splice" / "laion.txt").is_file(), reason="no shared data")
def test_real_laion_vocabulary() -> None:
    concepts = load_concepts(SHARED_DATA / "splice" / "laion.txt", 10000)
    assert len(concepts) == len(set(concepts)) == 10000
    assert concepts[:3] == ["-", "of", "the"]  # the file ends with the most frequent


def test_run_splice_bench_refuses_two_spaces(tmp_path) -> None:
    from sparsemm_experiments.splice_runs import run_splice_bench

    items = [{"id": "0", "split": "train", "labels": ["dog"], "captions": ["a dog"]}]
    write_collection(
        tmp_path / "c",
        items,
        {"name": "keyword-splice-test", "dim": 3},
        image_emb=np.eye(1, 3, dtype=np.float32),
        text_emb=np.ones((1, DIM), dtype=np.float32) / np.sqrt(DIM),
        texts=[{"item": 0, "text": "a dog"}],
        text_encoder={"name": "keyword-splice-test", "dim": DIM},
    )
    vocab = tmp_path / "v.txt"
    vocab.write_text("dog\n")
    with pytest.raises(SparsemmError, match="one space"):
        run_splice_bench(tmp_path / "c", tmp_path / "o", vocab)
