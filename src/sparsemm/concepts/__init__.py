"""Concepts shared by every model: the WordNet noun hierarchy and what a query term means.

:mod:`sparsemm.concepts.wordnet` reads the packaged WordNet 3.0 nouns;
:mod:`sparsemm.concepts.vocabulary` grounds a model's units (ImageNet classes, detector
words, vocabulary concepts) in it and resolves query terms to the units that cover them.
"""
