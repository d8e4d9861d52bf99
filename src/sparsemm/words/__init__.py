"""Word vectors and the caption bias SR learns from.

* :mod:`sparsemm.words.vectors` - dense word vectors: a table and file loaders.
* :mod:`sparsemm.words.spine` - SPINE sparse interpretable word vectors.
* :mod:`sparsemm.words.bias` - the SR sentence bias (captions tokenised by :mod:`sparsemm.text`).
* :mod:`sparsemm.words.evaluate` - word similarity, sparsity and word-intrusion checks.
"""
