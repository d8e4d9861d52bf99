"""The ``sparsemm`` command: one module per verb, each exposing ``register(subparsers)``.

:mod:`sparsemm.cli.main` builds the parser; verb modules import the library inside their
commands, so ``sparsemm --help`` stays fast. The library's verbs: ``up`` (a folder of photos
to a search page), ``index``, ``search``, ``serve``. ``encode``, ``train`` and ``spine`` (the
step-by-step pipeline), the main job ``demo``, and ``bench``, ``collages`` and ``export``
(which reproduce and extend the papers) come from ``sparsemm_experiments`` through entry
points (:mod:`sparsemm.cli.plugins`).
:mod:`sparsemm.pipeline.running` lets ``search`` forward to a running ``serve``.
"""
