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


def _closure(tags: list[str], implies: dict[str, list[str]]) -> set[str]:
    out, todo = set(tags), list(tags)
    while todo:
        for u in implies.get(todo.pop(), []):
            if u not in out:
                out.add(u)
                todo.append(u)
    return out


def test_photo_pool_is_well_formed() -> None:
    """The second labelled pool: unique ids and files that clash with nothing in the first,
    known sources, checksums, labels closed under implies, indoor/outdoor on every photo."""
    first = json.loads((BENCH / "data" / "real_photos.json").read_text(encoding="utf-8"))
    data = json.loads((BENCH / "data" / "photo_pool_pypi.json").read_text(encoding="utf-8"))
    assert data["format"] == "sparsemm.real-photos" and data["version"] == 1
    assert data["queries"] == []
    photos, sources, implies = data["photos"], data["sources"], data["implies"]
    ids = [p["id"] for p in photos]
    assert len(ids) == len(set(ids)) >= 80
    assert not set(ids) & {p["id"] for p in first["photos"]}
    shas = [p["sha256"] for p in photos]
    assert len(shas) == len(set(shas)) and not set(shas) & {p["sha256"] for p in first["photos"]}
    taken = {(first["sources"][p["source"]]["package"], p["path"]) for p in first["photos"]}
    for name, src in sources.items():
        assert src["kind"] in ("pypi", "deb") and src["package"] and src["version"], name
        assert src["licence"] and ("module" not in src or src["kind"] == "pypi"), name
    assert {p["source"] for p in photos} == set(sources) and len(sources) >= 5
    assert all(isinstance(v, list) and all(isinstance(u, str) for u in v) for v in implies.values())
    for p in photos:
        assert p["source"] in sources, p["id"]
        assert (sources[p["source"]]["package"], p["path"]) not in taken, p["id"]
        assert len(p["sha256"]) == 64 and set(p["sha256"]) <= set("0123456789abcdef"), p["id"]
        assert isinstance(p["bytes"], int) and p["bytes"] > 0, p["id"]
        assert Path(p["path"]).suffix.lower() in {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
        labels, maybe = p["labels"], p["maybe"]
        assert labels == sorted(set(labels)) and maybe == sorted(set(maybe)), p["id"]
        assert _closure(labels, implies) == set(labels), p["id"]
        assert not set(maybe) & set(labels), p["id"]
        assert _closure(maybe, implies) <= set(maybe) | set(labels), p["id"]
        assert len({"indoor", "outdoor"} & set(labels)) == 1 or {"indoor", "outdoor"} <= set(
            maybe
        ), p["id"]


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
