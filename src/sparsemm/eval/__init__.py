"""Measuring: ranking metrics, benchmark runners, and the research run drivers.

* :mod:`sparsemm.eval.metrics`, :mod:`sparsemm.eval.retrieval` - metrics at a cut-off and
  cross-modal retrieval evaluation.
* :mod:`sparsemm.eval.exclusion`, :mod:`sparsemm.eval.bench`, :mod:`sparsemm.eval.negation`
  - the exclusion and sentence-negation benchmarks over every strategy.
* Run drivers that reproduce the papers (``sr_coco``, ``paper_bench``, ``vdr_runs``,
  ``lexlip_runs``, ``splice_runs``, ``collage_run``) and the demo report (``demo_report``).

The library below this layer never imports it.
"""
