"""Exclusion strategies: rank a fixed item set for "A but not B", one interface for all.

Every strategy is built from an :class:`ExclusionContext` (the evaluation items' dense
embeddings and/or sparse codes, a text encoder, a query coder that turns query texts into
sparse codes, optional SPINE word vectors and an optional captioned reference set) and
answers ``rank(a, b, k)`` with the rows of the k best items, best first. A concept term
``t`` is turned into text with the benchmark template ``"a photo of a {t}"``
(:data:`TERM_TEMPLATE`; docs/negation.md).

The library's strategies:

* ``filter`` - cos(code(A), x) with a hard filter: items whose value on any of B's
  dimensions exceeds ``threshold`` are dropped. B's dimensions are the active dimensions of
  B's query code (``dims="query"``), the paper's D_B (``"items"``), the B-specific dims
  (``"specific"``: dims whose mean value over B's top-K items is ``ratio`` times larger than
  over A's top-K items) or the dims of B's own SPINE sentence bias (``"bias"``).
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

* ``match`` - the default: the match probability from the model's term scorer
  (:mod:`~sparsemm.query.strategies.match`); ``hybrid`` - detectors and code similarity for a
  whole query; ``dense_detector`` - the ``detector`` strategy on the dense embeddings.

The baselines the research runs compare with are strategies of the research package,
registered through the ``sparsemm.strategies`` entry points: the SR paper's dense ones
(``dense_a``, ``slq``, ``avg_emb``, ``avg_emb_0.5``) and sparse ones (``code_a``, ``paper``,
``code_arith``, ``penalty``) in ``sparsemm_experiments.baselines.strategies``, and CBE
(``cbe``, content-based exclusion, Yoshikawa & Tajima, ICMR 2024) in
``sparsemm_experiments.baselines.cbe``.

Strategies are registered by name with their default parameters and a tuning grid
(:data:`STRATEGIES`), each beside its class; :func:`get_strategy` builds one. Parameters
are chosen on a tuning split and frozen for the test split (``sparsemm bench exclusion``).

One module per part: :mod:`~sparsemm.query.strategies.context` (the shared input and its
caches), :mod:`~sparsemm.query.strategies.base` (the interface and ranking helpers),
:mod:`~sparsemm.query.strategies.registry`, and the families
:mod:`~sparsemm.query.strategies.sparse`, :mod:`~sparsemm.query.strategies.hybrid` and
:mod:`~sparsemm.query.strategies.match`.
"""

from sparsemm.lru import LRUCache
from sparsemm.query.strategies.base import Strategy, active_dims, top_rows, vector_active_dims
from sparsemm.query.strategies.context import (
    CACHE_SIZE,
    MIN_CACHE_SIZE,
    ExclusionContext,
    QueryCoder,
    ReferenceSet,
    TextEncoder,
    sr_query_coder,
)
from sparsemm.query.strategies.hybrid import Detector, Hybrid
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
from sparsemm.query.strategies.sparse import HardFilter, TermDims
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
# then the sparse ones, the served default near the end. The baselines are the research
# package's (sparsemm_experiments.baselines), listed here when it is installed.
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
    "cbe",
)
reorder_strategies(LISTING_ORDER)

__all__ = [
    "CACHE_SIZE",
    "LISTING_ORDER",
    "MIN_CACHE_SIZE",
    "STRATEGIES",
    "TEMPLATE_MAX_WORDS",
    "TERM_TEMPLATE",
    "CaptionIndex",
    "Detector",
    "ExclusionContext",
    "HardFilter",
    "Hybrid",
    "LRUCache",
    "Match",
    "QueryCoder",
    "ReferenceSet",
    "Strategy",
    "StrategySpec",
    "TermDims",
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
