"""Training of VDR (:mod:`.vdr`), LexLIP (:mod:`.lexlip`) and the linear aligner (:mod:`.lit`);
the runs' cache of a model's concept detectors (:mod:`.detectors`)."""
