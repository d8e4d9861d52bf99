"""Training of VDR (:mod:`.vdr`) and LexLIP (:mod:`.lexlip`)."""
