"""Baselines of the research runs: BM25 over item captions (:mod:`.bm25`)."""
