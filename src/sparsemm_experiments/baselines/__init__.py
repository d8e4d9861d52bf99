"""Baselines of the research runs: BM25 over item captions (:mod:`.bm25`) and what the SpLiCE
runs add to the library's decomposer (:mod:`.splice`)."""
