"""sparsemm: interpretable sparse multimodal retrieval.

Frozen dense image/text embeddings -> sparse concept codes (SR, VDR, LexLIP, SpLiCE) ->
inverted index -> "A but not B" queries with explanations.

The public API is importable from here::

    from sparsemm import Searcher

    searcher = Searcher("runs/collages-demo/collection")
    for hit in searcher.search("a sneaker but not a bag", k=5):
        print(hit.rank, hit.id, f"{hit.score:.3f}", hit.caption)

Names are resolved on first use (PEP 562), so ``import sparsemm`` stays cheap: torch,
scipy and the encoders load only when a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sparsemm.errors import SparsemmError

__version__ = "0.9.1"

# public name -> the module that defines it
_LAZY = {
    # searching
    "Searcher": "sparsemm.query.searcher",
    "Hit": "sparsemm.query.hits",
    "Answer": "sparsemm.query.hits",
    "build_request": "sparsemm.query.request",
    "parse_query": "sparsemm.query.parse",
    "Query": "sparsemm.query.parse",
    "available_strategies": "sparsemm.query.strategies",
    # building: source -> collection -> (SPINE, SR) -> index
    "encode_source": "sparsemm.data.encode",
    "open_collection": "sparsemm.data.collection",
    "write_collection": "sparsemm.data.collection",
    "Collection": "sparsemm.data.collection",
    "train_sr": "sparsemm.train.sr",
    "train_sr_on_collection": "sparsemm.train.sr",
    "train_caption_spine": "sparsemm.train.spine",
    "sr_pairs_from_collection": "sparsemm.train.sr",
    "build_index": "sparsemm.query.indexing",
    "InvertedIndex": "sparsemm.index.inverted",
}

__all__ = [
    "Answer",
    "Collection",
    "Hit",
    "InvertedIndex",
    "Query",
    "Searcher",
    "SparsemmError",
    "__version__",
    "available_strategies",
    "build_index",
    "build_request",
    "encode_source",
    "open_collection",
    "parse_query",
    "sr_pairs_from_collection",
    "train_caption_spine",
    "train_sr",
    "train_sr_on_collection",
    "write_collection",
]

if TYPE_CHECKING:
    from sparsemm.data.collection import Collection, open_collection, write_collection
    from sparsemm.data.encode import encode_source
    from sparsemm.index.inverted import InvertedIndex
    from sparsemm.query.hits import Answer, Hit
    from sparsemm.query.indexing import build_index
    from sparsemm.query.parse import Query, parse_query
    from sparsemm.query.request import build_request
    from sparsemm.query.searcher import Searcher
    from sparsemm.query.strategies import available_strategies
    from sparsemm.train.spine import train_caption_spine
    from sparsemm.train.sr import sr_pairs_from_collection, train_sr, train_sr_on_collection


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparsemm' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
