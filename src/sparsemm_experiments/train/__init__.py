"""Training of VDR (:mod:`.vdr`), LexLIP (:mod:`.lexlip`) and the linear aligner (:mod:`.lit`)."""
