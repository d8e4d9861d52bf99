"""Data of the research runs: the offline demo collection of Fashion-MNIST collages
(:mod:`.fashion`), VDR's patch features (:mod:`.patches`) and where the shared development
data lives (:mod:`.paths`)."""
