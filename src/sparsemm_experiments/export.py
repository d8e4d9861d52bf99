"""Lexicon export for term-based engines: Anserini impact collections and ES/OpenSearch.

Sparse lexicon codes (n, V) whose columns are words (LexLIP, VDR, or any model with a term
list) become documents a term engine can index, so the same items can be served by
Lucene-based systems instead of :class:`sparsemm.index.InvertedIndex`.

**Anserini** ``JsonVectorCollection`` (indexed with ``IndexCollection -collection
JsonVectorCollection -impact -pretokenized``): one JSON object per line,
``{"id": str, "contents": "", "vector": {term: int}}``. With ``-impact`` a term's weight is
used as its term frequency and scores are sums of query-weight x document-weight, so
weights must be positive integers: ``round(w * scale)`` (``scale`` 100 is Anserini's usual
choice for SPLADE-style weights); entries that round to 0 are dropped. ``-pretokenized``
splits on whitespace, so a term must not contain any. Queries go into a TSV file
(``TsvString`` topic reader): ``id<TAB>term term ...`` with each term repeated by its
quantised weight (query term frequency = weight).

**Elasticsearch / OpenSearch** ``rank_features`` field: each document carries
``{field: {feature: value}}``. The documented constraints: values must be strictly
positive, finite numbers (zero and negative values are rejected; Lucene keeps about 9
significant bits), and feature names must not contain dots (a dot would read as an object
path; Elasticsearch rejects them). Names are therefore escaped reversibly: ``%`` -> ``%25``
and ``.`` -> ``%2E`` (:func:`es_feature_name`). Output: ``mapping.json`` (index body with the
``rank_features`` mapping), ``bulk.ndjson`` (``_bulk`` API: an action line then the source
line per document) and, for queries, ``queries.jsonl`` of search bodies: a ``bool.should``
of ``rank_feature`` queries with the ``linear`` function and the query weight as ``boost``,
i.e. score = sum_t q_t x w_t (the same dot product as the inverted index).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, write_json

ANSERINI_SCALE = 100.0
ES_FIELD = "lexicon"
_WS = re.compile(r"\s")


@dataclass(frozen=True)
class ExportStats:
    """What an export wrote."""

    path: str
    documents: int
    postings: int  # (document, term) entries written
    dropped: int  # entries whose quantised weight was 0 (Anserini) or that were <= 0
    bytes: int


def _check_codes(codes: Any, ids: Sequence[str], terms: Sequence[str]) -> sp.csr_matrix:
    csr = sp.csr_matrix(codes, dtype=np.float32)
    if csr.shape[0] != len(ids):
        raise SparsemmError(f"{csr.shape[0]} code rows for {len(ids)} ids; they must match")
    if csr.shape[1] != len(terms):
        raise SparsemmError(
            f"codes have {csr.shape[1]} columns but {len(terms)} terms were given; pass the "
            "model's term list"
        )
    if not np.isfinite(csr.data).all():
        raise SparsemmError("codes contain NaN or inf; re-encode those items")
    if (csr.data < 0).any():
        raise SparsemmError(
            "term engines need non-negative term weights; these codes have negative values"
        )
    if len(set(ids)) != len(ids) or any(not str(i) for i in ids):
        raise SparsemmError("document ids must be unique, non-empty strings")
    if len(set(terms)) != len(terms) or any(not t for t in terms):
        raise SparsemmError("terms must be unique, non-empty strings")
    csr.sum_duplicates()
    csr.sort_indices()
    return csr


def quantize(codes: sp.csr_matrix, scale: float = ANSERINI_SCALE) -> sp.csr_matrix:
    """Integer impacts round(w * scale) as an int32 CSR (entries rounding to 0 removed)."""
    if not (math.isfinite(scale) and scale > 0):
        raise SparsemmError(f"scale must be a positive number, got {scale}")
    q = sp.csr_matrix(codes, dtype=np.float64, copy=True)
    q.data = np.rint(q.data * scale)
    if q.data.size and q.data.max() > np.iinfo(np.int32).max:
        raise SparsemmError("quantised weights overflow int32; use a smaller --scale")
    out = sp.csr_matrix(q, dtype=np.int32)
    out.eliminate_zeros()
    return out


def _rows(csr: sp.csr_matrix) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    for i in range(csr.shape[0]):
        lo, hi = csr.indptr[i], csr.indptr[i + 1]
        yield i, csr.indices[lo:hi], csr.data[lo:hi]


# ------------------------------------------------------------------------------ Anserini


def _check_anserini_terms(terms: Sequence[str]) -> None:
    bad = [t for t in terms if _WS.search(t)]
    if bad:
        raise SparsemmError(
            f"Anserini pretokenized terms cannot contain whitespace: {bad[:3]}; rename them"
        )


def anserini_documents(
    ids: Sequence[str], codes: Any, terms: Sequence[str], scale: float = ANSERINI_SCALE
) -> Iterator[dict[str, Any]]:
    """JsonVectorCollection objects ``{"id", "contents": "", "vector": {term: int}}``."""
    csr = _check_codes(codes, ids, terms)
    _check_anserini_terms(terms)
    q = quantize(csr, scale)
    for i, cols, vals in _rows(q):
        yield {
            "id": str(ids[i]),
            "contents": "",
            "vector": {terms[c]: int(v) for c, v in zip(cols.tolist(), vals.tolist(), strict=True)},
        }


def write_anserini_collection(
    path: str | Path,
    ids: Sequence[str],
    codes: Any,
    terms: Sequence[str],
    scale: float = ANSERINI_SCALE,
) -> ExportStats:
    """Write a JsonVectorCollection file (one JSON object per line), atomically."""
    csr = _check_codes(codes, ids, terms)
    n_nonzero = int(csr.nnz)
    postings = 0
    path = Path(path)
    with atomic_open(path, "w") as fh:
        for doc in anserini_documents(ids, csr, terms, scale):
            postings += len(doc["vector"])
            fh.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
            fh.write("\n")
    return ExportStats(str(path), len(ids), postings, n_nonzero - postings, path.stat().st_size)


def write_anserini_queries(
    path: str | Path,
    ids: Sequence[str],
    codes: Any,
    terms: Sequence[str],
    scale: float = ANSERINI_SCALE,
) -> ExportStats:
    """Write a ``TsvString`` topics file: ``id<TAB>`` + each term repeated by its weight.

    A query whose weights all round to 0 is written with an empty term list.
    """
    csr = _check_codes(codes, ids, terms)
    _check_anserini_terms(terms)
    bad = [i for i in ids if "\t" in str(i) or "\n" in str(i)]
    if bad:
        raise SparsemmError(f"query ids cannot contain tabs or newlines: {bad[:3]}")
    q = quantize(csr, scale)
    path = Path(path)
    with atomic_open(path, "w") as fh:
        for i, cols, vals in _rows(q):
            words = [
                terms[c]
                for c, v in zip(cols.tolist(), vals.tolist(), strict=True)
                for _ in range(v)
            ]
            fh.write(f"{ids[i]}\t{' '.join(words)}\n")
    return ExportStats(str(path), len(ids), int(q.nnz), int(csr.nnz - q.nnz), path.stat().st_size)


def validate_anserini_document(obj: Any) -> None:
    """Raise SparsemmError unless ``obj`` is a valid JsonVectorCollection document."""
    if not isinstance(obj, dict) or set(obj) != {"id", "contents", "vector"}:
        raise SparsemmError(
            f"an Anserini vector document has exactly id, contents, vector: {obj!r}"
        )
    if not isinstance(obj["id"], str) or not obj["id"]:
        raise SparsemmError("Anserini document id must be a non-empty string")
    if not isinstance(obj["contents"], str):
        raise SparsemmError("Anserini document contents must be a string")
    vec = obj["vector"]
    if not isinstance(vec, dict):
        raise SparsemmError("Anserini vector must be an object {term: weight}")
    for term, w in vec.items():
        if not isinstance(term, str) or not term or _WS.search(term):
            raise SparsemmError(f"bad Anserini term {term!r} (non-empty, no whitespace)")
        if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
            raise SparsemmError(f"Anserini impact of {term!r} must be a positive integer: {w!r}")


# ------------------------------------------------------------------ ES / OpenSearch


def es_feature_name(term: str) -> str:
    """A rank_features-safe feature name: ``%`` -> ``%25``, ``.`` -> ``%2E`` (reversible)."""
    if not term:
        raise SparsemmError("feature names must be non-empty")
    return term.replace("%", "%25").replace(".", "%2E")


def es_term(name: str) -> str:
    """Inverse of :func:`es_feature_name`."""
    return name.replace("%2E", ".").replace("%25", "%")


def _check_field(field: str) -> None:
    if not field or "." in field or field.startswith("_"):
        raise SparsemmError(
            f"bad field name {field!r}: use a non-empty name without dots that does not start "
            "with '_'"
        )


def rank_features_mapping(field: str = ES_FIELD) -> dict[str, Any]:
    """Index-creation body: ``id`` as keyword, ``field`` as rank_features."""
    _check_field(field)
    return {
        "mappings": {
            "properties": {
                "id": {"type": "keyword"},
                field: {"type": "rank_features"},
            }
        }
    }


def rank_features_documents(
    ids: Sequence[str], codes: Any, terms: Sequence[str], field: str = ES_FIELD
) -> Iterator[dict[str, Any]]:
    """Source documents ``{"id": id, field: {feature: float > 0}}`` (zero weights dropped)."""
    _check_field(field)
    csr = _check_codes(codes, ids, terms)
    names = [es_feature_name(t) for t in terms]
    if len(set(names)) != len(names):
        raise SparsemmError("escaped feature names collide; terms must differ after escaping")
    for i, cols, vals in _rows(csr):
        keep = vals > 0
        yield {
            "id": str(ids[i]),
            field: {
                names[c]: float(v)
                for c, v in zip(cols[keep].tolist(), vals[keep].tolist(), strict=True)
            },
        }


def write_rank_features(
    path: str | Path,
    ids: Sequence[str],
    codes: Any,
    terms: Sequence[str],
    index: str,
    field: str = ES_FIELD,
) -> ExportStats:
    """Write an ``_bulk`` NDJSON file indexing every document into ``index``, atomically."""
    if not index or index != index.lower() or any(c in index for c in ' "*\\<|,>/?#:'):
        raise SparsemmError(
            f'bad index name {index!r}: lowercase, no spaces or any of " * \\ < | , > / ? # :'
        )
    csr = _check_codes(codes, ids, terms)
    path = Path(path)
    postings = 0
    with atomic_open(path, "w") as fh:
        for doc in rank_features_documents(ids, csr, terms, field):
            postings += len(doc[field])
            action = {"index": {"_index": index, "_id": doc["id"]}}
            fh.write(json.dumps(action, separators=(",", ":")) + "\n")
            fh.write(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
    return ExportStats(str(path), len(ids), postings, int(csr.nnz) - postings, path.stat().st_size)


def rank_features_query(
    weights: Mapping[str, float], field: str = ES_FIELD, size: int = 10
) -> dict[str, Any]:
    """Search body scoring sum_t q_t x doc_t: ``rank_feature`` with ``linear``, boost q_t."""
    _check_field(field)
    should = [
        {
            "rank_feature": {
                "field": f"{field}.{es_feature_name(t)}",
                "linear": {},
                "boost": float(w),
            }
        }
        for t, w in weights.items()
        if w > 0
    ]
    return {"size": int(size), "query": {"bool": {"should": should}}}


def write_rank_features_queries(
    path: str | Path,
    ids: Sequence[str],
    codes: Any,
    terms: Sequence[str],
    field: str = ES_FIELD,
    size: int = 10,
) -> ExportStats:
    """Write ``{"id": ..., "body": <search body>}`` per line for each query code row."""
    csr = _check_codes(codes, ids, terms)
    path = Path(path)
    n = 0
    with atomic_open(path, "w") as fh:
        for i, cols, vals in _rows(csr):
            weights = {
                terms[c]: float(v) for c, v in zip(cols.tolist(), vals.tolist(), strict=True)
            }
            body = rank_features_query(weights, field, size)
            n += len(body["query"]["bool"]["should"])
            fh.write(json.dumps({"id": str(ids[i]), "body": body}, ensure_ascii=False) + "\n")
    return ExportStats(str(path), len(ids), n, int(csr.nnz) - n, path.stat().st_size)


def validate_rank_features_document(doc: Any, field: str = ES_FIELD) -> None:
    """Raise SparsemmError unless ``doc[field]`` satisfies the rank_features constraints."""
    if not isinstance(doc, dict) or field not in doc:
        raise SparsemmError(f"document has no {field!r} field: {doc!r}")
    feats = doc[field]
    if not isinstance(feats, dict):
        raise SparsemmError("a rank_features value is an object {feature: number}")
    for name, value in feats.items():
        if not isinstance(name, str) or not name or "." in name:
            raise SparsemmError(f"rank_features names must be non-empty and dot-free: {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SparsemmError(f"rank_features value of {name!r} must be a number: {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise SparsemmError(
                f"rank_features value of {name!r} must be strictly positive and finite: {value!r}"
            )


def write_manifest(path: str | Path, info: Mapping[str, Any], stats: Sequence[ExportStats]) -> None:
    """``export.json``: settings plus what each file holds."""
    write_json(path, {**dict(info), "files": [asdict(s) for s in stats]})
