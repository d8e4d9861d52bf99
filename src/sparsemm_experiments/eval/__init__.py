"""The benchmark runners every model is scored with.

* :mod:`.retrieval` - cross-modal retrieval evaluation (recall@k, AP@k over targets).
* :mod:`.exclusion`, :mod:`.bench`, :mod:`.negation` - the exclusion and sentence-negation
  benchmarks over every strategy (``sparsemm bench exclusion|negation``).
"""
