"""The VDR adapter of the index and the searcher (:class:`VDRCodeModel`), registered with
``sparsemm`` through the ``sparsemm.models`` entry point (``vdr``), so that
``sparsemm index --model DIR`` and ``Searcher`` serve a VDR model folder.

VDR codes live in the BERT vocabulary space. Items are coded from their patch features: the
caption embeddings of a caption-proxy item, or the EfficientNet-Lite0 7x7 feature map of an
item with pixels (computed once and cached in ``COLLECTION/spatial``); queries with VDR's own
text tower. A dimension *is* a word piece, so it is labelled by its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.models.detectors import ConceptDetectors
from sparsemm.query.strategies import QueryCoder


class VDRCodeModel:
    kind = "vdr"
    # Hundreds of active tokens per code overlap any term's tokens, so a hard filter on
    # B's dims empties the ranking; code arithmetic is VDR's best strategy (docs/vdr.md).
    default_strategy = "code_arith"
    unit_codes = True
    served_by_index = True

    def __init__(self, path: str | Path, top_k: int | None = None) -> None:
        from sparsemm_experiments.models.vdr import VDRModel

        self.model = VDRModel.from_pretrained(path)
        self.top_k = int(top_k or self.model.config.image_top_k)
        self.text_top_k = int(top_k or self.model.config.text_top_k)
        self.training_info = self.model.training_info
        # 30k-dim word-piece codes: no detectors
        self.detectors: ConceptDetectors | None = None

    def patches(
        self, collection: Collection, progress: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The items' patch features: caption embeddings (caption-proxy) or EfficientNet
        spatial features (items with pixels)."""
        from sparsemm_experiments.data.patches import collage_patches, proxy_patches

        if collection.manifest.get("image_kind") == "caption_view":
            return proxy_patches(collection)
        if collection.manifest.get("image_kind") != "pixels":
            raise SparsemmError(
                f"VDR codes items from patch features; {collection.root} holds neither caption "
                "views nor images (precomputed embeddings have no patches)"
            )
        return collage_patches(collection, collection.root / "spatial", progress=progress), None

    def encode_items(self, collection: Collection, progress: bool = False) -> sp.csr_matrix:
        patches, mask = self.patches(collection, progress)
        return self.model.encode_image(patches, mask, top_k=self.top_k, progress=progress)

    def encode_query_images(self, images: Sequence[Any], image_encoder: Any) -> sp.csr_matrix:
        """Codes of query images from their EfficientNet spatial features, as the items of a
        collection of images are coded (a caption-proxy collection's items are coded from
        captions, which a query image does not have)."""
        if not hasattr(image_encoder, "encode_spatial"):
            raise SparsemmError(
                "this VDR index codes items from caption views; a query image has no captions "
                "(search like an item of the collection instead: its id)"
            )
        patches = image_encoder.encode_spatial(list(images)).astype(np.float16)
        return self.model.encode_image(patches, None, top_k=self.top_k)

    def query_coder(self, text_encoder: Any = None) -> QueryCoder:
        def code(emb: np.ndarray, texts: Any) -> sp.csr_matrix:
            return self.model.encode_text(list(texts), top_k=self.text_top_k)

        return code

    def dim_names(self) -> list[str] | None:
        return list(self.model.tokens)

    def term_scorer(self, text_encoder: Any = None) -> Any:
        return None
