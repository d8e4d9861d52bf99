"""Fixtures for the reliability tests: the web toy collection (tests/web/webtoy.py), indexed,
and a CLI runner that checks the one-line error contract."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for _p in (HERE, TESTS / "web", TESTS.parent / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from reltools import CliResult, run_cli  # noqa: E402
from webtoy import make_collection, make_sr  # noqa: E402

from sparsemm.query.indexing import build_index  # noqa: E402


@pytest.fixture(scope="session")
def toy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """webtoy's 24-item collection with PNG images and its hand-made SR model, indexed."""
    root = tmp_path_factory.mktemp("reltoy")
    col = make_collection(root)
    build_index(col, make_sr(root))
    return root


@pytest.fixture(scope="session")
def toy_collection(toy_root: Path) -> Path:
    return toy_root / "col"


@pytest.fixture()
def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """``cli(*argv, verbs=(...))`` runs ``sparsemm`` in-process with only ``verbs`` loaded
    (so other verbs' modules cannot break these tests) and returns code, stdout, stderr. The
    verbs of sparsemm_experiments (``export``, ``bench``, ...) come in through entry points."""
    from sparsemm.cli import main as cli_main

    library = cli_main.VERBS

    def run(*argv: str, verbs: tuple[str, ...] | None = None) -> CliResult:
        wanted = verbs or (argv[0],)
        monkeypatch.setattr(cli_main, "VERBS", tuple(v for v in wanted if v in library))
        return run_cli(cli_main.main, list(argv), capsys)

    return run
