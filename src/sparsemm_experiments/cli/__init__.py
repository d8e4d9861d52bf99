"""The experiments' verbs: ``sparsemm demo``, ``bench`` (``exclusion|negation`` and
``paper|vdr|lexlip``), ``export``, ``collages`` and ``train vdr|lexlip``, registered
through the ``sparsemm.verbs``, ``sparsemm.bench`` and ``sparsemm.train`` entry points."""
