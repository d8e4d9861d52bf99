"""Lexicon export: Anserini JsonVectorCollection and ES/OpenSearch rank_features files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm_experiments.export import (
    es_feature_name,
    es_term,
    quantize,
    rank_features_mapping,
    rank_features_query,
    validate_anserini_document,
    validate_rank_features_document,
    write_anserini_collection,
    write_anserini_queries,
    write_rank_features,
    write_rank_features_queries,
)

TERMS = ["dog", "cat", "##s", ".", "u.s.", "50%", "red"]
IDS = ["img-1", "img-2", "img-3"]


def _codes() -> sp.csr_matrix:
    dense = np.array(
        [
            [1.234, 0.0, 0.004, 0.5, 0.0, 0.0, 2.0],  # 0.004 rounds to 0 at scale 100
            [0.0, 0.75, 0.0, 0.0, 1.5, 0.2, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # an empty document
        ],
        dtype=np.float32,
    )
    return sp.csr_matrix(dense)


def _lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_anserini_collection_format(tmp_path) -> None:
    path = tmp_path / "docs" / "docs.jsonl"
    stats = write_anserini_collection(path, IDS, _codes(), TERMS, scale=100)
    lines = _lines(path)
    assert len(lines) == 3 and stats.documents == 3
    docs = [json.loads(line) for line in lines]  # one JSON object per line
    for doc in docs:
        assert set(doc) == {"id", "contents", "vector"}
        assert isinstance(doc["id"], str) and doc["contents"] == ""
        for term, w in doc["vector"].items():
            assert isinstance(w, int) and not isinstance(w, bool) and w > 0
            assert not any(ch.isspace() for ch in term)
        validate_anserini_document(doc)
    assert docs[0] == {
        "id": "img-1",
        "contents": "",
        "vector": {"dog": 123, ".": 50, "red": 200},
    }
    assert docs[1]["vector"] == {"cat": 75, "u.s.": 150, "50%": 20}
    assert docs[2]["vector"] == {}
    assert stats.postings == 6 and stats.dropped == 1


def test_anserini_queries_repeat_terms_by_weight(tmp_path) -> None:
    q = sp.csr_matrix(np.array([[0.03, 0.0, 0.0, 0.0, 0.0, 0.0, 0.011]], dtype=np.float32))
    write_anserini_queries(tmp_path / "q.tsv", ["q1"], q, TERMS, scale=100)
    qid, text = _lines(tmp_path / "q.tsv")[0].split("\t")
    assert qid == "q1"
    toks = text.split(" ")
    assert toks.count("dog") == 3 and toks.count("red") == 1 and len(toks) == 4


def test_quantize_rounds_and_drops_zeros() -> None:
    q = quantize(_codes(), 100)
    assert q.dtype == np.int32
    assert q[0, 0] == 123 and q[0, 2] == 0 and q.nnz == 6
    with pytest.raises(SparsemmError):
        quantize(_codes(), 0)


def test_rank_features_bulk_and_mapping(tmp_path) -> None:
    mapping = rank_features_mapping("lexicon")
    assert mapping["mappings"]["properties"]["lexicon"] == {"type": "rank_features"}
    path = tmp_path / "bulk.ndjson"
    stats = write_rank_features(path, IDS, _codes(), TERMS, index="items")
    lines = _lines(path)
    assert len(lines) == 2 * len(IDS)  # action line + source line per document
    for i, (action, source) in enumerate(zip(lines[0::2], lines[1::2], strict=True)):
        act, doc = json.loads(action), json.loads(source)
        assert act == {"index": {"_index": "items", "_id": IDS[i]}}
        assert doc["id"] == IDS[i]
        for name, value in doc["lexicon"].items():
            # The documented constraints: strictly positive finite values, no dots in names.
            assert isinstance(value, float) and math.isfinite(value) and value > 0
            assert "." not in name and name
        validate_rank_features_document(doc)
    first = json.loads(lines[1])["lexicon"]
    assert first == pytest.approx({"dog": 1.234, "##s": 0.004, "%2E": 0.5, "red": 2.0})
    second = json.loads(lines[3])["lexicon"]
    assert set(second) == {"cat", "u%2Es%2E", "50%25"}
    assert json.loads(lines[5])["lexicon"] == {}
    assert stats.postings == 7 and stats.dropped == 0


def test_feature_name_escaping_is_reversible() -> None:
    for term in [*TERMS, "%2E", "a%b.c", "..."]:
        name = es_feature_name(term)
        assert "." not in name and es_term(name) == term
    names = [es_feature_name(t) for t in ["%2E", "."]]
    assert len(set(names)) == 2  # "%2E" and "." stay distinct


def test_rank_features_query_scores_the_dot_product(tmp_path) -> None:
    codes = _codes()
    q = sp.csr_matrix(np.array([[0.5, 0.2, 0.0, 1.0, 0.3, 0.0, 0.1]], dtype=np.float32))
    write_rank_features_queries(tmp_path / "q.jsonl", ["q1"], q, TERMS, size=5)
    body = json.loads(_lines(tmp_path / "q.jsonl")[0])["body"]
    assert body["size"] == 5
    clauses = body["query"]["bool"]["should"]
    assert all(set(c["rank_feature"]) == {"field", "linear", "boost"} for c in clauses)
    write_rank_features(tmp_path / "b.ndjson", IDS, codes, TERMS, index="items")
    docs = [json.loads(x) for x in _lines(tmp_path / "b.ndjson")[1::2]]
    # rank_feature with the linear function scores boost * value; bool.should sums them.
    for i, doc in enumerate(docs):
        score = 0.0
        for c in clauses:
            field, name = c["rank_feature"]["field"].split(".", 1)
            score += c["rank_feature"]["boost"] * doc[field].get(name, 0.0)
        assert score == pytest.approx(float((codes[i] @ q.T).toarray()[0, 0]), rel=1e-5)
    assert rank_features_query({"dog": 0.0})["query"]["bool"]["should"] == []


def test_validators_reject_what_the_engines_reject() -> None:
    ok = {"id": "a", "contents": "", "vector": {"dog": 3}}
    validate_anserini_document(ok)
    for bad in (
        {"id": "a", "contents": "", "vector": {"dog": 1.5}},
        {"id": "a", "contents": "", "vector": {"dog": 0}},
        {"id": "a", "contents": "", "vector": {"hot dog": 2}},
        {"id": "", "contents": "", "vector": {}},
        {"id": "a", "vector": {}},
    ):
        with pytest.raises(SparsemmError):
            validate_anserini_document(bad)
    validate_rank_features_document({"lexicon": {"dog": 0.1}})
    for feats in ({"dog": 0.0}, {"dog": -1.0}, {"a.b": 1.0}, {"dog": float("inf")}, {"": 1.0}):
        with pytest.raises(SparsemmError):
            validate_rank_features_document({"lexicon": feats})


def test_bad_inputs_raise(tmp_path) -> None:
    neg = sp.csr_matrix(np.array([[-1.0, 0, 0, 0, 0, 0, 0]], dtype=np.float32))
    with pytest.raises(SparsemmError, match="non-negative"):
        write_anserini_collection(tmp_path / "x.jsonl", ["a"], neg, TERMS)
    nan = sp.csr_matrix(np.array([[np.nan, 0, 0, 0, 0, 0, 0]], dtype=np.float32))
    with pytest.raises(SparsemmError, match="NaN"):
        write_rank_features(tmp_path / "x.ndjson", ["a"], nan, TERMS, index="i")
    with pytest.raises(SparsemmError, match="whitespace"):
        write_anserini_collection(tmp_path / "x.jsonl", IDS, _codes(), ["a b", *TERMS[1:]])
    with pytest.raises(SparsemmError, match="columns"):
        write_anserini_collection(tmp_path / "x.jsonl", IDS, _codes(), TERMS[:3])
    with pytest.raises(SparsemmError, match="unique"):
        write_anserini_collection(tmp_path / "x.jsonl", ["a", "a", "b"], _codes(), TERMS)
    with pytest.raises(SparsemmError, match="index name"):
        write_rank_features(tmp_path / "x.ndjson", IDS, _codes(), TERMS, index="My Index")
    with pytest.raises(SparsemmError, match="field"):
        rank_features_mapping("a.b")
    assert not (tmp_path / "x.jsonl").exists()  # nothing half-written
