"""Expected figures of the reproduction presets, and the check of a run against them.

Beside each preset ``presets/NAME.json`` lies ``presets/NAME.expected.json``: the headline
figures a run of that preset should write into its ``metrics.json``, each with a tolerance,
where they were measured and the command that measures them again (in the spirit of
pyserini's two-click reproductions)::

    {"format": "sparsemm.expected", "version": 1, "preset": "paper_quick",
     "command": "sparsemm bench paper --quick -o runs/paper-quick --check",
     "source": "where and when the figures were measured",
     "figures": [{"name": "...", "path": ["table1", "subsets", "all", "means",
                  "SR detector", "ap@10"], "expected": 0.315, "tolerance": 0.01}, ...]}

A figure's ``path`` is the list of keys leading to it in ``metrics.json`` (a list, because
the keys themselves hold dots: ``avg_emb_0.5``, ``ap@10``). A figure is met when the run
has a number there within ``tolerance`` of ``expected``; a missing or non-numeric value is a
miss.

``sparsemm bench paper|vdr|lexlip ... --check`` runs a preset and then compares;
``python -m sparsemm_experiments.expected PRESET METRICS.json`` compares a finished run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError

FORMAT = "sparsemm.expected"
VERSION = 1


@dataclass(frozen=True)
class Figure:
    """One expected figure: where it sits in ``metrics.json`` and the value it should have."""

    name: str
    path: tuple[str, ...]
    expected: float
    tolerance: float


@dataclass(frozen=True)
class Comparison:
    """One figure of a run against its expected value."""

    figure: Figure
    got: float | None

    @property
    def ok(self) -> bool:
        if self.got is None or not math.isfinite(self.got):
            return False
        # A hair of slack so that a tolerance written as 0.01 admits a difference that
        # float rounding shows as 0.010000000000000009.
        return abs(self.got - self.figure.expected) <= self.figure.tolerance + 1e-12


def parse_expected(raw: Mapping[str, Any], where: str = "expected figures") -> list[Figure]:
    """The figures of an expected-figures document; a malformed one is one error line."""
    if raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise SparsemmError(f"{where}: not a {FORMAT} version {VERSION} document")
    items = raw.get("figures")
    if not isinstance(items, list) or not items:
        raise SparsemmError(f"{where}: 'figures' must be a non-empty list")
    figures = []
    for i, item in enumerate(items):
        try:
            path = tuple(str(p) for p in item["path"])
            fig = Figure(
                name=str(item.get("name") or "/".join(path)),
                path=path,
                expected=float(item["expected"]),
                tolerance=float(item["tolerance"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SparsemmError(
                f"{where}: figure {i} needs a path, an expected value and a tolerance ({exc})"
            ) from None
        if not fig.path or not math.isfinite(fig.expected) or not fig.tolerance >= 0:
            raise SparsemmError(f"{where}: figure {i} ({fig.name}) is malformed")
        figures.append(fig)
    return figures


def expected_path(preset: str) -> str:
    """The file name of a preset's expected figures, inside the presets package."""
    return f"{preset}.expected.json"


def load_expected(preset: str) -> dict[str, Any]:
    """The expected-figures document of ``preset`` (``presets/PRESET.expected.json``)."""
    ref = resources.files("sparsemm_experiments.presets").joinpath(expected_path(preset))
    if not ref.is_file():
        raise SparsemmError(f"no expected figures for preset {preset!r} ({expected_path(preset)})")
    raw = json.loads(ref.read_text(encoding="utf-8"))
    parse_expected(raw, expected_path(preset))
    return dict(raw)


def lookup(metrics: Any, path: Sequence[str]) -> float | None:
    """The number at ``path`` in ``metrics`` (nested dicts; a list index as a digit string),
    or None when the path is missing or does not end at a number."""
    node = metrics
    for key in path:
        if isinstance(node, Mapping) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    return float(node)


def compare(metrics: Mapping[str, Any], figures: Sequence[Figure]) -> list[Comparison]:
    """Each figure against the run's ``metrics``."""
    return [Comparison(f, lookup(metrics, f.path)) for f in figures]


def _fmt(v: float | None, whole: bool) -> str:
    if v is None:
        return "missing"
    return str(int(v)) if whole and v.is_integer() else f"{v:.4f}"


def comparison_table(rows: Sequence[Comparison]) -> str:
    """The comparison as a Markdown table: metric, expected (± tolerance), got, ok. A count
    (a whole number expected exactly) is printed as one."""
    from sparsemm_experiments.eval.tables import md_table

    body = []
    for r in rows:
        f = r.figure
        whole = f.tolerance == 0 and f.expected.is_integer()
        expected = _fmt(f.expected, whole) + ("" if whole else f" ± {f.tolerance:g}")
        body.append([f.name, expected, _fmt(r.got, whole), "ok" if r.ok else "MISS"])
    misses = sum(not r.ok for r in rows)
    lines = md_table(["metric", "expected", "got", "ok"], body, "lrrl")
    lines.append("")
    lines.append(
        f"{len(rows) - misses} of {len(rows)} figures as expected"
        + (f"; {misses} missed" if misses else "")
    )
    return "\n".join(lines)


def check_run(preset: str, metrics: Mapping[str, Any] | str | Path) -> tuple[bool, str]:
    """Compare a run (its metrics.json content or path) with ``preset``'s expected figures;
    returns (every figure met, the printed table)."""
    if not isinstance(metrics, Mapping):
        path = Path(metrics)
        try:
            metrics = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SparsemmError(f"cannot read {path}: {exc}") from None
        assert isinstance(metrics, Mapping)
    raw = load_expected(preset)
    rows = compare(metrics, parse_expected(raw, expected_path(preset)))
    head = f"expected figures of preset {preset} ({raw.get('source', 'no source given')})"
    return all(r.ok for r in rows), head + "\n\n" + comparison_table(rows)


def start_check(preset: str, given: Mapping[str, bool]) -> None:
    """Before a ``--check`` run, so that it fails before the run rather than after it: the
    preset's expected figures must load, and the options that change the preset's settings
    (``given[flag]`` true) are refused, since the figures hold for the preset as it is."""
    load_expected(preset)
    changed = [flag for flag, on in given.items() if on]
    if changed:
        raise SparsemmError(
            f"--check compares a run of preset {preset} with its expected figures; leave out "
            f"{', '.join(changed)}, which change the run"
        )


def report_check(preset: str, metrics: Mapping[str, Any]) -> int:
    """Print the comparison of a finished run; 0 when every figure is met, else 1."""
    ok, table = check_run(preset, metrics)
    print(table)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sparsemm_experiments.expected PRESET METRICS.json``."""
    ap = argparse.ArgumentParser(
        prog="python -m sparsemm_experiments.expected",
        description="Compare a finished run's metrics.json with a preset's expected figures "
        "(exit 1 on a miss).",
    )
    ap.add_argument("preset", help="paper, paper_quick, vdr, vdr_quick, lexlip or lexlip_quick")
    ap.add_argument("metrics", type=Path, help="the run's metrics.json")
    args = ap.parse_args(argv)
    try:
        ok, table = check_run(args.preset, args.metrics)
    except SparsemmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
