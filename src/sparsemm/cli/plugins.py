"""Verbs that live in other packages, found through entry points, so that the library never
imports them.

A package adds a verb to ``sparsemm`` with an entry point in the ``sparsemm.verbs`` group
(``name = "module:register"``, called with the verb subparsers) or a benchmark to
``sparsemm bench`` in the ``sparsemm.bench`` group (called with the bench subparsers) or a
model to ``sparsemm train`` in the ``sparsemm.train`` group (called with the model
subparsers) or a sub-command to ``sparsemm spine`` in the ``sparsemm.spine`` group (called
with the spine subparsers). The wheel's own ``sparsemm_experiments`` registers ``encode``,
``spine``, ``train``, ``demo``, ``bench``, ``export``, ``collages``, ``bench
paper|vdr|lexlip``, ``train align|vdr|lexlip`` and ``spine eval`` this way (see
pyproject.toml); the ``sparsemm.train`` and ``sparsemm.spine`` groups are read by its
``train`` and ``spine`` verbs. Loading one imports only its small CLI module; the work is
imported when the command runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

log = logging.getLogger(__name__)

VERB_GROUP = "sparsemm.verbs"
BENCH_GROUP = "sparsemm.bench"
TRAIN_GROUP = "sparsemm.train"
SPINE_GROUP = "sparsemm.spine"


def registrars(group: str) -> list[Callable[[Any], None]]:
    """The ``register(subparsers)`` functions of ``group``'s entry points, by name (one per
    name, should two installs list it); one that cannot be imported is skipped."""
    found: dict[str, Callable[[Any], None]] = {}
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        if ep.name in found:
            continue
        try:
            found[ep.name] = ep.load()
        except ImportError as exc:  # a plugin whose dependencies are not installed
            log.debug("skipping the %s entry point %r: %s", group, ep.name, exc)
    return list(found.values())
