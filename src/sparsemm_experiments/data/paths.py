"""Where the shared development data lives."""

from __future__ import annotations

import os
from pathlib import Path

from sparsemm.errors import SparsemmError


def default_data_dir() -> Path:
    """$SPARSEMM_DATA, else ``../shared/data`` relative to the working directory."""
    return Path(os.environ.get("SPARSEMM_DATA", "../shared/data"))


def coco_json(data_dir: str | Path) -> Path:
    """``DATA/coco/val2017.json``, the COCO captions of the caption-proxy runs; a one-line
    SparsemmError when it is not there."""
    path = Path(data_dir) / "coco" / "val2017.json"
    if not path.is_file():
        raise SparsemmError(
            f"{path} not found; pass --data pointing at the folder holding coco/val2017.json"
        )
    return path
