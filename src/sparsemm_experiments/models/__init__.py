"""VDR and LexLIP: sparse codes over a word-piece vocabulary (:mod:`.vdr`, :mod:`.lexlip`);
the dense baseline's linear aligner (:mod:`.lit`)."""
