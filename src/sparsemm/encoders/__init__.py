"""Frozen dense encoders behind the sparse models, one registry (:mod:`sparsemm.encoders.base`).

* :mod:`sparsemm.encoders.minilm` - the offline default text encoder (all-MiniLM-L6-v2),
  with :mod:`sparsemm.encoders.bert_lite` embedding short queries without loading
  sentence-transformers (its forward pass: :mod:`sparsemm.encoders.bert_forward`).
* :mod:`sparsemm.encoders.efficientnet` - the offline default image encoder
  (EfficientNet-Lite0, network in :mod:`sparsemm.encoders.efficientnet_lite`).
* :mod:`sparsemm.encoders.hf` - CLIP and BLIP through Hugging Face transformers.
* :mod:`sparsemm.encoders.precomputed` - embeddings computed elsewhere, looked up by id.

Nothing is imported here; import the submodules (torch loads only when one needs it).
"""
