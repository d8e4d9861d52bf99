"""Data of the research runs: VDR's patch features (:mod:`.patches`)."""
