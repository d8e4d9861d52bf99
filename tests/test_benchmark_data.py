"""The benchmarks' own query sets: the real-photo labels and queries are consistent, every
query parses, a third is held out; the COCO verification templates parse as intended."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sparsemm.query.parse import parse_query

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_real_photo_data_is_consistent() -> None:
    data = json.loads((BENCH / "data" / "real_photos.json").read_text(encoding="utf-8"))
    assert data["format"] == "sparsemm.real-photos"
    ids = [p["id"] for p in data["photos"]]
    assert len(ids) == len(set(ids)) >= 50
    for p in data["photos"]:
        assert p["source"] in data["sources"], p["id"]
        assert len(p["sha256"]) == 64 and p["labels"], p["id"]
    tags = {t for p in data["photos"] for t in p["labels"] + p.get("maybe", [])}
    tags |= set(data["implies"]) | {u for v in data["implies"].values() for u in v}
    queries = data["queries"]
    assert len(queries) >= 30
    held = [q for q in queries if q["split"] == "heldout"]
    assert abs(len(held) - len(queries) / 3) <= 1
    people = [
        q for q in queries if "person" in q["include"] + q["exclude"] or "people" in q["include"]
    ]
    assert len(people) >= 5 and sum(bool(q["exclude"]) for q in queries) >= 10
    for q in queries:
        assert set(q["include"]) | set(q["exclude"]) <= tags, q["text"]
        parsed = parse_query(q["text"])
        assert bool(parsed.exclude) == bool(q["exclude"]), q["text"]


def test_verification_templates_parse_as_intended() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import coco_concepts as cc
    finally:
        sys.path.remove(str(BENCH))
    for phrasings in cc.TEMPLATES.values():
        assert len(phrasings) == 3
    for tpl in cc.TEMPLATES["affirmation"]:
        q = parse_query(tpl.format(x="dog", y="cat", z="car"))
        assert not q.exclude and "dog" in " ".join(q.include)
    for tpl in cc.TEMPLATES["negation"]:
        q = parse_query(tpl.format(x="dog", y="cat", z="car"))
        assert q.exclude == ("cat",) and not q.include
    for tpl in cc.TEMPLATES["exclusion"]:
        q = parse_query(tpl.format(x="dog", y="cat", z="car"))
        assert q.exclude == ("cat",) and "dog" in " ".join(q.include)
    for tpl in cc.TEMPLATES["two objects"]:
        q = parse_query(tpl.format(x="dog", y="cat", z="car"))
        assert not q.exclude and "car" in " ".join(q.include)
    items = cc.verification_set([["dog", "car"], ["cat"]], [["a dog and a car"], ["a cat"]])
    assert len(items) == 1 and sum(c["true"] for c in items[0]["captions"]) == 1
    cats = cc.category_queries([["car", "dog"], ["bus"], ["dog"], ["car"]])
    assert any(q["a"] == "vehicle" and q["b"] == "car" for q in cats)
    assert all(q["relevant"] for q in cats)


@pytest.mark.parametrize("name", ["real_photos", "coco_concepts"])
def test_benchmark_scripts_import(name: str) -> None:
    sys.path.insert(0, str(BENCH))
    try:
        __import__(name)
    finally:
        sys.path.remove(str(BENCH))
