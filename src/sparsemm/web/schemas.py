"""The JSON API's request and response models (pydantic), with the bounds they enforce."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sparsemm.query.parse import MAX_QUERY_CHARS
from sparsemm.query.request import MAX_K, MAX_OFFSET, MAX_TERMS

log = logging.getLogger(__name__)

__all__ = ["MAX_K", "MAX_OFFSET", "MAX_TERMS"]  # the request limits, for the page and tests


# ---------------------------------------------------------------------------- API models


class ErrorOut(BaseModel):
    """Every error response: one line saying what went wrong and what to do."""

    error: str


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorOut,
        "description": "Invalid input: a malformed query, a parameter out of range, an "
        "unknown strategy, a term the model knows nothing about, or an unknown host name",
    },
    404: {"model": ErrorOut, "description": "Unknown item, dimension or path"},
    413: {"model": ErrorOut, "description": "Request body larger than 64 KiB"},
    503: {
        "model": ErrorOut,
        "description": "Too many searches waiting, or the index changed on disk and cannot "
        "be reopened yet; retry after the Retry-After seconds",
    },
    500: {"model": ErrorOut, "description": "Unexpected server error (details in its log)"},
}


class SearchRequest(BaseModel):
    """A search: the typed query ``q`` plus extra include / exclude terms.

    ``q`` uses the query grammar of :mod:`sparsemm.query.parse` ("dog but not cat"); each
    ``include`` / ``exclude`` value is parsed the same way and may hold several
    comma-separated terms ("cat, ball"); a single string stands for a one-value list.
    """

    model_config = ConfigDict(extra="forbid")

    q: str = Field("", max_length=MAX_QUERY_CHARS, description="typed query text")
    include: list[str] = Field(default_factory=list, description="extra terms to find")
    exclude: list[str] = Field(default_factory=list, description="terms to leave out")
    k: int = Field(10, ge=1, le=MAX_K, description="results per page")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="results to skip (paging)")
    strategy: str | None = Field(
        None, max_length=64, description="exclusion strategy (default: the model's)"
    )
    like: str | None = Field(
        None,
        max_length=512,
        description="more like this item (its id): its code is the include side; q, include "
        "and exclude then only name what to leave out",
    )
    min_score: float | Annotated[str, Field(max_length=16)] | None = Field(
        None,
        description="keep only hits whose match probability is at least this: 0.6 or "
        "60% (the default scorer's scores are probabilities); also the threshold of the "
        "match count",
    )
    count: bool = Field(
        False,
        description="also count the items in the whole collection that match (the default "
        "scorer's probabilities, at min_score or 50%): `matches`, `threshold`; an exact "
        "count costs more than the search on a large collection",
    )

    @field_validator("include", "exclude", mode="before")
    @classmethod
    def _one_value(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ConceptOut(BaseModel):
    dim: int
    weight: float  # matched: contribution q_j x_j to the score; item concepts: x_j
    words: list[str]


class ExcludedOut(BaseModel):
    term: str
    dims: list[int]  # the excluded term's concept dimensions
    item_mass: float  # the item's summed value on those dimensions
    item_peak: float  # its largest value on one of them (the filter strategy's test)
    words: list[str]


class ItemOut(BaseModel):
    id: str
    caption: str
    labels: list[str]
    image: str | None  # URL of the image, None when the item has no servable image
    thumb: str | None = None  # URL of its server-made thumbnail (same None rule)
    also: list[str] = []  # the item's other paths: copies with the same bytes, or links


class EvidenceOut(BaseModel):
    """How strongly the item carries one query term ("dog 0.93", "not cat 0.02")."""

    term: str
    side: str  # include | exclude
    kind: str  # what gave the value: detector, classifier, face detector, zero-shot (a
    # probability), code similarity (the match scorer: a probability; hybrid: a cosine)
    value: float
    dims: list[int]  # the concept dimensions behind the value
    words: list[str]
    read_as: list[str] = []  # the concepts the term was read as ("woman" -> person)


class HitOut(ItemOut):
    rank: int
    score: float
    matched: list[ConceptOut]
    excluded: list[ExcludedOut]
    evidence: list[EvidenceOut] = []
    # how the served scorer judged each query term ("dog": "detector"), as `search --explain`
    scored_by: dict[str, str] = {}
    # excluded terms the item most likely shows (its labels name them, or the scorer gives
    # them 50% or more): it breaks the query
    violations: list[str] = []


class ItemDetailOut(ItemOut):
    captions: list[str]


class DimItemOut(ItemOut):
    value: float  # the item's activation on the dimension


class QueryOut(BaseModel):
    include: list[str]
    exclude: list[str]
    text: str  # canonical form, e.g. 'dog -cat'


class SearchOut(BaseModel):
    query: QueryOut
    strategy: str
    k: int
    offset: int
    next_offset: int | None  # offset of the next page; None when this page was the last
    total: int  # items in the collection (every one is ranked)
    like: str | None = None  # "more like this" target ("item ID" / "image NAME"), or None
    # query words in no vocabulary of the collection (Searcher.unknown_words), in query order
    unknown_words: list[str] = []
    # how the terms were read, when the model had to approximate ("'woman' is searched as
    # 'person': ...")
    notes: list[str] = []
    probabilistic: bool = False  # the scores are match probabilities (the default scorer)
    threshold: float | None = None  # the probability ``matches`` counts from
    matches: int | None = None  # items with a match probability of at least ``threshold``
    min_score: float | None = None  # hits below this match probability were dropped
    certified: bool = True  # the index proved these are the exact top hits
    hits: list[HitOut]


class ExplainOut(BaseModel):
    item: ItemDetailOut
    query: QueryOut
    matched: list[ConceptOut]
    excluded: list[ExcludedOut]
    concepts: list[ConceptOut]  # the item's strongest dimensions, query or not


class DimOut(BaseModel):
    dim: int
    words: list[str]  # the label shown for the dimension
    data_words: list[str]  # caption words over-represented among its items
    spine_words: list[str]  # SPINE top words (when the index was built with --spine)
    items: list[DimItemOut]


class HealthOut(BaseModel):
    status: str  # "ok", or "failing" while searches fail unexpectedly (error says why)
    error: str | None = None
    version: str
    collection: str
    index_generation: int  # the index manifest's commit counter (next_segment)
    index_digest: str  # SHA-256 (16 hex) of its manifest: changes with every commit
    items: int
    images: int
    dims: int
    strategies: list[str]
    default_strategy: str
    max_k: int
    max_query_chars: int
    filter_threshold: float  # the filter strategy drops items whose peak exceeds this
    # an item's own concept is worth showing from this value (its codes are class
    # probabilities: a 3% "volcano" on a sunset is noise); 0 when codes are not probabilities
    concept_floor: float = 0.0
    example: str = ""  # a query the collection answers (the page's placeholder)
