"""Word vectors and the caption bias SR learns from.

* :mod:`sparsemm.words.vectors` - dense word vectors: a table, its folder format and the
  packaged GloVe.
* :mod:`sparsemm.words.spine` - SPINE's sparse interpretable word vectors (the model is
  :mod:`sparsemm.models.spine`, its training :mod:`sparsemm.train.spine`).
* :mod:`sparsemm.words.bias` - the SR sentence bias (captions tokenised by :mod:`sparsemm.text`).
* :mod:`sparsemm.words.evaluate` - a dimension's top words.
"""
