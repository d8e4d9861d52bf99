"""The experiments' verbs: ``sparsemm demo`` and ``sparsemm bench paper|vdr|lexlip``,
registered through the ``sparsemm.verbs`` and ``sparsemm.bench`` entry points."""
