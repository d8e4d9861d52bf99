"""The experiments' verbs: ``sparsemm encode``, ``train`` (``sr``, ``detectors``, and
``align|vdr|lexlip``), ``spine`` (``train``, ``inspect``, ``eval``), ``demo``, ``bench``
(``exclusion|negation`` and ``paper|vdr|lexlip``), ``export`` and ``collages``, registered
through the ``sparsemm.verbs``, ``sparsemm.bench``, ``sparsemm.train`` and ``sparsemm.spine``
entry points."""
