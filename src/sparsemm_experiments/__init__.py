"""The research code beside the library: the papers' models, benchmarks and the demo.

* :mod:`sparsemm_experiments.models`, :mod:`sparsemm_experiments.train` - VDR and LexLIP,
  their patch features (:mod:`sparsemm_experiments.data.patches`) and the VDR index adapter
  (:mod:`sparsemm_experiments.code_models`); ``sparsemm train vdr|lexlip``.
* :mod:`sparsemm_experiments.baselines.bm25` - BM25 over item captions.
* :mod:`sparsemm_experiments.eval` - the exclusion, negation and retrieval benchmark
  runners (``sparsemm bench exclusion|negation``).
* :mod:`sparsemm_experiments.viz` - word clouds, result grids, the demo's HTML report.
* :mod:`sparsemm_experiments.export` - LexLIP codes for Anserini / Elasticsearch
  (``sparsemm export``).
* :mod:`sparsemm_experiments.data.fashion` - the Fashion-MNIST collages
  (``sparsemm collages``).
* :mod:`sparsemm_experiments.collage_run` and :mod:`sparsemm_experiments.demo_report` -
  ``sparsemm demo`` (the main job): Fashion-MNIST collages, SPINE, SR, the exclusion
  benchmark and the HTML report.
* :mod:`sparsemm_experiments.sr_coco` - SR on the COCO caption-proxy (``sparsemm demo coco``).
* :mod:`sparsemm_experiments.paper_bench` - the SR paper's Tables 1-3 (``sparsemm bench paper``).
* :mod:`sparsemm_experiments.vdr_runs`, :mod:`sparsemm_experiments.lexlip_runs`,
  :mod:`sparsemm_experiments.splice_runs` - VDR, LexLIP and SpLiCE runs (``sparsemm bench
  vdr|lexlip``).

Built on the public library (``sparsemm``), which never imports this package: its verbs,
benchmarks, train models and model adapters reach ``sparsemm`` through the entry points
pyproject.toml declares (:mod:`sparsemm.cli.plugins`,
:func:`sparsemm.query.code_models.model_types`).
"""
