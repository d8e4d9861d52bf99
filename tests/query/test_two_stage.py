"""Candidates from the inverted index + exact rescoring == brute force (when the pool holds
the true top-k), on the toy searcher and on random data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from test_searcher import _collection, _identity_sr

from sparsemm.eval.retrieval import normalize_rows
from sparsemm.index import InvertedIndex
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.rank import rank_query
from sparsemm.query.searcher import Searcher, build_index
from sparsemm.query.strategies import ExclusionContext
from sparsemm.query.two_stage import include_proxy, two_stage_rank


@pytest.fixture()
def searcher(tmp_path: Path) -> Searcher:
    col = _collection(tmp_path)
    build_index(col, _identity_sr(tmp_path))
    return Searcher(col)


@pytest.mark.parametrize("text", ["dog but not cat", "a dog and a tree, no ball", "pizza -car"])
def test_full_pool_equals_brute_force(searcher: Searcher, text: str) -> None:
    q = parse_query(text)
    rows, scores = rank_query(searcher.context, q, "hybrid", k=5)
    got, got_scores = two_stage_rank(searcher.index, searcher.context, q, k=5, candidates=12)
    assert got.tolist() == rows.tolist()
    assert np.allclose(got_scores, scores, atol=1e-5)


def test_exclusion_only_and_bad_pool(searcher: Searcher) -> None:
    q = parse_query("no cat")
    assert two_stage_rank(searcher.index, searcher.context, q, k=3, candidates=3)[0].tolist() == (
        rank_query(searcher.context, q, "hybrid", k=3)[0].tolist()
    )
    from sparsemm.errors import SparsemmError

    with pytest.raises(SparsemmError, match="candidates"):
        two_stage_rank(searcher.index, searcher.context, q, k=5, candidates=2)


class _Enc:
    """Text "tJ" -> unit vector J of R^40 (the query code is the text embedding)."""

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        out = np.zeros((len(texts), 40), np.float32)
        for i, t in enumerate(texts):
            for w in t.split():
                if w.startswith("t") and w[1:].isdigit():
                    out[i, int(w[1:])] = 1.0
        return out


def test_random_codes_recall(tmp_path: Path) -> None:
    """On random unit codes a pool of 200 of 2,000 items holds the true top-10 (no
    detectors: the proxy is the include score itself, and exclusions only lower it)."""
    rng = np.random.default_rng(0)
    codes = sp.random(2000, 40, density=0.2, random_state=rng, format="csr", dtype=np.float32)
    codes = normalize_rows(codes)  # the index holds unit codes, as build_index writes them
    index = InvertedIndex.build(tmp_path / "ix", codes, [str(i) for i in range(2000)])
    ctx = ExclusionContext(
        items_codes=codes, text_encoder=_Enc(), query_coder=lambda e, t: sp.csr_matrix(e)
    )
    for a in range(0, 40, 4):
        q = Query((f"t{a} t{a + 1}",), (f"t{a + 2}",))
        want = rank_query(ctx, q, "hybrid", k=10)[0].tolist()
        got = two_stage_rank(index, ctx, q, k=10, candidates=200)[0].tolist()
        assert got == want
        dims, weights = include_proxy(ctx_strategy(ctx), q)
        assert set(dims.tolist()) == {a, a + 1} and (weights > 0).all()


def ctx_strategy(ctx: ExclusionContext):  # the served scorer on ctx
    from sparsemm.query.rank import build_strategy

    return build_strategy(ctx, "hybrid")
