"""Paired t-tests, summary tables with significance markers, plots and run folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ttest_rel

from sparsemm.errors import SparsemmError
from sparsemm_experiments.eval.exclusion import (
    bar_plot,
    git_commit,
    markdown_table,
    paired_ttest,
    render_report,
    report_from_metrics,
    summarize,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_paired_ttest() -> None:
    a = np.array([0.1, 0.5, 0.3, 0.9, 0.2])
    b = np.array([0.2, 0.4, 0.1, 0.7, 0.2])
    t, p = paired_ttest(a, b)
    ref = ttest_rel(a, b)
    assert t == pytest.approx(ref.statistic)
    assert p == pytest.approx(ref.pvalue)
    assert paired_ttest(a, a) == (0.0, 1.0)
    assert paired_ttest(a + 0.1, a) == (math.inf, 0.0)  # constant difference (up to rounding)
    assert paired_ttest(a - 0.1, a) == (-math.inf, 0.0)
    t1, p1 = paired_ttest(a[:1], b[:1])
    assert math.isnan(t1) and p1 == 1.0
    with pytest.raises(SparsemmError, match="same length"):
        paired_ttest(a, b[:3])
    with pytest.raises(SparsemmError, match="NaN"):
        paired_ttest(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))


def _per_query(n: int = 40) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.6, n)
    viol = rng.uniform(0.1, 0.5, n)
    return {
        "slq": {"ap@10": base, "violation@10": viol},
        # Clearly better on AP and violation than slq (same shift + small noise).
        "sr": {
            "ap@10": base + 0.2 + rng.normal(0, 0.02, n),
            "violation@10": viol - 0.08 + rng.normal(0, 0.02, n),
        },
        # Identical to slq: never significant against it.
        "copy": {"ap@10": base.copy(), "violation@10": viol.copy()},
    }


def test_summarize_means_and_subset() -> None:
    pq = _per_query(4)
    mask = np.array([True, False, True, False])
    s = summarize(pq, mask)
    assert s["slq"]["ap@10"] == pytest.approx(pq["slq"]["ap@10"][[0, 2]].mean())
    assert math.isnan(summarize(pq, np.zeros(4, dtype=bool))["sr"]["ap@10"])
    with pytest.raises(SparsemmError, match="boolean array"):
        summarize(pq, np.array([1, 0, 1, 0]))


def _row(table: str, method: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {method} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


def test_markdown_table_markers_and_bold() -> None:
    pq = _per_query()
    summary = summarize(pq)
    metrics = ["ap@10", "violation@10"]
    table = markdown_table(summary, metrics, per_query=pq, baseline=["slq", "copy"])
    sr = _row(table, "sr")
    # sr: best AP (highest) and best violation (lowest) -> bold, and differs from both
    # baselines -> † (vs slq) and ‡ (vs copy).
    assert sr[0] == f"**{summary['sr']['ap@10']:.3f}**†‡"
    assert sr[1] == f"**{summary['sr']['violation@10']:.3f}**†‡"
    # copy equals slq: no marker against slq (p = 1); slq vs copy likewise.
    assert _row(table, "copy")[0] == f"{summary['copy']['ap@10']:.3f}"
    assert _row(table, "slq")[0] == f"{summary['slq']['ap@10']:.3f}"
    assert "† differs from slq at p < 0.05 (two-sided paired t-test over 40 queries)" in table
    assert "‡ differs from copy" in table
    assert "lower is better for violation@10" in table
    # Without a baseline: bold only.
    plain = markdown_table(summary, metrics)
    assert "†" not in plain and "**" in plain
    with pytest.raises(SparsemmError, match="baseline 'nope'"):
        markdown_table(summary, metrics, per_query=pq, baseline="nope")
    with pytest.raises(SparsemmError, match="need per_query"):
        markdown_table(summary, metrics, baseline="slq")


def test_markdown_table_ties_and_missing() -> None:
    summary = {"a": {"ap@10": 0.5}, "b": {"ap@10": 0.5001}, "c": {"ap@10": math.nan}}
    table = markdown_table(summary, ["ap@10"])
    assert _row(table, "a") == ["**0.500**"]  # ties after rounding are both bold
    assert _row(table, "b") == ["**0.500**"]
    assert _row(table, "c") == ["–"]


def test_bar_plot(tmp_path: Path) -> None:
    out = bar_plot(summarize(_per_query()), ["ap@10", "violation@10"], tmp_path / "p.png")
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert [p.name for p in tmp_path.iterdir()] == ["p.png"]  # no temp file left


def test_write_report(tmp_path: Path) -> None:
    pq = _per_query()
    hard = np.arange(40) % 4 == 0
    subsets = {"all": np.ones(40, dtype=bool), "hard": hard}
    metrics = ["ap@10", "violation@10"]
    run = tmp_path / "run"
    content = write_report(
        run, {"name": "toy run", "k": 10, "path": tmp_path}, pq, subsets, metrics, "slq"
    )
    names = sorted(p.name for p in run.iterdir())
    assert names == [
        "config.json",
        "metrics.json",
        "per_query.npz",
        "plot_all.png",
        "plot_hard.png",
        "report.md",
    ]
    config = json.loads((run / "config.json").read_text())
    assert config["k"] == 10 and config["path"] == str(tmp_path)
    assert isinstance(config["git_commit"], str) and config["git_commit"]
    metrics_json = json.loads((run / "metrics.json").read_text())
    assert metrics_json == content
    assert metrics_json["subsets"]["all"]["n_queries"] == 40
    assert metrics_json["subsets"]["hard"]["n_queries"] == 10
    assert metrics_json["subsets"]["hard"]["means"]["sr"]["ap@10"] == pytest.approx(
        pq["sr"]["ap@10"][hard].mean()
    )
    p_all = metrics_json["subsets"]["all"]["p_values"]["slq"]
    assert p_all["sr"]["ap@10"] < 0.05 and p_all["copy"]["ap@10"] == 1.0
    with np.load(run / "per_query.npz", allow_pickle=False) as npz:
        np.testing.assert_array_equal(npz["sr|ap@10"], pq["sr"]["ap@10"])
        np.testing.assert_array_equal(npz["subset|hard"], hard)
    report = (run / "report.md").read_text()
    assert report.startswith("# toy run")
    assert "## all (40 queries)" in report and "## hard (10 queries)" in report
    assert "![hard](plot_hard.png)" in report
    assert report.count("| method | ap@10 | violation@10 |") == 2
    # The report is a pure function of metrics.json (+ config): regenerate it from disk.
    assert report_from_metrics(run) == report
    assert render_report(metrics_json, config) == report
    assert (run / "plot_hard.png").read_bytes().startswith(PNG_MAGIC)


def test_write_report_errors(tmp_path: Path) -> None:
    pq = _per_query()
    with pytest.raises(SparsemmError, match="no values for metric"):
        write_report(tmp_path, {}, pq, None, ["ap@5"])
    with pytest.raises(SparsemmError, match="boolean array of shape"):
        write_report(tmp_path, {}, pq, {"x": np.ones(3, dtype=bool)}, ["ap@10"])
    bad = {"a": {"ap@10": np.zeros(3)}, "b": {"ap@10": np.zeros(4)}}
    with pytest.raises(SparsemmError, match="per-query values"):
        write_report(tmp_path, {}, bad, None, ["ap@10"])


def test_git_commit_outside_a_repository(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == "unknown"
