"""Training loops: resumable, deterministic on CPU, checkpoints without pickles.

* :mod:`sparsemm.train.loop` - the epoch loop shared by SR and the aligner;
  :mod:`sparsemm.train.checkpoint` - checkpoints as safetensors + JSON.
* :mod:`sparsemm.train.sr` - one plain function per model (the aligner's, VDR's and
  LexLIP's are in ``sparsemm_experiments.train``).
* :mod:`sparsemm.train.losses` - every loss, returning named components.
* :mod:`sparsemm.train.detectors` - fitting the concept detectors saved with a model.
* :mod:`sparsemm.train.spine` - SPINE, whose word vectors give SR its caption bias.
"""
