"""The sentence negation benchmark: families, builder, parse truth, the CLI quick mode, and
the served path equal to the measured one."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_bench import _collection, _run_cli

from sparsemm.cli.main import main
from sparsemm.models.sr import SRConfig
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.strategies import ExclusionContext, ReferenceSet, sr_query_coder
from sparsemm.query.strategies.ranking import rank_query
from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection, train_sr
from sparsemm_experiments.eval.bench import captions_by_item
from sparsemm_experiments.eval.negation import (
    DENSE_CAPTION,
    DENSE_RAW,
    FAMILIES,
    SERVED,
    build_negation_queries,
    parse_all,
    parse_matches,
    plural,
)

LABELS = [["dog", "person"], ["cat"], ["car", "person"], ["dog", "tree"], ["bench"]] * 8
CAPTIONS = [
    ["A dog runs on the grass with a man", "Two people walk a dog"],
    ["A cat sleeping on a sofa", 'A "lazy cat on a couch'],
    ["A red car parked on a street", "People standing next to a car"],
    ["A dog is lying under a tree", "A brown dog sits near a tree"],
    ["An empty bench in a park", "A wooden bench is standing in the sun"],
] * 8


def test_families_cover_the_cues_and_are_split() -> None:
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names)) >= 30
    groups = {f.group for f in FAMILIES}
    assert groups == {"tune", "heldout"}
    assert sum(f.group == "heldout" for f in FAMILIES) >= 10
    assert any(f.person for f in FAMILIES if f.group == "tune")
    assert any(f.person for f in FAMILIES if f.group == "heldout")
    assert plural("person") == "people" and plural("bus") == "buses"
    assert plural("dining table") == "dining tables" and plural("knife") == "knives"


def test_builder_truth_and_parse() -> None:
    queries = build_negation_queries(CAPTIONS, LABELS, per_item=3, seed=0)
    again = build_negation_queries(CAPTIONS, LABELS, per_item=3, seed=0)
    assert [q.text for q in queries] == [q.text for q in again]  # deterministic
    assert len(queries) >= 100
    for q in queries:
        assert not set(q.objects) & set(LABELS[q.item])  # the negated object is absent
        assert "empty" not in q.caption  # captions with a negation of their own are skipped
    parsed, ok = parse_all(queries)
    assert ok.mean() >= 0.95, [q.text for q, good in zip(queries, ok, strict=True) if not good]
    assert all(p is not None for p in parsed)  # a stray quote is not refused
    assert parse_matches(parse_query("A dog, no cats."), Query(("a dog",), ("cat",)))
    assert not parse_matches(parse_query("A dog, no cats."), Query(("a dog",), ("car",)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("negation")
    col = _collection(root / "collection")
    image, text, pair_item, bias = sr_pairs_from_collection(col, col.split_mask("train"), None)
    cfg = SRConfig(text_dim=image.shape[1], image_dim=image.shape[1], latent_dim=24, top_k=6)
    model, _ = train_sr(image, text, pair_item, bias, cfg, root / "sr", SRTrainConfig(epochs=2),
                        progress=False)  # fmt: skip
    from sparsemm.models.detectors import DetectorConfig
    from sparsemm.train.detectors import fit_model_detectors

    fit_model_detectors(model, root / "sr", col, "train", DetectorConfig(min_mentions=2))
    return root


def test_cli_quick(trained, capsys) -> None:
    out = trained / "report"
    argv = ["bench", "negation", "--collection", str(trained / "collection")]
    argv += ["--sr", str(trained / "sr"), "-o", str(out), "--quick", "--tune"]
    argv += ["--methods", "match", "hybrid", "dense_a", "code_arith", "avg_emb_0.5"]
    assert _run_cli(argv) == 0
    printed = capsys.readouterr().out
    assert "held-out families" in printed and "parse exact match" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["subsets"]) == {"all", "tune families", "held-out families"}
    means = metrics["subsets"]["all"]["means"]
    assert {DENSE_RAW, DENSE_CAPTION, SERVED, "parse + hybrid"} <= set(means)
    for row in means.values():
        assert 0.0 <= row["recall@1"] <= row["recall@5"] <= row["recall@10"] <= 1.0
    assert means[SERVED] == means["parse + match"]
    assert metrics["parse"]["exact_match"]["all"] >= 0.9
    assert metrics["tuning"]["chosen"] and metrics["tuning"]["grid"]
    lines = (out / "queries.jsonl").read_text().splitlines()
    assert len(lines) == metrics["subsets"]["all"]["n_queries"]
    assert "## Parse exact match" in (out / "report.md").read_text()
    assert (out / "plot_held-out_families.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_ranking_equals_benchmark_ranking(trained, capsys) -> None:
    """The served path is the measured path: `sparsemm search` returns the ranking that
    rank_query (the benchmarks' ranking function) gives for the same query and items."""
    from test_bench import KeywordEncoder

    from sparsemm.data.collection import open_collection
    from sparsemm.models.detectors import ConceptDetectors
    from sparsemm.models.sr import SRModel

    col_dir = trained / "collection"
    assert main(["index", str(col_dir), "--model", str(trained / "sr")]) == 0
    capsys.readouterr()
    col = open_collection(col_dir)
    model = SRModel.from_pretrained(trained / "sr")
    codes = model.encode(col.image_embeddings(), "image")
    captions = captions_by_item(col)
    ctx = ExclusionContext(
        col.image_embeddings(),
        codes,
        KeywordEncoder(),
        sr_query_coder(model),
        ReferenceSet(captions, col.image_embeddings(), codes),
        detectors=ConceptDetectors.for_model(trained / "sr"),
    )
    for text in ("a dog in the park, but there is no cat in sight", "dog but not car", "no tree"):
        assert main(["search", str(col_dir), text, "-k", "5", "--json"]) == 0
        served = [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
        rows, _ = rank_query(ctx, parse_query(text), "match", k=5)
        assert served == [col.ids[int(r)] for r in rows]
        assert np.all(np.diff(_) <= 1e-9)
