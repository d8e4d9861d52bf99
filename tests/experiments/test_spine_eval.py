"""``sparsemm spine eval`` (registered through the sparsemm.spine entry points): raw GloVe
vs SPINE on a trained run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import toy_word_vectors
from sparsemm.cli.main import main

pytestmark = pytest.mark.usefixtures("declared_entry_points")

WORDSIM = (
    "Word 1\tWord 2\tHuman (mean)\n"
    "animal\tanimalb\t9\nanimal\tfood\t1\nfood\tfoodc\t8\nsport\troom\t2\ncolor\tcolord\t7\n"
)


def _spine_run(tmp_path: Path) -> Path:
    """A SPINE run folder trained for 3 epochs on the toy vocabulary."""
    vectors = toy_word_vectors()
    glove = tmp_path / "glove.txt"
    with glove.open("w") as fh:
        for w, v in zip(vectors.words, vectors.vectors, strict=True):
            fh.write(w + " " + " ".join(f"{x:.6f}" for x in v) + "\n")
    out = tmp_path / "run"
    argv = ["spine", "train", "-o", str(out), "--glove", str(glove), "--top-words", "100"]
    argv += ["--hidden", "16", "--batch-size", "50", "--lr", "0.01", "--epochs", "3"]
    assert main([*argv, "--no-progress", "--threads", "1"]) == 0
    return out


def test_spine_eval_compares_raw_and_sparse_vectors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _spine_run(tmp_path)
    wordsim = tmp_path / "ws.tab"
    wordsim.write_text(WORDSIM)
    capsys.readouterr()
    assert main(["spine", "eval", str(out), "--wordsim", str(wordsim)]) == 0
    table = capsys.readouterr().out
    assert "| metric (100 words) | raw GloVe | SPINE |" in table
    assert "WordSim-353 Spearman" in table and "distance ratio" in table
    report = json.loads((out / "eval.json").read_text())
    raw, spine = report["results"]["raw"], report["results"]["spine"]
    assert raw["zero_share"] == 0.0 and raw["mean_active_dims"] == 16.0
    assert raw["wordsim_pairs"] == spine["wordsim_pairs"] == 5
    assert spine["zero_share"] > 0.0
    assert spine["n_dims_used"] + spine["n_dims_skipped"] == 16


def test_spine_eval_of_a_folder_without_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spine", "eval", str(tmp_path / "nothing")]) == 2
    assert "spine train" in capsys.readouterr().err
