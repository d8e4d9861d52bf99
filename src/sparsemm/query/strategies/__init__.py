"""Exclusion strategies: rank a fixed item set for "A but not B", one interface for all.

Every strategy is built from an :class:`ExclusionContext` (the evaluation items' dense
embeddings and/or sparse codes, a text encoder, a query coder that turns query texts into
sparse codes, optional SPINE word vectors and an optional captioned reference set) and
answers ``rank(a, b, k)`` with the rows of the k best items, best first. A concept term
``t`` is turned into text with the benchmark template ``"a photo of a {t}"``
(:data:`TERM_TEMPLATE`; docs/negation.md).

Dense strategies (baselines of the SR paper, "Answering Multimodal Exclusion Queries with
Lightweight Sparse Disentangled Representations", Prachi, Bhatia, Bedathur, ICTIR 2025):

* ``dense_a`` - cos(emb(A), x): the include term alone (reference point).
* ``slq`` - single-line query: cos(emb("a photo of a A without a B"), x).
* ``avg_emb`` / ``avg_emb_0.5`` - embedding arithmetic cos(emb(A) - w emb(B), x), w = 1, 0.5.
* ``dense_detector`` - the ``detector`` strategy below on the dense embeddings (not in the
  paper; a strong dense reference that uses the same caption supervision).

Sparse strategies, generic over any non-negative sparse codes (SR, VDR, SpLiCE, ...):

* ``code_a`` - cos(code(A), x) on the sparse codes: A alone.
* ``paper`` - the SR paper's two-step exclusion retrieval (Sec. 4.3): retrieve the top-K
  items for A by code similarity; the *active* dimensions of an item are the smallest set of
  its dimensions holding a share t of its L1 mass; D_A = union of the active dimensions of
  A's top-K items, D_B likewise for B, D = D_A minus D_B; A's top-K items are re-ranked by
  their mass on D (ties: A's similarity). Re-ranking A's retrieved pool (``pool="topk"``) is
  our reading of "two-step"; ``pool="all"`` ranks every item by its mass on D instead.
* ``code_arith`` - cos(code(A) - w code(B), x): arithmetic on the sparse codes.
* ``filter`` - cos(code(A), x) with a hard filter: items whose value on any of B's
  dimensions exceeds ``threshold`` are dropped. B's dimensions are the active dimensions of
  B's query code (``dims="query"``), the paper's D_B (``"items"``), the B-specific dims
  (``"specific"``: dims whose mean value over B's top-K items is ``ratio`` times larger than
  over A's top-K items) or the dims of B's own SPINE sentence bias (``"bias"``).
* ``penalty`` - the soft version: cos(code(A), x) - lam * sum_{j in B-dims} b_j x_j with b_j
  B's (unit-normalised) per-dimension weight, so items are demoted by how strongly they
  carry B rather than dropped.
* ``detector`` - concept detectors learned from captions' words. For a term t, a
  logistic regression over the reference set's unit-normalised sparse codes predicts "some
  caption of the item mentions t" (captions only, no labels; :class:`CaptionIndex`), so
  its weights say which concept dimensions signal t. Score:

      log P(A|x) + beta log(1 - P(B|x) / c_B) + alpha cos(code(A), x) - gamma cos(code(B), x)

  Captions name only some of the objects present, so mentions are positive-unlabelled
  presence labels: with c_B the chance that a present B is mentioned, P(B present | x) =
  P(mention | x) / c_B (Elkan & Noto, KDD 2008). c_B is estimated per term from the
  reference set (mean fitted P(mention) over mentioning items) times ``mention_rate``. The
  similarity terms keep the ranking anchored on the query code where a detector is weak.

* ``cbe`` - content-based exclusion (Yoshikawa & Tajima, ICMR 2024), a dense baseline of
  the research package (``sparsemm_experiments.baselines.cbe``), registered through the
  ``sparsemm.strategies`` entry points.

Strategies are registered by name with their default parameters and a tuning grid
(:data:`STRATEGIES`), each beside its class; :func:`get_strategy` builds one. Parameters
are chosen on a tuning split and frozen for the test split (``sparsemm bench exclusion``).

One module per part: :mod:`~sparsemm.query.strategies.context` (the shared input and its
caches), :mod:`~sparsemm.query.strategies.base` (the interface and ranking helpers),
:mod:`~sparsemm.query.strategies.registry`, and the families
:mod:`~sparsemm.query.strategies.dense`, :mod:`~sparsemm.query.strategies.sparse`,
:mod:`~sparsemm.query.strategies.detectors` and :mod:`~sparsemm.query.strategies.match`.
"""

from sparsemm.lru import LRUCache
from sparsemm.query.strategies.base import Strategy, active_dims, top_rows, vector_active_dims
from sparsemm.query.strategies.context import (
    CACHE_SIZE,
    MIN_CACHE_SIZE,
    SLQ_TEMPLATE,
    ExclusionContext,
    QueryCoder,
    ReferenceSet,
    TextEncoder,
    sr_query_coder,
)
from sparsemm.query.strategies.dense import AvgEmb, DenseA, SingleLineQuery
from sparsemm.query.strategies.detectors import Detector, Hybrid
from sparsemm.query.strategies.match import Match
from sparsemm.query.strategies.registry import (
    STRATEGIES,
    StrategySpec,
    available_strategies,
    get_spec,
    get_strategy,
    load_entry_points,
    register_strategy,
    reorder_strategies,
)
from sparsemm.query.strategies.sparse import (
    CodeA,
    CodeArith,
    HardFilter,
    PaperTwoStep,
    SoftPenalty,
)
from sparsemm.text import (
    TEMPLATE_MAX_WORDS,
    TERM_TEMPLATE,
    CaptionIndex,
    caption_mentions,
    term_tokens,
)
from sparsemm.train.detectors import fit_detectors

# Strategies of other packages (sparsemm.strategies entry points), then the listing order
# (--list-strategies, the page's menu, a benchmark of every strategy): the dense baselines,
# then the sparse ones, the served default near the end, then the other packages'.
load_entry_points()
LISTING_ORDER = (
    "dense_a",
    "slq",
    "avg_emb",
    "avg_emb_0.5",
    "dense_detector",
    "code_a",
    "paper",
    "code_arith",
    "filter",
    "penalty",
    "match",
    "hybrid",
    "detector",
    "cbe",  # sparsemm_experiments
)
reorder_strategies(LISTING_ORDER)

__all__ = [
    "CACHE_SIZE",
    "LISTING_ORDER",
    "MIN_CACHE_SIZE",
    "SLQ_TEMPLATE",
    "STRATEGIES",
    "TEMPLATE_MAX_WORDS",
    "TERM_TEMPLATE",
    "AvgEmb",
    "CaptionIndex",
    "CodeA",
    "CodeArith",
    "DenseA",
    "Detector",
    "ExclusionContext",
    "HardFilter",
    "Hybrid",
    "LRUCache",
    "Match",
    "PaperTwoStep",
    "QueryCoder",
    "ReferenceSet",
    "SingleLineQuery",
    "SoftPenalty",
    "Strategy",
    "StrategySpec",
    "TextEncoder",
    "active_dims",
    "available_strategies",
    "caption_mentions",
    "fit_detectors",
    "get_spec",
    "get_strategy",
    "load_entry_points",
    "register_strategy",
    "reorder_strategies",
    "sr_query_coder",
    "term_tokens",
    "top_rows",
    "vector_active_dims",
]
