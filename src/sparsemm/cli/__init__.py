"""The ``sparsemm`` command: one module per verb, each exposing ``register(subparsers)``.

:mod:`sparsemm.cli.main` builds the parser; verb modules import the library inside their
commands, so ``sparsemm --help`` stays fast. Everyday verbs: ``up`` (a folder of photos to a
search page), ``encode``, ``train``, ``index``, ``search``, ``serve``; the main job is
``demo``; ``bench``, ``spine``, ``collages`` and ``export`` reproduce and extend the papers
(``demo``, ``bench``, ``collages``, ``export`` and ``train vdr|lexlip`` come from
``sparsemm_experiments`` through entry points, :mod:`sparsemm.cli.plugins`).
:mod:`sparsemm.pipeline.running` lets ``search`` forward to a running ``serve``.
"""
