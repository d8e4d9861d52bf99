"""Shared test settings: where ../shared/data is (tests that need it skip when absent)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SPARSEMM_DATA", REPO.parent / "shared" / "data"))
COCO_JSON = SHARED_DATA / "coco" / "val2017.json"
