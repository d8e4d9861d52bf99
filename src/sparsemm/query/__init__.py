"""Turning typed text into ranked, explained results.

* :mod:`sparsemm.query.parse` - "A but not B" text to a :class:`~sparsemm.query.parse.Query`.
* :mod:`sparsemm.query.strategies` - exclusion strategies behind one interface and registry;
  each ranks every item, and the served ones (``match``, ``hybrid``) rank a store's items
  from inverted-index candidates, rescored exactly (:mod:`~sparsemm.query.strategies.ranking`).
* :mod:`sparsemm.query.searcher` - :class:`~sparsemm.query.searcher.Searcher`, the Python API.
* :mod:`sparsemm.query.naming` and :mod:`sparsemm.query.code_models` - names for concept
  dimensions, and one interface over the models an index can serve.
"""
