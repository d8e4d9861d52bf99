"""The SpLiCE research runs: the concept-embedding cache, the query coder, code inspection,
saving a decomposer, and the run on a collection (``splice_runs``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fakes import (
    CAPTION_FILLER,
    CAPTION_LABELS,
    SPLICE_CONCEPTS,
    labelled_caption_collection,
    splice_concept_embeddings,
    term_word_encoder,
)
from sparsemm.baselines.splice import SpliceDecomposer
from sparsemm.data.collection import write_collection
from sparsemm.errors import SparsemmError
from sparsemm_experiments.baselines.splice import (
    embed_concepts,
    explain,
    load_decomposer,
    reconstruction_cosine,
    save_decomposer,
    splice_query_coder,
    top_concepts,
)

CONCEPTS = SPLICE_CONCEPTS


_concept_embeddings = splice_concept_embeddings


def test_top_concepts_explain_and_reconstruction() -> None:
    cemb = _concept_embeddings()
    # Image mean = concept mean, so an image equal to concept j centres onto atom j.
    dec = SpliceDecomposer(CONCEPTS, l1_penalty=0.05, tol=1e-8).fit(cemb, cemb)
    codes = dec.transform(cemb)
    for j, word in enumerate(CONCEPTS):
        top = top_concepts(dec, codes, j, n=3)
        assert top[0][0] == word
        assert top[0][1] == pytest.approx(1.0 - 0.05, abs=1e-3)  # soft-thresholded 1
    cos = reconstruction_cosine(dec, cemb, codes)
    assert cos["cosine_centered"] > 0.99 and cos["cosine"] > 0.99
    assert explain(dec, cemb[:2], n=1) == [
        [("dog", pytest.approx(0.95, abs=1e-3))],
        [("cat", pytest.approx(0.95, abs=1e-3))],
    ]
    with pytest.raises(SparsemmError, match="out of range"):
        top_concepts(dec, codes, len(CONCEPTS))
    with pytest.raises(SparsemmError, match="concepts"):
        top_concepts(dec, codes[:, :3], 0)


def test_query_coder_codes_text_with_the_text_mean() -> None:
    cemb = _concept_embeddings()
    rng = np.random.default_rng(1)
    imgs = rng.normal(size=(10, 16)).astype(np.float32)
    texts = rng.normal(size=(7, 16)).astype(np.float32) + 2.0
    dec = SpliceDecomposer(CONCEPTS, l1_penalty=0.1).fit(imgs, cemb, texts)
    out = splice_query_coder(dec)(texts[:3], ["a", "b", "c"])
    assert out.shape == (3, len(CONCEPTS))
    np.testing.assert_allclose(out.toarray(), dec.transform(texts[:3], "text").toarray())


def test_save_and_load_round_trip(tmp_path) -> None:
    cemb = _concept_embeddings()
    imgs = np.random.default_rng(2).normal(size=(12, 16)).astype(np.float32)
    dec = SpliceDecomposer(CONCEPTS, l1_penalty=0.07).fit(imgs, cemb)
    save_decomposer(dec, tmp_path / "m")
    back = load_decomposer(tmp_path / "m")
    assert back.concepts == CONCEPTS and back.l1_penalty == 0.07
    np.testing.assert_array_equal(back.transform(imgs).toarray(), dec.transform(imgs).toarray())
    (tmp_path / "m" / "concepts.json").write_text(json.dumps(CONCEPTS[:2]))
    with pytest.raises(SparsemmError, match="does not match"):
        load_decomposer(tmp_path / "m")
    with pytest.raises(SparsemmError, match="not a saved SpLiCE"):
        load_decomposer(tmp_path / "nothing")


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

WORDS, FILLER = CAPTION_LABELS, CAPTION_FILLER
DIM = len(WORDS) + len(FILLER)


KeywordEncoder = term_word_encoder(
    WORDS + FILLER, "keyword-splice-test", fallback=True, register=True
)


def _collection(path, n_train: int = 60, n_test: int = 40):
    return labelled_caption_collection(path, KeywordEncoder(), n_train, n_test)


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
    back = load_decomposer(out / "splice_model")
    assert back.l1_penalty == info["l1_penalty"]


def test_run_splice_bench_refuses_a_bad_selection_rule(tmp_path) -> None:
    from sparsemm_experiments.splice_runs import run_splice_bench

    with pytest.raises(SparsemmError, match="select_by"):
        run_splice_bench(tmp_path / "c", tmp_path / "o", tmp_path / "v.txt", select_by="bm25")


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
