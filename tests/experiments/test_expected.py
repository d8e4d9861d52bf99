"""Expected figures: the comparison flags a miss and passes a match (tiny fake metrics),
and every preset ships a well-formed expected-figures file."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from sparsemm.errors import SparsemmError
from sparsemm_experiments.expected import (
    FORMAT,
    Figure,
    check_run,
    compare,
    comparison_table,
    load_expected,
    lookup,
    main,
    parse_expected,
    start_check,
)

METRICS = {
    "n_queries": 188,
    "table1": {"subsets": {"all": {"means": {"SR detector": {"ap@10": 0.3150}}}}},
    "runs": [{"t2i_AP@1": 0.84}],
    "note": "text",
}


def _doc(figures: list[dict]) -> dict:
    return {"format": FORMAT, "version": 1, "preset": "fake", "figures": figures}


def _fig(path: list[str], expected: float, tolerance: float = 0.01) -> dict:
    return {"name": "/".join(path), "path": path, "expected": expected, "tolerance": tolerance}


AP = ["table1", "subsets", "all", "means", "SR detector", "ap@10"]


def test_lookup_follows_keys_with_dots_and_list_indices() -> None:
    assert lookup(METRICS, AP) == pytest.approx(0.315)
    assert lookup(METRICS, ["runs", "0", "t2i_AP@1"]) == pytest.approx(0.84)
    assert lookup(METRICS, ["n_queries"]) == 188.0
    assert lookup(METRICS, ["table1", "subsets", "hard"]) is None  # missing
    assert lookup(METRICS, ["note"]) is None  # not a number
    assert lookup(METRICS, ["table1"]) is None  # not a leaf
    assert lookup(METRICS, ["runs", "1", "t2i_AP@1"]) is None


def test_a_match_passes_and_a_miss_is_flagged() -> None:
    figures = parse_expected(
        _doc(
            [
                _fig(AP, 0.320, 0.01),  # within tolerance
                _fig(["n_queries"], 188, 0),  # exact
                _fig(["runs", "0", "t2i_AP@1"], 0.80, 0.01),  # off by 0.04: a miss
                _fig(["table1", "subsets", "hard", "ap@10"], 0.5),  # missing: a miss
            ]
        )
    )
    rows = compare(METRICS, figures)
    assert [r.ok for r in rows] == [True, True, False, False]
    table = comparison_table(rows)
    assert table.splitlines()[0] == "| metric | expected | got | ok |"
    assert "| n_queries | 188 | 188 | ok |" in table
    assert "| runs/0/t2i_AP@1 | 0.8000 ± 0.01 | 0.8400 | MISS |" in table
    assert "missing | MISS |" in table
    assert table.splitlines()[-1] == "2 of 4 figures as expected; 2 missed"
    # exactly at the tolerance is a match, whatever float rounding makes of the difference
    edge = compare({"x": 0.31}, [Figure("x", ("x",), 0.30, 0.01)])
    assert edge[0].ok


def test_all_met_reports_no_miss() -> None:
    rows = compare(METRICS, parse_expected(_doc([_fig(AP, 0.315)])))
    assert all(r.ok for r in rows)
    assert comparison_table(rows).splitlines()[-1] == "1 of 1 figures as expected"


@pytest.mark.parametrize(
    "doc",
    [
        {"format": "other", "version": 1, "figures": [_fig(["x"], 1.0)]},
        _doc([]),
        _doc([{"path": ["x"], "expected": 1.0}]),  # no tolerance
        _doc([_fig([], 1.0)]),  # empty path
        _doc([_fig(["x"], 1.0, -0.1)]),  # negative tolerance
        _doc([_fig(["x"], float("nan"))]),
    ],
)
def test_malformed_expected_figures_are_refused(doc: dict) -> None:
    with pytest.raises(SparsemmError):
        parse_expected(doc)


PRESETS = sorted(
    p.name.removesuffix(".json")
    for p in resources.files("sparsemm_experiments.presets").iterdir()
    if p.name.endswith(".json") and not p.name.endswith(".expected.json")
)


def test_every_preset_has_expected_figures() -> None:
    assert {"paper", "paper_quick", "vdr", "vdr_quick", "lexlip", "lexlip_quick"} <= set(PRESETS)
    for preset in PRESETS:
        raw = load_expected(preset)
        assert raw["preset"] == preset
        assert raw["command"].startswith("sparsemm bench ") and "--check" in raw["command"]
        assert raw["source"]
        assert len(parse_expected(raw)) >= 3


def test_check_run_and_the_module_command(tmp_path: Path, capsys) -> None:
    raw = load_expected("paper_quick")
    # A run that wrote exactly the expected figures passes; one figure off fails.
    metrics: dict = {}
    for f in parse_expected(raw):
        node = metrics
        for key in f.path[:-1]:
            node = node.setdefault(key, {})
        node[f.path[-1]] = f.expected
    ok, table = check_run("paper_quick", metrics)
    assert ok and "MISS" not in table
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(metrics))
    assert main(["paper_quick", str(path)]) == 0
    first = parse_expected(raw)[0]
    node = metrics
    for key in first.path[:-1]:
        node = node[key]
    node[first.path[-1]] = first.expected + first.tolerance + 0.05
    path.write_text(json.dumps(metrics))
    assert main(["paper_quick", str(path)]) == 1
    assert "MISS" in capsys.readouterr().out
    assert main(["no_such_preset", str(path)]) == 2


def test_check_refuses_settings_that_change_the_preset() -> None:
    start_check("paper_quick", {"--dims": False, "--seed": False})
    with pytest.raises(SparsemmError, match="--dims"):
        start_check("paper_quick", {"--dims": True})
    with pytest.raises(SparsemmError, match="no expected figures"):
        start_check("no_such_preset", {})


def test_bench_check_refuses_a_changed_preset_before_running(tmp_path: Path, capsys) -> None:
    from sparsemm.cli.main import main as cli

    args = ["bench", "paper", "--quick", "--check", "--sr-epochs", "1", "-o", str(tmp_path)]
    assert cli(args) == 2
    assert "--sr-epochs" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
