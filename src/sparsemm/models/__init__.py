"""Sparse models over frozen dense embeddings, saved as ``config.json`` + safetensors.

* :mod:`sparsemm.models.sr` - SR (sparse disentangled codes with a SPINE caption bias).
* :mod:`sparsemm.models.concepts` - caption-free ImageNet-class concept codes; the
  ImageNet-1k model is built in :mod:`sparsemm.models.imagenet_concepts`, and what it reads
  from a collection's photos is kept by :mod:`sparsemm.models.concept_evidence`.
* :mod:`sparsemm.models.detectors` - per-word concept detectors saved with a model.
* :mod:`sparsemm.models.spine` - SPINE, the autoencoder that makes sparse word vectors.
* :mod:`sparsemm.models.sr_lite`, :mod:`sparsemm.models.lit_lite` - SR's encoder and the
  dense baseline's linear aligner in numpy, what a search runs (no torch import).
* :mod:`sparsemm.models.base` - ``save_pretrained`` / ``from_pretrained`` for all of them
  (``nn.Module`` models and numpy ``ArrayModule`` ones).

VDR, LexLIP and the aligner's torch module, the research models, live in
``sparsemm_experiments.models``.
"""
