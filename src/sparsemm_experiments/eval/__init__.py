"""The benchmark runners every model is scored with, and what they measure with.

* :mod:`.metrics` - ranking metrics at a cut-off (one definition per metric).
* :mod:`.tables` - Markdown tables of results.
* :mod:`.retrieval` - cross-modal retrieval evaluation (recall@k, AP@k over targets).
* :mod:`.exclusion`, :mod:`.bench`, :mod:`.negation` - the exclusion and sentence-negation
  benchmarks over every strategy (``sparsemm bench exclusion|negation``).
"""
