"""Where the shared development data lives."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """$SPARSEMM_DATA, else ``../shared/data`` relative to the working directory."""
    return Path(os.environ.get("SPARSEMM_DATA", "../shared/data"))
