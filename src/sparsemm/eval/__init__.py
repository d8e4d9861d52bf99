"""Measuring: ranking metrics and tables.

* :mod:`sparsemm.eval.metrics` - metrics at a cut-off (one definition per metric).
* :mod:`sparsemm.eval.tables` - Markdown tables of results.

The benchmark runners (exclusion, sentence negation, cross-modal retrieval; ``sparsemm bench``)
and the research run drivers that reproduce the papers live in the separate package
``sparsemm_experiments``. The library never imports it.
"""
