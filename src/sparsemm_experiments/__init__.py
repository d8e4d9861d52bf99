"""The research run drivers beside the library: the papers' tables and the demo, end to end.

* :mod:`sparsemm_experiments.collage_run` and :mod:`sparsemm_experiments.demo_report` -
  ``sparsemm demo`` (the main job): Fashion-MNIST collages, SPINE, SR, the exclusion
  benchmark and the HTML report.
* :mod:`sparsemm_experiments.sr_coco` - SR on the COCO caption-proxy (``sparsemm demo coco``).
* :mod:`sparsemm_experiments.paper_bench` - the SR paper's Tables 1-3 (``sparsemm bench paper``).
* :mod:`sparsemm_experiments.vdr_runs`, :mod:`sparsemm_experiments.lexlip_runs`,
  :mod:`sparsemm_experiments.splice_runs` - VDR, LexLIP and SpLiCE runs (``sparsemm bench
  vdr|lexlip``).

Built on the public library (``sparsemm``), which never imports this package: its verbs
reach the ``sparsemm`` command through entry points (:mod:`sparsemm.cli.plugins`).
"""
