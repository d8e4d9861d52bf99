"""The strategies' shared input: the items, the text encoder, query codes and their caches
(:class:`ExclusionContext`), the reference set of captioned items and the query templates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.encoders.base import TextEncoder, as_text_encoder
from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.lru import LRUCache
from sparsemm.models.detectors import ConceptDetectors
from sparsemm.text import TERM_TEMPLATE, CaptionIndex, term_text

logger = logging.getLogger(__name__)


# texts' dense embeddings (n, k) + the texts -> sparse codes (n, d)
QueryCoder = Callable[[np.ndarray, Sequence[str]], sp.csr_matrix]


def sr_query_coder(
    model: Any,
    word_vectors: Any = None,
    mask: str = "topk",
    top_k: int | None = None,
    text_encoder: TextEncoder | None = None,
) -> QueryCoder:
    """A :data:`QueryCoder` for an SR model (``sparsemm.models.sr.SRModel``).

    ``mask="topk_or_bias"`` ORs the query text's own SPINE sentence bias into its mask
    (needs ``word_vectors``); ``"topk"`` uses the TopK mask alone. With ``text_encoder`` the
    texts are embedded by it rather than taken from the context's embeddings: SR reads the
    raw text backbone while the context's dense space may be an aligned projection.
    """
    if mask == "topk_or_bias" and word_vectors is None:
        raise SparsemmError("the topk_or_bias query mask needs SPINE word vectors (--spine)")

    def code(emb: np.ndarray, texts: Sequence[str]) -> sp.csr_matrix:
        if text_encoder is not None:
            emb = text_encoder.encode_text(list(texts))
        bias = None
        if mask == "topk_or_bias":
            from sparsemm.words.bias import sentence_bias

            bias = sentence_bias(list(texts), word_vectors)
        return sp.csr_matrix(model.encode(emb, "text", bias=bias, top_k=top_k, mask=mask))

    return code


# ------------------------------------------------------------------------------ context


@dataclass
class ReferenceSet:
    """Captioned reference items (e.g. the training split) for the detector strategies.

    ``captions[i]`` lists item i's captions; ``dense`` (m, k) and/or ``codes`` (m, d) are its
    representations in the same spaces as the evaluation items'. ``labels[i]`` (optional)
    lists item i's object labels (tags): an item labelled with a term counts as mentioning
    it, so a collection's own tags supervise the detectors of those terms.
    """

    captions: list[list[str]]
    dense: np.ndarray | None = None
    codes: sp.csr_matrix | None = None
    labels: list[list[str]] | None = None
    _index: CaptionIndex | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        m = len(self.captions)
        for what, arr in (("dense", self.dense), ("codes", self.codes)):
            if arr is not None and arr.shape[0] != m:
                raise SparsemmError(
                    f"reference {what} has {arr.shape[0]} rows for {m} captioned items"
                )
        if self.labels is not None and len(self.labels) != m:
            raise SparsemmError(f"reference labels have {len(self.labels)} rows for {m} items")

    @property
    def index(self) -> CaptionIndex:
        """The mention lookup of the captions and labels (built on first use)."""
        if self._index is None:
            self._index = CaptionIndex(self.captions, self.labels)
        return self._index

    def labelled(self, term: str) -> np.ndarray:
        """(m,) bool: reference item i carries a label equal to ``term`` (singular forms)."""
        return self.index.labelled(term)

    def mentions(self, term: str, min_positives: int = 5, head_ratio: float = 0.1) -> np.ndarray:
        """(m,) bool targets: some caption of reference item i mentions ``term``, or the
        item is labelled with it (:class:`~sparsemm.text.CaptionIndex`)."""
        return self.index.mentions(term, min_positives, head_ratio)


def normalize_csr(x: sp.csr_matrix) -> sp.csr_matrix:
    """:func:`normalize_rows` of a CSR matrix, with its indices sorted."""
    out = normalize_rows(x)
    out.sort_indices()
    return out


_MISSING = object()  # a cache-miss marker that no cached value can equal


# Default entry limit of each ExclusionContext cache: above the working set of the full
# benchmark grid on the 80 COCO labels (so tuning never recomputes), a few hundred MB at most
# for 5k items. The web server also drops them by size (sparsemm.web.service.MAX_CACHE_BYTES).
CACHE_SIZE = 4096
# Query terms embedded per encoder call when a search checks them: one at a time, the 32
# terms of a full query were 66 encoder calls (seconds); batches of 16 stay on the light
# MiniLM path. Same vectors, cached for the search that follows.
CHECK_BATCH = 16
MIN_CACHE_SIZE = 16  # a strategy holds a few entries at once (e.g. a detector's store + logits)


# What a strategy's input is, in a user's words (ExclusionContext.require)
NEEDS = {
    "dense": "the photos' dense embeddings",
    "codes": "sparse codes of the items",
    "text_encoder": "a text encoder",
    "query_coder": "a model that codes query text",
    "reference": "captioned items to fit word detectors on (a collection with captions)",
    "word_vectors": "SPINE word vectors",
}


class ExclusionContext:
    """What strategies need, with per-text caches (see the module docstring).

    ``items_dense`` (n, k) and ``items_codes`` (n, d) describe the n evaluation items (rows
    are what ``rank`` returns). ``text_encoder`` embeds query texts; ``query_coder`` maps
    those embeddings (and texts) to sparse codes. ``reference`` is a captioned reference set
    for the detector strategies, ``word_vectors`` SPINE vectors (query bias masks),
    ``detectors`` the model's own concept detectors (:mod:`sparsemm.models.detectors`),
    which the served scorer uses instead of fitting any at query time, and ``concepts`` the
    model's term scorer (:mod:`sparsemm.query.scorers`), which the match scorer reads.
    The per-text caches (``_emb``, ``_code``) and the strategies' ``cache`` are LRU caches
    of at most ``cache_size`` entries each, so a stream of distinct queries cannot grow them
    without bound.
    """

    def __init__(
        self,
        items_dense: np.ndarray | None = None,
        items_codes: sp.csr_matrix | None = None,
        text_encoder: TextEncoder | None = None,
        query_coder: QueryCoder | None = None,
        reference: ReferenceSet | None = None,
        word_vectors: Any = None,
        template: str = TERM_TEMPLATE,
        cache_size: int = CACHE_SIZE,
        detectors: ConceptDetectors | None = None,
        concepts: Any = None,
    ) -> None:
        if cache_size < MIN_CACHE_SIZE:
            raise SparsemmError(f"cache_size must be at least {MIN_CACHE_SIZE}, got {cache_size}")
        if items_dense is None and items_codes is None:
            raise SparsemmError("an exclusion context needs item embeddings and/or item codes")
        n = {a.shape[0] for a in (items_dense, items_codes) if a is not None}
        if len(n) != 1:
            raise SparsemmError("item embeddings and item codes must have the same row count")
        self.n_items = n.pop()
        if "{}" not in template:
            raise SparsemmError(f"the term template must contain '{{}}', got {template!r}")
        self.items_dense = None if items_dense is None else normalize_rows(items_dense)
        self.items_codes = None if items_codes is None else sp.csr_matrix(items_codes)
        if self.items_codes is not None and (self.items_codes.data < 0).any():
            logger.warning("item codes have negative values; magnitudes use absolute values")
        self.text_encoder = text_encoder
        self.query_coder = query_coder
        self.reference = reference
        self.word_vectors = word_vectors
        if detectors is not None and self.items_codes is not None:
            if detectors.dim != self.items_codes.shape[1]:
                raise SparsemmError(
                    f"the model's detectors read {detectors.dim}-dim codes but the items' codes "
                    f"have {self.items_codes.shape[1]}"
                )
        self.detectors = detectors
        # the model's term scorer (sparsemm.query.scorers), for the match scorer: the photo
        # concept model's or CLIP's; None builds one from ``detectors`` (SR)
        self.concepts = concepts
        self.template = template
        self.cache_size = cache_size
        self._emb: LRUCache = LRUCache(cache_size)  # text -> (k,) unit embedding
        self._code: LRUCache = LRUCache(cache_size)  # text -> (d,) dense query code
        self._codes_unit: sp.csr_matrix | None = None
        self._codes_abs: sp.csr_matrix | None = None
        self.cache: LRUCache = LRUCache(cache_size)  # strategy-owned (keyed by strategy+params)
        # how the model's term scorer reads a term: it depends on the term and the scorer
        # alone, so contexts over other rows with the same scorer share it (sub)
        self.readings: LRUCache = LRUCache(cache_size)

    def sub(self, codes: sp.csr_matrix) -> ExclusionContext:
        """A context over ``codes`` (a few rows) that shares this one's text caches,
        readings, encoders and model detectors, so query texts are encoded once for every
        such context (the served path scores index candidates in them)."""
        sub = ExclusionContext(
            items_codes=codes,
            text_encoder=self.text_encoder,
            query_coder=self.query_coder,
            reference=self.reference,
            word_vectors=self.word_vectors,
            template=self.template,
            cache_size=self.cache_size,
            detectors=self.detectors,
            concepts=self.concepts,
        )
        sub._emb, sub._code = self._emb, self._code
        sub.readings = self.readings  # the same term scorer reads a term the same way
        return sub

    # -- caches ----------------------------------------------------------------------------
    def query_caches(self) -> list[LRUCache]:
        """Every per-query cache (text embeddings, query codes, strategy-owned entries), each
        bounded to ``cache_size`` entries; a server may also clear them by memory."""
        return [self._emb, self._code, self.cache, self.readings]

    def share_text_caches(self, other: ExclusionContext) -> None:
        """Use ``other``'s text-embedding and query-code caches (one encoding per text for
        two contexts over the same encoders)."""
        self._emb, self._code = other._emb, other._code

    def clear_text_caches(self) -> None:
        """Forget every cached text embedding and query code."""
        self._emb.clear()
        self._code.clear()

    def pin_query_code(self, term: str, code: np.ndarray | None) -> None:
        """Set (or, with None, remove) the query code of ``term``: a pseudo-term whose code
        is given, not encoded (a "more like this" picture's code)."""
        key = self.term_text(term)
        if code is None:
            self._code.pop(key, None)
        else:
            self._code[key] = code

    # -- items ---------------------------------------------------------------------------
    def require(self, *what: str) -> None:
        """Raise SparsemmError naming the first missing input among ``what``."""
        have = {
            "dense": self.items_dense is not None,
            "codes": self.items_codes is not None,
            "text_encoder": self.text_encoder is not None,
            "query_coder": self.query_coder is not None,
            "reference": self.reference is not None,
            "word_vectors": self.word_vectors is not None,
        }
        for w in what:
            if not have[w]:
                raise SparsemmError(
                    f"this strategy needs {NEEDS.get(w, w)}, which this collection does not "
                    "have; leave the strategy out for the collection's default"
                )

    @property
    def codes_unit(self) -> sp.csr_matrix:
        """Item codes with L2-normalised rows (cosine scoring)."""
        self.require("codes")
        if self._codes_unit is None:
            assert self.items_codes is not None
            self._codes_unit = normalize_csr(self.items_codes)
        return self._codes_unit

    @property
    def codes_abs(self) -> sp.csr_matrix:
        """|codes_unit| (same sparsity structure): magnitudes for masses and peaks."""
        if self._codes_abs is None:
            self._codes_abs = abs(self.codes_unit)
        return self._codes_abs

    @property
    def dim(self) -> int:
        """The length of the items' sparse codes."""
        assert self.items_codes is not None
        return int(self.items_codes.shape[1])

    def dims_indicator(self, dims: np.ndarray) -> np.ndarray:
        """(d,) float32 vector: 1 on ``dims``, 0 elsewhere."""
        ind = np.zeros(self.codes_unit.shape[1], dtype=np.float32)
        ind[np.asarray(dims, dtype=np.int64)] = 1.0
        return ind

    def mass_on(self, dims: np.ndarray) -> np.ndarray:
        """(n,) float64: each item's summed |value| (unit codes) over ``dims``.

        ``abs(codes_unit[:, dims]).sum(axis=1)`` as one sparse mat-vec with a 0/1 indicator
        (no copy of the sliced columns, ~10x faster). The same float32 terms are added in
        the same (ascending dimension) order, but scipy's row sum is a pairwise numpy
        reduction over the sliced row, so the last bits can differ (|diff| < 1e-6).
        """
        mass = self.codes_abs @ self.dims_indicator(dims)
        return np.asarray(mass, dtype=np.float64).ravel()

    def peak_over(self, dims: np.ndarray, threshold: float) -> np.ndarray:
        """(n,) bool: ``abs(codes_unit[:, dims]).max(axis=1) > threshold``, exactly.

        The max exceeds t >= 0 iff one of its terms does: a mat-vec of the (cached per
        threshold) 0/1 matrix of non-zeros above t with the dims' indicator counts them.
        """
        cu = self.codes_abs
        if threshold < 0:  # every peak (>= 0) exceeds it
            return np.ones(cu.shape[0], dtype=bool)
        key = ("over_threshold", float(threshold))
        over = self.cache.get(key)
        if over is None:
            # shares indices/indptr with codes_abs: only the 0/1 data is new
            data = (cu.data > threshold).astype(np.float32)
            over = sp.csr_matrix((data, cu.indices, cu.indptr), shape=cu.shape, copy=False)
            self.cache[key] = over
        counts = over @ self.dims_indicator(dims)
        return np.asarray(counts).ravel() > 0

    # -- query texts ---------------------------------------------------------------------
    def term_text(self, term: str) -> str:
        """The text embedded for a term: the template around a label-like term ("a photo of
        a dog"); a longer phrase (a sentence's include) is embedded as written."""
        return term_text(term, self.template)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), k) unit-length embeddings of ``texts`` (cached per text)."""
        self.require("text_encoder")
        assert self.text_encoder is not None
        # Collected locally: with more distinct texts than the cache holds, the first
        # would be evicted before they are stacked.
        # .get, not `in` then [...]: another thread may evict an entry in between
        hit = {t: self._emb.get(t, _MISSING) for t in dict.fromkeys(texts)}
        found = {t: e for t, e in hit.items() if e is not _MISSING}
        missing = [t for t in hit if t not in found]
        if missing:
            emb = normalize_rows(as_text_encoder(self.text_encoder).encode_text(missing))
            for t, e in zip(missing, emb, strict=True):
                self._emb[t] = found[t] = e
        return np.stack([found[t] for t in texts]) if texts else np.zeros((0, 0))

    def code(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), d) dense copies of the sparse query codes of ``texts`` (cached)."""
        self.require("query_coder")
        assert self.query_coder is not None
        hit = {t: self._code.get(t, _MISSING) for t in dict.fromkeys(texts)}
        found = {t: c for t, c in hit.items() if c is not _MISSING}
        missing = [t for t in hit if t not in found]
        if missing:
            codes = self.query_coder(self.embed(missing), missing)
            dense = np.asarray(sp.csr_matrix(codes).toarray(), dtype=np.float32)
            for t, c in zip(missing, dense, strict=True):
                self._code[t] = found[t] = c
        return np.stack([found[t] for t in texts])

    def prefetch(self, terms: Iterable[str], codes: bool = False, batch: int = 0) -> None:
        """Embed (and code) the texts of many terms in one batch, or in batches of ``batch``
        terms (a search's term checks: :data:`CHECK_BATCH`)."""
        unique = list(dict.fromkeys(terms))
        step = batch or max(len(unique), 1)
        for i in range(0, len(unique), step):
            texts = [self.term_text(t) for t in unique[i : i + step]]
            if self.text_encoder is not None:
                self.embed(texts)
            if codes and self.query_coder is not None:
                self.code(texts)

    def term_embedding(self, term: str) -> np.ndarray:
        return self.embed([self.term_text(term)])[0]

    def term_code(self, term: str) -> np.ndarray:
        return self.code([self.term_text(term)])[0]

    def code_scores(self, query: np.ndarray) -> np.ndarray:
        """(n,) cosine of a dense (d,) query code with every item code."""
        return self.codes_scores(np.asarray(query)[:, None])[:, 0]

    def codes_scores(self, queries: np.ndarray) -> np.ndarray:
        """(n, m) cosine of each of the dense query codes (the columns of a (d, m) array)
        with every item code, in one product (a zero code scores 0)."""
        q = np.asarray(queries, dtype=np.float32)
        nrm = np.linalg.norm(q, axis=0)
        unit = q / np.where(nrm == 0.0, 1.0, nrm).astype(np.float32)
        return np.asarray(self.codes_unit @ unit, dtype=np.float64)
