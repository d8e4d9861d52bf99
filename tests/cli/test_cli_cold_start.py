"""Cold start of the ``sparsemm`` command: building the parser imports no heavy library.

`sparsemm --help`, `sparsemm search --help` and `sparsemm search --list-strategies` must
answer without importing torch, transformers or sentence-transformers (seconds of import
time); the CLI modules write out a few constants for that, checked here against the library.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from declared import SUBPROCESS_PRELUDE

HEAVY = ("torch", "transformers", "sentence_transformers", "numba")

# Runs the CLI in a fresh interpreter and reports which heavy modules got imported.
PROBE = """
{prelude}
import contextlib, io, json, sys
from sparsemm.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        status = main(sys.argv[1:])
    except SystemExit as exc:
        status = exc.code
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"status": status, "heavy": heavy, "out": out.getvalue()}}))
"""


def _probe(*argv: str) -> dict:
    code = PROBE.format(prelude=SUBPROCESS_PRELUDE, heavy=HEAVY)
    res = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("search", "--help"),
        ("search", "--list-strategies"),
        ("train", "--help"),
        ("encode", "--help"),
        ("spine", "--help"),
    ],
)
def test_help_and_strategy_list_import_no_heavy_library(argv: tuple[str, ...]) -> None:
    got = _probe(*argv)
    assert got["status"] == 0
    assert got["out"].strip()
    assert got["heavy"] == [], f"sparsemm {' '.join(argv)} imported {got['heavy']}"


def test_list_strategies_names_every_strategy() -> None:
    # the library's registry in a fresh interpreter: experiments register variants of their
    # own (vdr_runs' fixed paper strategy) when a test imports them
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sparsemm.query.strategies import STRATEGIES; print(' '.join(STRATEGIES))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    listed = [line.split()[0] for line in _probe("search", "--list-strategies")["out"].splitlines()]
    assert listed == res.stdout.split()


def test_constants_written_out_in_the_cli_match_the_library() -> None:
    from sparsemm.cli import index, search
    from sparsemm.data.encode import BAD_IMAGE_POLICIES
    from sparsemm.index.backends import BACKENDS
    from sparsemm.query.request import DEFAULT_STRATEGY
    from sparsemm_experiments.cli import encode

    assert encode.BAD_IMAGE_POLICIES == BAD_IMAGE_POLICIES
    assert index.BACKENDS == BACKENDS
    assert search.DEFAULT_STRATEGY == DEFAULT_STRATEGY


ENTRY = "import sys; from sparsemm.cli.main import entry; sys.argv[0] = 'sparsemm'; entry()"


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["search", "col", "a dog"], True),
        (["-v", "search", "col"], True),
        (["index", "col"], False),
        (["--help"], False),
        ([], False),
    ],
)
def test_read_only_verbs_are_recognised(argv: list[str], want: bool) -> None:
    from sparsemm.cli.main import read_only

    assert read_only(argv) is want


def test_entry_flushes_output_and_keeps_the_status_when_it_exits_at_once(tmp_path) -> None:
    # a search ends with os._exit: its output must still arrive, and its status be kept
    ok = subprocess.run(
        [sys.executable, "-c", ENTRY, "search", "--list-strategies"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    listed = [line.split()[0] for line in ok.stdout.splitlines()]
    assert listed == [
        line.split()[0] for line in _probe("search", "--list-strategies")["out"].splitlines()
    ]
    bad = subprocess.run(
        [sys.executable, "-c", ENTRY, "search", str(tmp_path / "missing"), "a dog", "--no-server"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1
    assert bad.stdout == ""
