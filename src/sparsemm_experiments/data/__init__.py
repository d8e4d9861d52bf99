"""Data of the research runs: the offline demo collection of Fashion-MNIST collages
(:mod:`.fashion`) and VDR's patch features (:mod:`.patches`)."""
