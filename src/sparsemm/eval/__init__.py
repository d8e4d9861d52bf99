"""Measuring: ranking metrics and the benchmark runners every model is scored with.

* :mod:`sparsemm.eval.metrics`, :mod:`sparsemm.eval.retrieval` - metrics at a cut-off and
  cross-modal retrieval evaluation.
* :mod:`sparsemm.eval.exclusion`, :mod:`sparsemm.eval.bench`, :mod:`sparsemm.eval.negation`
  - the exclusion and sentence-negation benchmarks over every strategy (``sparsemm bench
  exclusion|negation``).

The research run drivers that reproduce the papers live in the separate package
``sparsemm_experiments``. The library layers below this one never import it.
"""
