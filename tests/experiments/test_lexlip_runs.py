"""LexLIP offline runs end to end on tiny collections (tiny towers, fake text embeddings)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import pytest
from PIL import Image

from fakes import KeywordEncoder, tiny_lexlip_config
from sparsemm.data.collection import write_collection
from sparsemm_experiments.cli import bench_lexlip
from sparsemm_experiments.lexlip_runs import BM25_NAME, QUICK, run_lexlip_bench

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),  # tests/conftest.py
    pytest.mark.slow,  # LexLIP runs end to end (CONTRIBUTING.md)
]


WORDS = ("dog", "cat", "car", "tree", "ball", "bike")
FILLER = ("park", "street", "red", "small")
TEMPLATES = (
    "a {a} and a {b} in the {f}",
    "a {f} {a} near a {b}",
    "the {b} with a {a}",
    "a {a} on the {f}",
)

TINY = tiny_lexlip_config(max_text_len=12, queue_size=16)


def _items(n: int, seed: int, prefix: str, image_dir=None) -> list[dict]:
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        a, b = rng.choice(len(WORDS), 2, replace=False)
        labels = [WORDS[a], WORDS[b]] if rng.random() < 0.7 else [WORDS[a]]
        bword = labels[-1] if len(labels) == 2 else WORDS[(a + 1) % len(WORDS)]
        caps = [
            t.format(a=WORDS[a], b=bword, f=FILLER[rng.integers(len(FILLER))])
            for t in TEMPLATES[: 3 + (i % 2)]
        ]
        item = {
            "id": f"{prefix}{i}",
            "captions": caps,
            "labels": labels,
            "split": "test" if i % 3 == 0 else "train",
        }
        if image_dir is not None:
            path = image_dir / f"{prefix}{i}.png"
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
            item["image"] = str(path)
        items.append(item)
    return items


def _collection(path, items, image_dim: int | None = None):
    enc = KeywordEncoder(keywords=WORDS + FILLER)
    texts = [{"item": i, "text": c} for i, it in enumerate(items) for c in it["captions"]]
    temb = enc.encode_text([t["text"] for t in texts])
    views = np.zeros((len(items), enc.dim), dtype=np.float32)
    for t, e in zip(texts, temb, strict=True):
        views[t["item"]] += e
    views /= np.linalg.norm(views, axis=1, keepdims=True)
    if image_dim is None:
        return write_collection(
            path,
            items,
            {"name": enc.name, "dim": enc.dim},
            image_emb=views,
            text_emb=temb,
            texts=texts,
        )
    img = np.random.default_rng(1).normal(size=(len(items), image_dim)).astype(np.float32)
    return write_collection(
        path,
        items,
        {"name": "efficientnet", "dim": image_dim},
        image_emb=img / np.linalg.norm(img, axis=1, keepdims=True),
        text_emb=temb,
        texts=texts,
        text_encoder={"name": enc.name, "dim": enc.dim},
    )


@pytest.fixture(scope="module")
def collections(tmp_path_factory):
    root = tmp_path_factory.mktemp("lexlip-cols")
    coco = _collection(root / "coco", _items(48, 0, "c"))
    (root / "img").mkdir()
    collages = _collection(root / "collages", _items(12, 1, "g", root / "img"), image_dim=1280)
    return coco, collages


def test_runs_write_every_table(tmp_path, collections) -> None:
    coco, collages = collections
    cfg = dataclasses.replace(QUICK, base_model=TINY, limit_items=None, latency_queries=10)
    m = run_lexlip_bench(tmp_path / "out", coco, collages, cfg)
    assert set(m["settings"]) == {"coco", "collages"}
    for res in m["settings"].values():
        ret = res["retrieval"]
        for rep in ("LexLIP (lexicon, sparse)", "LexLIP-Dense ([CLS])"):
            assert 0.0 <= ret[rep]["t2i_R@1"] <= ret[rep]["t2i_R@10"] <= 1.0
        assert ret["LexLIP (lexicon, sparse)"]["nnz_item"] > 0
        assert "BM25 captions (leave-one-out)" in ret
        ex = res["exclusion"]
        means = ex["subsets"]["all"]["means"]
        assert BM25_NAME in means and "LexLIP: code_a" in means
        assert "LexLIP-Dense: avg_emb_0.5" in means
        assert ex["n_queries"] > 0
        assert 0.0 <= means[BM25_NAME]["ap@10"] <= 1.0
        assert BM25_NAME in ex["subsets"]["all"]["p_values"]
    # The exclusion run's retrieval table scores the test captions in LexLIP-Dense's space
    # (encoded on demand for just those captions).
    for name in ("coco", "collages"):
        lex = json.loads(
            (tmp_path / "out" / name / "exclusion-lexlip" / "metrics.json").read_text()
        )
        dense = lex["retrieval"]["dense"]
        assert 0.0 < dense["t2i_AP@1"] <= dense["t2i_AP@10"] <= 1.0
        assert 0.0 < dense["i2t_AP@10"] <= 1.0
    export = m["settings"]["coco"]["export"]
    n_test = sum(it["split"] == "test" for it in coco.items)
    assert export["validated_anserini_docs"] == n_test == export["validated_es_docs"]
    ls = m["large_scale"]
    assert ls["pool"] == {"items": 60, "coco": 48, "collages": 12}
    assert set(ls["index_agreement_top10"].values()) == {1.0}
    assert ls["latency"]["LexLIP (inverted index)"]["p50_ms"] > 0
    assert ls["sizes"]["LexLIP (inverted index)"]["bytes"] > 0
    out = tmp_path / "out"
    report = (out / "report.md").read_text()
    assert "## coco" in report and "## collages" in report and BM25_NAME in report
    assert "Large-scale pool" in report
    assert json.loads((out / "config.json").read_text())["git_commit"]
    for line in (out / "coco" / "export" / "anserini" / "docs" / "docs.jsonl").open():
        assert set(json.loads(line)) == {"id", "contents", "vector"}
    # A second run reuses the trained models.
    cheap = dataclasses.replace(cfg, methods=("dense_a", "code_a"), latency_queries=3)
    again = run_lexlip_bench(tmp_path / "out", coco, None, cheap)
    assert again["settings"]["coco"]["model"]["train_seconds"] is None
    assert again["large_scale"]["pool"]["collages"] == 0


def test_cli_quick_run(tmp_path, collections) -> None:
    coco, _ = collections
    parser = argparse.ArgumentParser()
    benches = parser.add_subparsers(dest="bench")
    bench_lexlip.register_bench(benches)
    args = parser.parse_args(
        [
            "lexlip",
            "-o",
            str(tmp_path / "q"),
            "--collection",
            str(coco.root),
            "--no-collages",
            "--quick",
            "--no-progress",
        ]
    )
    assert args.func(args) == 0
    m = json.loads((tmp_path / "q" / "metrics.json").read_text())
    assert m["settings"]["coco"]["model"]["config"]["text_init"] == "minilm"
    assert (tmp_path / "q" / "report.md").is_file()
