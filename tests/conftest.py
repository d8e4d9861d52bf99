"""Fixtures shared across the test folders (plain helpers live in tests/fakes.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`sparsemm serve` records running servers in the runtime dir
    (sparsemm.pipeline.running): keep the tests' records out of the user's."""
    before = os.environ.get("SPARSEMM_RUNTIME_DIR")
    os.environ["SPARSEMM_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("runtime"))
    # and the query-text embeddings a search stores (sparsemm.encoders.text_store)
    store = os.environ.get("SPARSEMM_TEXT_STORE")
    os.environ["SPARSEMM_TEXT_STORE"] = str(tmp_path_factory.mktemp("text-store"))
    yield
    if store is None:
        os.environ.pop("SPARSEMM_TEXT_STORE", None)
    else:
        os.environ["SPARSEMM_TEXT_STORE"] = store
    if before is None:
        os.environ.pop("SPARSEMM_RUNTIME_DIR", None)
    else:
        os.environ["SPARSEMM_RUNTIME_DIR"] = before


@pytest.fixture(autouse=True, scope="session")
def _declared_strategies() -> None:
    """The strategies of the research package (the baselines: slq, avg_emb, paper, cbe, ...),
    registered for every test as an install registers them: the modules the
    ``sparsemm.strategies`` entry points of pyproject.toml name are imported, then the
    library's listing order applies. The tests then hold before ``pip install -e .`` records
    the group (tests/test_layers.py checks the declarations themselves)."""
    import importlib
    from pathlib import Path

    import tomllib

    from sparsemm.query.strategies import LISTING_ORDER, reorder_strategies

    with (Path(__file__).resolve().parents[1] / "pyproject.toml").open("rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    for module in groups.get("sparsemm.strategies", {}).values():
        importlib.import_module(module)
    reorder_strategies(LISTING_ORDER)


@pytest.fixture(autouse=True, scope="session")
def _declared_verbs() -> Iterator[None]:
    """The verbs of the research package (``encode``, ``train``, ``spine``, ``demo``, ...),
    added to the ``sparsemm`` command for every test from the ``sparsemm.*`` entry points
    pyproject.toml declares, as an up-to-date install adds them (tests/test_layers.py checks
    the declarations themselves)."""
    from declared import declared_group

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sparsemm.cli.plugins.entry_points", declared_group)
        yield


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread: the tests' tensors are tiny, so more threads only contend
    for the cores that other test runs share.

    Opt in per module with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def declared_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``sparsemm.*`` entry points pyproject.toml declares, in place of those the install
    recorded, so a test of a verb, benchmark, model or strategy that comes in through them
    holds before ``pip install -e .`` records a new one."""
    import sparsemm.cli.plugins as plugins
    from declared import declared_group

    monkeypatch.setattr(plugins, "entry_points", declared_group)
    monkeypatch.setattr("sparsemm.query.strategies.registry.entry_points", declared_group)
    monkeypatch.setattr("importlib.metadata.entry_points", declared_group)
