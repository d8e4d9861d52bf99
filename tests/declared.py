"""The ``sparsemm.*`` entry points pyproject.toml declares, for tests that must hold before
``pip install -e .`` records a new one (the verbs, benchmarks, train models and strategies of
sparsemm_experiments come in through them)."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def declared_entry_points() -> list[EntryPoint]:
    """Every ``sparsemm.*`` entry point of pyproject.toml."""
    with PYPROJECT.open("rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    return [
        EntryPoint(name, value, group)
        for group, names in groups.items()
        if group.startswith("sparsemm.")
        for name, value in names.items()
    ]


def declared_group(group: str) -> list[EntryPoint]:
    """The declared entry points of ``group`` (a stand-in for ``entry_points(group=...)``)."""
    return [ep for ep in declared_entry_points() if ep.group == group]


# Run first in a test's subprocess (``python -c``): its ``sparsemm`` command then has the
# declared verbs, as an up-to-date install has.
SUBPROCESS_PRELUDE = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
    "import declared, sparsemm.cli.plugins\n"
    "sparsemm.cli.plugins.entry_points = declared.declared_group\n"
)
