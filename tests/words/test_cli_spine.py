from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparsemm.cli.main import main
from sparsemm.models.spine import SPINE
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors, load_word_vectors


@pytest.fixture()
def inputs(tmp_path: Path, toy_vectors: WordVectors) -> dict[str, Path]:
    glove = tmp_path / "glove.txt"
    with glove.open("w") as fh:
        for w, v in zip(toy_vectors.words, toy_vectors.vectors, strict=True):
            fh.write(w + " " + " ".join(f"{x:.6f}" for x in v) + "\n")
    coco = tmp_path / "coco.json"
    coco.write_text(
        json.dumps(
            {
                "1": {"split": "train", "labels": [], "captions": ["A plantt near a toolt."]},
                "2": {"split": "test", "labels": [], "captions": ["The weatherq!"]},
            }
        )
    )
    return {"glove": glove, "coco": coco, "out": tmp_path / "run"}


TRAIN = ["--hidden", "16", "--batch-size", "50", "--lr", "0.01", "--no-progress", "--threads", "1"]


def test_cli_train_inspect(inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = inputs["out"]
    argv = ["spine", "train", "-o", str(out), "--glove", str(inputs["glove"]), "--top-words", "100"]
    argv += ["--captions", str(inputs["coco"]), "--split", "train", "--epochs", "3", *TRAIN]
    assert main(argv) == 0
    assert "trained SPINE on 102 words" in capsys.readouterr().out
    # model, checkpoint, dense training vocabulary and sparse vectors are all in OUT
    vocab = load_word_vectors(out / "input_vectors")
    assert len(vocab) == 102 and {"plantt", "toolt"} <= set(vocab.words)
    assert "weatherq" not in vocab  # test-split caption words are not added
    sparse = SparseWordVectors.load(out)  # the run folder resolves to OUT/vectors
    assert sparse.words == vocab.words and sparse.dim == 16
    np.testing.assert_array_equal(
        sparse.matrix.toarray(), SPINE.from_pretrained(out).encode(vocab.vectors)
    )
    assert (out / "checkpoint" / "state.json").is_file()

    # a second train into the same folder must ask for --resume; with it, training continues
    assert main(argv) == 2
    assert "--resume" in capsys.readouterr().err
    argv[argv.index("--epochs") + 1] = "4"
    assert main([*argv, "--resume"]) == 0
    log = json.loads((out / "train_log.json").read_text())
    assert [h["epoch"] for h in log["history"]] == [1, 2, 3, 4]
    capsys.readouterr()

    live = int(np.flatnonzero(sparse.matrix.getnnz(axis=0))[0])
    assert main(["spine", "inspect", str(out), "--dim", str(live), "-k", "3"]) == 0
    assert capsys.readouterr().out.startswith(f"dim {live} (")
    assert main(["spine", "inspect", str(out), "--word", "Animal", "-k", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("animal: ") and "dim" in text
    assert main(["spine", "inspect", str(out), "--word", "zebra"]) == 2
    assert "not in the SPINE vocabulary" in capsys.readouterr().err


def test_cli_errors(inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    missing = inputs["out"] / "nothing"
    assert main(["spine", "inspect", str(missing), "--dim", "0"]) == 2
    assert "spine train" in capsys.readouterr().err
    bad = ["spine", "train", "-o", str(missing), "--glove", str(inputs["glove"])]
    assert main([*bad, "--captions", str(inputs["coco"]), "--split", "val"]) == 2
    assert "splits present" in capsys.readouterr().err
    assert main(["spine", "train", "-o", str(missing), "--glove", str(missing / "g.txt")]) == 2
    assert "not found" in capsys.readouterr().err
