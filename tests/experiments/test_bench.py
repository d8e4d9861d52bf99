"""The exclusion benchmark end to end on a tiny fixture collection (fake encoder, tiny SR)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import scipy.sparse as sp

from fakes import CAPTION_FILLER, CAPTION_LABELS, labelled_caption_collection, term_word_encoder
from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRConfig
from sparsemm.query.strategies import available_strategies, sr_query_coder
from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection, train_sr
from sparsemm.words.spine import SparseWordVectors
from sparsemm_experiments.cli import bench as bench_cli
from sparsemm_experiments.eval.bench import (
    METRICS,
    BenchConfig,
    _select,
    retrieval_table,
    run_exclusion_bench,
)

WORDS, FILLER = CAPTION_LABELS, CAPTION_FILLER
DIM = len(WORDS) + len(FILLER)


KeywordEncoder = term_word_encoder(
    WORDS + FILLER, "keyword-bench-test", fallback=True, register=True
)


def _collection(path, n_train: int = 60, n_test: int = 40):
    return labelled_caption_collection(path, KeywordEncoder(), n_train, n_test)


def _vectors(latent: int) -> SparseWordVectors:
    rng = np.random.default_rng(1)
    mat = sp.random(len(WORDS), latent, density=0.2, random_state=rng, format="csr")
    return SparseWordVectors(WORDS, mat.astype(np.float32))


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    col = _collection(root / "collection")
    vectors = _vectors(24)
    vectors.save(root / "spine" / "vectors")
    image, text, pair_item, bias = sr_pairs_from_collection(col, col.split_mask("train"), vectors)
    cfg = SRConfig(text_dim=DIM, image_dim=DIM, latent_dim=24, top_k=6)
    model, _ = train_sr(
        image,
        text,
        pair_item,
        bias,
        cfg,
        root / "sr",
        SRTrainConfig(epochs=2, batch_size=32),
        progress=False,
    )
    from sparsemm.models.detectors import DetectorConfig
    from sparsemm.train.detectors import fit_model_detectors

    # the detectors `sparsemm train sr` saves with a model (the match scorer reads them)
    fit_model_detectors(model, root / "sr", col, "train", DetectorConfig(min_mentions=2))
    return root, col, model, vectors


def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_bench_cli_end_to_end(fixture, capsys) -> None:
    root, _, _, _ = fixture
    out = root / "report"
    argv = ["bench", "exclusion", "--collection", str(root / "collection")]
    argv += ["--sr", str(root / "sr"), "--spine", str(root / "spine"), "-o", str(out), "--quick"]
    assert _run_cli(argv) == 0
    assert "report:" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["subsets"]) == {"all", "hard"}
    means = metrics["subsets"]["all"]["means"]
    assert set(means) == set(available_strategies())
    for m in means.values():
        assert set(m) == set(METRICS)
        assert 0.0 <= m["ap@10"] <= 1.0
    assert metrics["baselines"] == ["avg_emb_0.5", "dense_a", "dense_detector"]
    assert set(metrics["retrieval"]) == {"dense", "sparse"}
    assert 0.0 < metrics["retrieval"]["dense"]["t2i_AP@1"] <= 1.0
    assert metrics["tuning"]["split"] == "train"
    report = (out / "report.md").read_text()
    assert "## all" in report and "## hard" in report and "Standard retrieval" in report
    assert (out / "plot_all.png").read_bytes()[:4] == b"\x89PNG"
    config = json.loads((out / "config.json").read_text())
    assert config["methods"]["avg_emb_0.5"]["params"] == {"w": 0.5}


def test_bench_cli_trains_sr_when_missing(fixture) -> None:
    root, _, _, _ = fixture
    out = root / "report-nosr"
    argv = ["bench", "exclusion", "--collection", str(root / "collection"), "-o", str(out)]
    argv += ["--quick", "--methods", "avg_emb_0.5", "code_arith"]
    assert _run_cli(argv) == 0
    assert (out / "sr" / "model.safetensors").is_file()
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["subsets"]["all"]["means"]) == {"avg_emb_0.5", "code_arith"}


def test_library_run_dense_only_and_tuning(fixture, tmp_path) -> None:
    _, col, model, vectors = fixture
    cfg = BenchConfig(methods=("dense_a", "avg_emb", "avg_emb_0.5", "code_a"))
    content = run_exclusion_bench(col, tmp_path, KeywordEncoder(), config=cfg)
    # No sparse model: the sparse strategy is skipped, the dense ones run.
    assert set(content["methods"]) == {"dense_a", "avg_emb", "avg_emb_0.5"}
    assert "sparse" not in content["retrieval"]
    cfg = BenchConfig(methods=("avg_emb_0.5", "code_arith", "paper"), max_grid=3)
    content = run_exclusion_bench(
        col,
        tmp_path / "sparse",
        KeywordEncoder(),
        item_coder=lambda x: model.encode(x, "image"),
        query_coder=sr_query_coder(model, vectors, mask="topk_or_bias"),
        word_vectors=vectors,
        config=cfg,
    )
    grid = content["tuning"]["grid"]["code_arith"]
    assert len(grid) == 3 and sum(bool(r.get("chosen")) for r in grid) == 1
    assert content["tuning"]["chosen"]["avg_emb_0.5"] == {}


def test_bench_config_errors(fixture, tmp_path) -> None:
    _, col, _, _ = fixture
    with pytest.raises(SparsemmError, match="tune split"):
        BenchConfig(split="train", tune_split="train")
    with pytest.raises(SparsemmError, match="unknown exclusion strategy"):
        run_exclusion_bench(col, tmp_path, KeywordEncoder(), config=BenchConfig(methods=("x",)))
    with pytest.raises(SparsemmError, match="no strategy left"):
        run_exclusion_bench(
            col, tmp_path, KeywordEncoder(), config=BenchConfig(methods=("code_a",))
        )


def test_tuning_skips_points_that_empty_the_ranking() -> None:
    rows = [
        {"ap@10": 0.80, "violation@10": 0.006},  # one violating slot more than the bar
        {"ap@10": 0.85, "violation@10": 0.040},
        {"ap@10": 0.01, "violation@10": 0.000},  # a filter that removed nearly everything
    ]
    # Bar 0.004: no usable point meets it, so the least violating usable one.
    assert _select(rows, 0.004, min_ap=0.45) == 0
    # Without the usability floor the degenerate point would win.
    assert _select(rows, 0.004) == 2
    # A point within the bar is still preferred.
    assert _select(rows, 0.01, min_ap=0.45) == 0
    assert _select(rows, 0.05, min_ap=0.45) == 1
    assert _select(rows, None) == 1


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


class ProjectedEncoder(KeywordEncoder):
    """The keyword encoder followed by a fixed projection: a dense space other than the
    collection's text space (as with an aligner over two backbones)."""

    def __init__(self, proj: np.ndarray) -> None:
        super().__init__()
        self.proj = proj
        self.dim = proj.shape[1]

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        return _unit(super().encode_text(texts) @ self.proj)


def test_dense_texts_as_a_function(fixture, tmp_path) -> None:
    _, col, _, _ = fixture
    proj = np.abs(np.random.default_rng(3).normal(size=(DIM, 7))).astype(np.float32)
    dense_items = _unit(col.image_embeddings() @ proj)
    all_texts = _unit(col.text_embeddings() @ proj)
    calls: list[np.ndarray] = []

    def dense_texts(rows: np.ndarray) -> np.ndarray:
        calls.append(rows.copy())
        return all_texts[rows]

    test_mask = col.split_mask("test")
    rows = np.flatnonzero(test_mask)
    # The function form gives the same table as every caption's vector, and is asked only
    # for the captions of the given items, in ascending order.
    table = retrieval_table(col, rows, dense_items[rows], None, None, dense_texts=dense_texts)
    assert table == retrieval_table(col, rows, dense_items[rows], None, None, dense_texts=all_texts)
    assert len(calls) == 1 and np.array_equal(calls[0], col.caption_rows(test_mask)[0])
    assert 0.0 < table["dense"]["t2i_AP@1"] <= 1.0

    # Through the benchmark: called once, for the evaluation items' captions.
    calls.clear()
    content = run_exclusion_bench(
        col,
        tmp_path / "fn",
        ProjectedEncoder(proj),
        config=BenchConfig(methods=("dense_a",), tune_split=None),
        dense_items=dense_items,
        dense_texts=dense_texts,
    )
    assert content["retrieval"] == table
    assert len(calls) == 1 and np.array_equal(calls[0], col.caption_rows(test_mask)[0])

    # Wrong shapes are refused with a message; a short array before the run starts.
    with pytest.raises(SparsemmError, match="dense_texts function returned"):
        retrieval_table(col, rows, dense_items[rows], None, None, dense_texts=lambda r: all_texts)
    with pytest.raises(SparsemmError, match="one row per caption"):
        run_exclusion_bench(
            col,
            tmp_path / "short",
            ProjectedEncoder(proj),
            config=BenchConfig(methods=("dense_a",), tune_split=None),
            dense_items=dense_items,
            dense_texts=all_texts[:-1],
        )
    assert not (tmp_path / "short").exists()
