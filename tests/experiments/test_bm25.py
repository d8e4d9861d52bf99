"""BM25 over captions: scores equal the Lucene formula, exclusion and leave-one-out rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sparsemm.errors import SparsemmError
from sparsemm.query.strategies import term_tokens
from sparsemm_experiments.baselines.bm25 import BM25Config, CaptionBM25, caption_retrieval

CAPTIONS = [
    ["A dog runs in the park.", "A brown dog with a ball."],  # 0 dog
    ["Two dogs and a cat on a sofa."],  # 1 dog + cat
    ["A cat sleeping on a bed.", "A cat sleeping."],  # 2 cat
    ["A red car on the street."],  # 3 neither
    ["A dog chasing a cat in a garden.", "dog and cat"],  # 4 dog + cat
    ["A dog on a beach at sunset."],  # 5 dog
]


def naive_bm25(docs: list[list[str]], query: list[str], k1: float, b: float) -> np.ndarray:
    """Lucene's BM25: sum over query terms of idf x tf / (tf + k1 (1 - b + b dl / avgdl)),
    idf = ln(1 + (N - df + 0.5) / (df + 0.5))."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    out = np.zeros(n)
    for t in set(query):
        df = sum(t in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(t)
            if tf:
                out[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
    return out


def test_scores_equal_the_lucene_formula() -> None:
    bm = CaptionBM25(BM25Config(k1=1.2, b=0.75)).fit(CAPTIONS)
    docs = [[t for c in caps for t in term_tokens(c)] for caps in CAPTIONS]
    for query in ("dog", "cat on a sofa", "red car street", "zebra"):
        want = naive_bm25(docs, term_tokens(query), 1.2, 0.75)
        assert np.allclose(bm.scores(query), want, rtol=1e-5, atol=1e-6), query
    assert np.array_equal(bm.scores("the of a"), np.zeros(len(CAPTIONS)))  # no content token


def test_rank_keeps_only_matching_items() -> None:
    bm = CaptionBM25().fit(CAPTIONS)
    top = bm.rank("dog", 10)
    assert set(top.tolist()) == {0, 1, 4, 5}  # "dogs" is singularised
    assert top[0] in (0, 4)  # the items mentioning dog twice come first
    assert bm.rank("zebra", 10).size == 0


def test_exclusion_demotes_or_removes_items_mentioning_b() -> None:
    bm = CaptionBM25().fit(CAPTIONS)
    demoted = bm.rank_exclusion("dog", "cat", 10)
    assert set(demoted[:2].tolist()) == {0, 5} and set(demoted[2:].tolist()) == {1, 4}
    s = bm.scores("dog")
    assert list(demoted[:2]) == sorted([0, 5], key=lambda i: -s[i])
    removed = bm.rank_exclusion("dog", "cat", 10, rule="remove")
    assert set(removed.tolist()) == {0, 5}
    out = bm.rank_many([("dog", "cat"), ("car", "dog"), ("zebra", "dog")], 3)
    assert out.shape == (3, 3)
    assert out[1].tolist() == [3, -1, -1] and out[2].tolist() == [-1, -1, -1]
    with pytest.raises(SparsemmError):
        bm.rank_exclusion("dog", "cat", 10, rule="drop")


def test_caption_retrieval_leaves_the_query_out() -> None:
    caps = [c for group in CAPTIONS for c in group]
    owner = np.array([i for i, group in enumerate(CAPTIONS) for _ in group])
    ranks = caption_retrieval(caps, owner, np.arange(len(caps)), k=3)
    assert ranks.shape == (len(caps), 3)
    # "A red car on the street." is its item's only caption: without itself nothing matches
    # its item, so item 3 cannot be found.
    row = caps.index("A red car on the street.")
    assert 3 not in ranks[row].tolist()
    # "A cat sleeping." finds its own item through the other caption (cat + sleeping).
    row = caps.index("A cat sleeping.")
    assert ranks[row][0] == 2
    for r in ranks:  # items, not captions: no duplicates
        valid = r[r >= 0]
        assert len(set(valid.tolist())) == len(valid)


def test_bad_use() -> None:
    with pytest.raises(SparsemmError):
        CaptionBM25().scores("dog")
    with pytest.raises(SparsemmError):
        CaptionBM25().fit([])
    with pytest.raises(SparsemmError):
        BM25Config(b=2.0)
