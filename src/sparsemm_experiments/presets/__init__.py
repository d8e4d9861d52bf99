"""Run settings as data, read by :func:`load_preset`: ``paper.json``, ``vdr.json`` and
``lexlip.json`` hold the settings of the full reproductions (the defaults of their run
configs), ``*_quick.json`` what a ``--quick`` smoke run overrides."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_preset(name: str) -> dict[str, Any]:
    """The settings of preset ``name`` (``presets/NAME.json``); JSON lists become tuples, as
    the run configs hold them."""
    text = resources.files(__package__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
