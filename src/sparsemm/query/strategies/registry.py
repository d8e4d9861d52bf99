"""Strategies by name: :func:`register_strategy` (beside each class), :func:`get_strategy`.

A strategy of another package registers the same way, in a module that the package names in
the ``sparsemm.strategies`` entry points (``name = "module"``): :func:`load_entry_points`
imports those modules, so their strategies are listed and run by name like the library's
(``sparsemm_experiments`` adds ``cbe`` this way).
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from sparsemm.errors import SparsemmError
from sparsemm.query.strategies.base import Strategy
from sparsemm.query.strategies.context import ExclusionContext

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ registry


@dataclass(frozen=True)
class StrategySpec:
    """A registered strategy: class, default parameters, tuning grid, one-line description."""

    name: str
    cls: type[Strategy]
    defaults: Mapping[str, Any]
    grid: Mapping[str, Sequence[Any]]
    description: str

    @property
    def kind(self) -> str:
        return self.cls.kind_of(self.defaults)

    def build(self, ctx: ExclusionContext, **overrides: Any) -> Strategy:
        return self.cls(ctx, **{**self.defaults, **overrides})

    def grid_points(self) -> list[dict[str, Any]]:
        """Every parameter combination of the tuning grid (one empty dict when no grid)."""
        keys = list(self.grid)
        return [
            dict(zip(keys, vals, strict=True)) for vals in itertools.product(*self.grid.values())
        ]


STRATEGIES: dict[str, StrategySpec] = {}
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
STRATEGY_GROUP = "sparsemm.strategies"


def register_strategy(
    name: str,
    cls: type[Strategy],
    description: str,
    grid: Mapping[str, Sequence[Any]] | None = None,
    **defaults: Any,
) -> StrategySpec:
    """Register ``cls`` under ``name`` with default parameters and a tuning grid."""
    if not _NAME_RE.match(name) or "|" in name:
        raise SparsemmError(f"bad strategy name {name!r}: use letters, digits and _ . + -")
    for key in (*defaults, *(grid or {})):
        if key not in cls.params:
            raise SparsemmError(f"{cls.__name__} has no parameter {key!r}")
    spec = StrategySpec(name, cls, dict(defaults), dict(grid or {}), description)
    STRATEGIES[name] = spec
    return spec


def available_strategies() -> list[str]:
    return list(STRATEGIES)


def get_spec(name: str) -> StrategySpec:
    if name not in STRATEGIES:
        raise SparsemmError(
            f"unknown exclusion strategy {name!r}; available: {', '.join(STRATEGIES)}"
        )
    return STRATEGIES[name]


def get_strategy(name: str, ctx: ExclusionContext, **params: Any) -> Strategy:
    """Build the registered strategy ``name`` on ``ctx`` (``params`` override defaults)."""
    return get_spec(name).build(ctx, **params)


def reorder_strategies(names: Sequence[str]) -> None:
    """List ``names`` first, in this order, then any other strategy in registration order:
    the order of ``--list-strategies``, the page's menu and a benchmark of every strategy."""
    first = [n for n in names if n in STRATEGIES]
    rest = [n for n in STRATEGIES if n not in set(first)]
    ordered = {n: STRATEGIES[n] for n in [*first, *rest]}
    STRATEGIES.clear()
    STRATEGIES.update(ordered)


def load_entry_points() -> None:
    """Import the modules the ``sparsemm.strategies`` entry points name; each registers its
    strategies when imported. One that cannot be imported (a dependency missing) is skipped
    with a debug log line, and its strategies are not offered."""
    for ep in sorted(entry_points(group=STRATEGY_GROUP), key=lambda e: e.name):
        try:
            ep.load()
        except ImportError as exc:
            logger.debug("skipping the %s entry point %r: %s", STRATEGY_GROUP, ep.name, exc)
