"""sparsemm: interpretable sparse multimodal retrieval.

Frozen dense image/text embeddings -> sparse concept codes (SR, VDR, LexLIP, SpLiCE) ->
inverted index -> "A but not B" queries with explanations.
"""

from __future__ import annotations

from sparsemm.errors import SparsemmError

__version__ = "0.1.0"
__all__ = ["SparsemmError", "__version__"]
