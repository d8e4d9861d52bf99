"""The research runs' cache of a model's concept detectors (a stage of ``sparsemm demo`` and
the benchmark runs): reuse the saved ones while they fit the model, else fit them again."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError
from sparsemm.models.detectors import ConceptDetectors, DetectorConfig, has_detectors
from sparsemm.train.detectors import fit_model_detectors

logger = logging.getLogger(__name__)


def ensure_model_detectors(
    model: Any,
    model_dir: str | Path,
    collection: Any,
    split: str = "train",
    config: DetectorConfig | None = None,
    progress: bool = False,
) -> ConceptDetectors:
    """The model's detectors: those in ``model_dir`` when they were fitted on its current
    weights, else fitted now (:func:`fit_model_detectors`); a pipeline stage's cache."""
    if has_detectors(model_dir):
        try:
            det = ConceptDetectors.for_model(model_dir)
            if det.wnids is not None or not (config or DetectorConfig()).hierarchy:
                return det
            logger.info("refitting the concept detectors: fitted before the concept hierarchy")
        except SparsemmError as exc:
            logger.info("refitting the concept detectors: %s", exc)
    det = fit_model_detectors(model, model_dir, collection, split, config, progress)
    logger.info("fitted %d concept detectors on the %s split", len(det), split)
    return det
