"""``sparsemm bench paper`` end to end at reduced size on a synthetic COCO-format file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from fakes import write_fake_coco
from sparsemm.cli.main import main
from sparsemm.errors import SparsemmError
from sparsemm_experiments.paper_bench import (
    TABLE1_BASELINES,
    PaperBenchConfig,
    render_paper_report,
)

pytestmark = pytest.mark.slow  # every table of the paper bench, end to end (CONTRIBUTING.md)

OBJECTS = ["dog", "cat", "pizza", "car", "tree", "ball", "bench", "kite", "horse", "boat"]
CONCEPTS = [*OBJECTS, "animal", "food", "street", "park", "water", "grass", "sky", "table"]


def _captions(objs: list[str]) -> list[str]:
    return [
        "a photo of a " + " and a ".join(objs),
        f"the {objs[-1]} next to {' and '.join(objs[:-1]) or 'nothing'}",
        f"one {objs[0]} in a picture",
    ]


def _fake_data(root: Path, n: int = 120) -> Path:
    write_fake_coco(root, OBJECTS, _captions, n=n, first_id=5000, n_objects=(1, 4))
    (root / "splice").mkdir()
    # least to most frequent, as SpLiCE's files are
    (root / "splice" / "laion.txt").write_text("\n".join(reversed(CONCEPTS)) + "\n")
    return root


def test_bench_paper_quick_end_to_end_and_cached(tmp_path: Path, capsys) -> None:
    data, out = _fake_data(tmp_path / "data"), tmp_path / "paper"
    args = ["bench", "paper", "--quick", "--data", str(data), "-o", str(out), "--no-progress"]
    assert main(args) == 0
    assert "best AP@10" in capsys.readouterr().out
    m = json.loads((out / "metrics.json").read_text())
    t1 = m["table1"]
    means = t1["subsets"]["all"]["means"]
    for row in (*TABLE1_BASELINES, "Dense Avg Emb w=0.5", "SR (two-step)", "SR code arith"):
        assert row in means, row
        for metric in ("mrr@1", "ndcg@3", "ap@10", "violation@10"):
            assert 0.0 <= means[row][metric] <= 1.0
    assert t1["baselines"] == list(TABLE1_BASELINES)
    assert set(t1["subsets"]) == {"all", "hard"}
    p = t1["subsets"]["all"]["p_values"]["Dense Avg Emb"]["SR (two-step)"]["ap@10"]
    assert p is None or 0.0 <= p <= 1.0
    # Table 2: every representation, both directions; Table 3: each d and the no-bias row.
    assert set(m["table2"]) == {
        "Dense (MiniLM caption views)",
        "SR d=48",
        "VDR",
        "SpLiCE",
        "SR d=32",
        "SR d=48 no bias",
    }
    for row in m["table2"].values():
        assert 0.0 <= row["i2t_AP@1"] <= 1.0 and 0.0 <= row["t2i_AP@10"] <= 1.0
    assert list(m["table3"]) == ["d=32", "d=48", "d=48 no bias"]
    assert m["sr_models"]["sr-d48-nobias"]["spine_bias"] is False
    for f in ("plots/table2_retrieval.png", "plots/table3_dimensions.png", "table1/plot_all.png"):
        assert (out / f).stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert report == render_paper_report(m)
    assert "Table 1" in report and "Table 3" in report and "SR (two-step)" in report

    # A second run reuses every trained model and benchmark run.
    assert main(args) == 0
    again = json.loads((out / "metrics.json").read_text())
    assert set(again["reused_runs"]) == {
        "dense",
        "sr-d32",
        "sr-d48",
        "sr-d48-nobias",
        "vdr",
        "splice",
    }
    assert again["table1"]["subsets"] == t1["subsets"]


def test_bench_paper_errors(tmp_path: Path, capsys) -> None:
    assert main(["bench", "paper", "--data", str(tmp_path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "val2017.json not found" in err and "\n" == err[-1] and err.count("\n") == 1
    with pytest.raises(SparsemmError, match="main_dim"):
        PaperBenchConfig(dims=(500, 1500), main_dim=1000)
    with pytest.raises(SparsemmError, match="top_k"):
        PaperBenchConfig(dims=(32,), main_dim=32, top_k=64)
