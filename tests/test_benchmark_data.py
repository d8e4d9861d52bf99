"""The benchmarks' own query sets: the real-photo labels and queries are consistent, every
query parses, a third is held out; the Debian photo pool is well-formed; the COCO
verification templates parse as intended."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
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


def _bench(name: str) -> Any:
    """The benchmark script module ``name`` (benchmarks/NAME.py), imported from there."""
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def _closure(tags: list[str], implies: dict[str, list[str]]) -> set[str]:
    """benchmarks/real_photos.py's closure: labels plus all they imply."""
    return _bench("real_photos").closure(tags, implies)


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


def _pool_problems(pool: dict, taken_ids: set[str]) -> list[str]:
    """What is wrong with a hand-labelled photo pool (real-photos format, no photos needed)."""
    closure = _bench("real_photos").closure
    problems = []
    if pool.get("format") != "sparsemm.real-photos":
        problems.append("format")
    imp = pool["implies"]
    for key, targets in imp.items():
        if key in closure(targets, imp):
            problems.append(f"implies cycle through {key!r}")
    for name, src in pool["sources"].items():
        if src.get("kind") != "deb" or src.get("package") != name:
            problems.append(f"source {name}: kind/package")
        if not src.get("version") or not src.get("licence"):
            problems.append(f"source {name}: version/licence")
    word = re.compile(r"[a-z][a-z ]*[a-z]")
    ids = [p["id"] for p in pool["photos"]]
    if len(ids) != len(set(ids)):
        problems.append("duplicate ids")
    if set(ids) & taken_ids:
        problems.append(f"ids already used: {sorted(set(ids) & taken_ids)}")
    shas = [p["sha256"] for p in pool["photos"]]
    if len(shas) != len(set(shas)):
        problems.append("the same photo twice")
    for p in pool["photos"]:
        pid, labels, maybe = p["id"], p["labels"], p.get("maybe", [])
        if p["source"] not in pool["sources"]:
            problems.append(f"{pid}: unknown source")
        if not re.fullmatch(r"[0-9a-f]{64}", p["sha256"]) or p["bytes"] <= 0:
            problems.append(f"{pid}: sha256/bytes")
        if p["path"].startswith("/") or ".." in p["path"].split("/"):
            problems.append(f"{pid}: path")
        if not all(word.fullmatch(t) for t in labels + maybe):
            problems.append(f"{pid}: a label that is not a lower-case word")
        if labels != sorted(set(labels)) or maybe != sorted(set(maybe)):
            problems.append(f"{pid}: labels not sorted and unique")
        if closure(labels, imp) != set(labels):
            problems.append(f"{pid}: labels miss {sorted(closure(labels, imp) - set(labels))}")
        if set(maybe) & set(labels):
            problems.append(f"{pid}: labelled both sure and maybe")
        if not {"indoor", "outdoor"} & set(labels + maybe) or {"indoor", "outdoor"} <= set(labels):
            problems.append(f"{pid}: not exactly one of indoor/outdoor")
    return problems


def test_debian_photo_pool_is_well_formed() -> None:
    data = BENCH / "data"
    pool = json.loads((data / "photo_pool_deb.json").read_text(encoding="utf-8"))
    real = json.loads((data / "real_photos.json").read_text(encoding="utf-8"))
    assert pool["queries"] == []
    assert 50 <= len(pool["photos"]) <= 120
    assert len({p["source"] for p in pool["photos"]}) >= 5
    real_ids = {p["id"] for p in real["photos"]}
    assert not {p["sha256"] for p in pool["photos"]} & {p["sha256"] for p in real["photos"]}
    assert _pool_problems(pool, real_ids) == []


def test_pool_check_finds_broken_entries() -> None:
    pool = json.loads((BENCH / "data" / "photo_pool_deb.json").read_text(encoding="utf-8"))
    first = pool["photos"][0]
    dog = {"id": "x-dog", "source": first["source"], "path": "a/b.jpg", "labels": ["dog"]}
    dog |= {"maybe": [], "sha256": "0" * 64, "bytes": 5}
    broken = dict(pool, photos=[first, dict(first), dog, dict(dog, id="x-2", source="nowhere")])
    found = "\n".join(_pool_problems(broken, {first["id"]}))
    assert "duplicate ids" in found and "ids already used" in found
    assert "the same photo twice" in found and "x-2: unknown source" in found
    assert "x-dog: labels miss ['animal']" in found
    assert "x-dog: not exactly one of indoor/outdoor" in found


def test_verification_templates_parse_as_intended() -> None:
    cc = _bench("coco_concepts")
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
    # objects as annotated: a label no caption names is a present object too
    labels, caps = [["dog", "cup"], ["cat"]], [["a dog on a rug"], ["a cat"]]
    assert cc.verification_set(labels, caps, objects="named") == []
    (row,) = cc.verification_set(labels, caps, objects="annotated")
    assert sorted(row["present"]) == ["cup", "dog"] and row["absent"] == "cat"
    assert dict(zip(row["present"], row["named"], strict=True)) == {"dog": True, "cup": False}
    cats = cc.category_queries([["car", "dog"], ["bus"], ["dog"], ["car"]])
    assert any(q["a"] == "vehicle" and q["b"] == "car" for q in cats)
    assert all(q["relevant"] for q in cats)


def test_photo_verification_rows_and_accuracy() -> None:
    pv = _bench("photo_verification")
    photo = {"source": "s", "maybe": []}
    labels = [["dog", "grass", "animal"], ["dog", "animal"], ["car", "apple"], ["apple", "grass"]]
    labels += [["dog", "animal", "car", "grass", "apple", "outdoor"]]
    data = {
        "implies": {"dog": ["animal"]},
        "photos": [{**photo, "id": f"p{i}", "labels": labs} for i, labs in enumerate(labels)],
    }
    rows = pv.verification_rows(data, {f"p{i}" for i in range(5)})
    assert rows and all(sum(c["true"] for c in r["captions"]) == 1 for r in rows)
    for r in rows:
        shown = set(labels[int(r["photo"][1:])]) | {"animal"}
        assert set(r["present"]) <= shown and r["absent"] not in shown
        assert {"dog", "animal"} != set(r["present"])  # one implies the other
        assert "outdoor" not in r["present"] and "a apple" not in str(r["captions"])
    queries = pv.caption_queries(rows)
    assert len({q["text"] for q in queries}) == len(queries)
    # a scorer that knows the truth gets every row right; one that reads every caption
    # the same gets the first caption (the affirmation) right only when it is the true one
    truth = {q["text"]: {} for q in queries}
    for r in rows:
        for c in r["captions"]:
            truth[c["text"]][r["photo"]] = 1.0 if c["true"] else 0.0
    assert pv.accuracy(rows, truth, {})["overall"] == 1.0
    flat = pv.accuracy(rows, {}, {})
    assert flat.get("two objects", 0.0) == 0.0 and flat.get("affirmation", 1.0) == 1.0
    refused = pv.accuracy(rows, truth, {rows[0]["captions"][0]["text"]: "no"})
    assert refused["refused_rows"] >= 1 and refused["rows"] == len(rows) - refused["refused_rows"]


@pytest.mark.parametrize(
    "name",
    [
        "real_photos",
        "coco_concepts",
        "coco_calibration",
        "exclude_caution",
        "photo_calibration",
        "photo_verification",
        "people",
        "fresh_photos",
    ],
)
def test_benchmark_scripts_import(name: str) -> None:
    _bench(name)


def test_no_photo_is_in_two_labelled_files() -> None:
    """The query set and the pools are judged apart (leave one source out): a photo, or a
    package, in two files would be a source the fit has seen."""
    shas: dict[str, str] = {}
    packages: dict[str, str] = {}
    for path in sorted((BENCH / "data").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != "sparsemm.real-photos":
            continue
        for p in data["photos"]:
            assert p["sha256"] not in shas, f"{p['id']} of {path.name} is in {shas[p['sha256']]}"
            shas[p["sha256"]] = path.name
        for name, src in data["sources"].items():
            if src["package"] in packages and packages[src["package"]] != path.name:
                # one package may give photos to two files only as one source name
                assert (
                    name
                    in json.loads((BENCH / "data" / packages[src["package"]]).read_text())[
                        "sources"
                    ]
                ), f"{src['package']} is a source of {path.name} and {packages[src['package']]}"
            packages.setdefault(src["package"], path.name)


def _synthetic_pairs(pc: Any, e_whole: Any, e_region: Any) -> Any:
    """photo_calibration.Pairs of one word and one source, one photo a pair, labels 0 (the
    tests draw them), with the given whole-photo and tile evidence."""
    n = len(e_whole)
    zeros = np.zeros(n)
    return pc.Pairs(
        word=np.array(["w"] * n), photo=np.arange(n).astype(str), source=np.array(["s"] * n),
        y=zeros, e_whole=e_whole, e_region=e_region, face=zeros, broader=zeros.astype(int),
    )  # fmt: skip


def test_the_calibration_fit_recovers_a_known_calibration() -> None:
    """photo_calibration.fit on pairs drawn from a known presence calibration finds it
    again, its reliability table has a small ECE, and a poor calibration a large one."""
    import numpy as np

    pc = _bench("photo_calibration")
    rng = np.random.default_rng(0)
    n = 20_000
    e_w = rng.beta(0.4, 2.0, n)
    e_r = np.clip(e_w + rng.beta(0.3, 3.0, n), 0, 1)
    pairs = _synthetic_pairs(pc, e_w, e_r)
    p_true = pc.predict(pairs, 0.8, 0.5, 0.5)
    pairs.y = (rng.random(n) < p_true).astype(int)
    got = pc.fit(pairs, (0.0, 0.5, 1.0))
    assert got["lam"] == 0.5 and abs(got["a"] - 0.8) < 0.1 and abs(got["b"] - 0.5) < 0.15
    assert pc.reliability(pairs.y, p_true)["ece"] < 0.02
    assert pc.reliability(pairs.y, np.clip(p_true + 0.2, 0, 1))["ece"] > 0.15
    assert pc.auc(pairs.y, p_true) > 0.7


def test_the_busy_photo_variant_recovers_a_no_evidence_rate() -> None:
    """photo_busy's "P for no evidence, by tile classes" finds the rate of a thing with no
    evidence growing with the photo's tile classes, where the served form keeps it at 0."""
    import numpy as np

    pb, pc = _bench("photo_busy"), _bench("photo_calibration")
    rng = np.random.default_rng(1)
    n = 20_000
    busy = rng.integers(0, 30, n).astype(float)
    e_w = np.where(rng.random(n) < 0.3, rng.beta(0.5, 2.0, n), 0.0)
    zeros = np.zeros(n)
    pairs = _synthetic_pairs(pc, e_w, zeros)
    f = {"n_region": busy, "n_whole": zeros, "top": zeros}
    floor = 1 / (1 + np.exp(-(-4.0 + 0.6 * np.log1p(busy))))
    p_true = np.where(e_w > 0, pc.predict(pairs, 0.8, 0.5, 0.25), floor)
    pairs.y = (rng.random(n) < p_true).astype(int)
    spec = pb.VARIANTS["+ P for no evidence, by tile classes"]
    got = pb.apply_v(pairs, f, pb.fit_v(pairs, f, spec), spec)
    none = e_w == 0
    assert abs(got[none & (busy > 20)].mean() - floor[none & (busy > 20)].mean()) < 0.01
    assert got[none & (busy > 20)].mean() > got[none & (busy < 3)].mean() + 0.01
    served = pb.apply_v(
        pairs, f, pb.fit_v(pairs, f, pb.VARIANTS[next(iter(pb.VARIANTS))]), {"lam": 0.25}
    )
    assert (served[none] == 0).all()
    assert pc.reliability(pairs.y, got)["ece"] < pc.reliability(pairs.y, served)["ece"]


def test_the_leftout_variants_are_fitted_held_out_and_counted_by_breadth() -> None:
    """leftout_breadth fits a variant on the other groups and predicts each group: on pairs
    drawn from the served form it finds the served scale and bias again; its figures count
    misses and false alarms, per breadth of word, as defined."""
    lb, pc = _bench("leftout_breadth"), _bench("photo_calibration")
    rng = np.random.default_rng(2)
    n = 20_000
    e = np.where(rng.random(n) < 0.5, rng.beta(0.5, 2.0, n), 0.0)
    pairs = _synthetic_pairs(pc, e, np.zeros(n))
    p_true = pc.predict(pairs, 0.4, 0.9, 0.0)
    pairs.y = (rng.random(n) < p_true).astype(int)
    groups = np.array(["a", "b"])[rng.integers(0, 2, n)]
    x, has = lb._design([e], None)
    held, params = lb.held_out(pairs, x, has, groups, 1.0)
    assert abs(params[0] - 0.4) < 0.1 and abs(params[1] - 0.9) < 0.2
    assert (held[e == 0] == 0).all() and np.abs(held - p_true).mean() < 0.02
    y = np.array([1, 1, 0, 0, 0])
    p = np.array([0.1, 0.6, 0.7, 0.2, 0.9])
    f = lb.figures(y, p, np.array([1, 1, 1, 60, 60]), 10.0)
    assert f["missed_below_0.2"] == 0.5 and f["missed_below_0.5"] == 0.5
    assert f["absent_above_0.5"] == round(2 / 3, 4)
    assert f["absent_above_0.5_classes_1-1"] == 1.0
    assert f["absent_above_0.5_classes_50-10000"] == 0.5


def test_calibration_measures() -> None:
    cal = _bench("coco_calibration")
    rng = np.random.default_rng(0)
    p = rng.uniform(size=20000)
    y = (rng.uniform(size=p.size) < p).astype(float)  # calibrated by construction
    assert cal.ece(p, y) < 0.02
    assert cal.ece(np.clip(p + 0.2, 0, 1), y) > 0.15  # biased towards presence
    assert cal.auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])) == 1.0
    assert cal.auc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5
    bins = cal.reliability(p, y)
    assert sum(b["pairs"] for b in bins) == p.size and len(bins) == 10


# The packages kept for independent evaluation, by the first 16 hex digits of the SHA-256 of
# their name (lower case, "-" as "_"), so that this repository does not name them.
RESERVED_SHA256 = {
    "8649a47233ef1f74", "5a9cb6b54ea56d52", "3be1f262a796bb1f", "7495cd27ef931bcb",
    "e273bfd499423abd", "09c1d4bbb0e16dd4", "6e833b8d44be2cca", "8c3688a8ca5276a7",
    "bd2f88bbd9e6cab6", "7a6e051d8493c773",
}  # fmt: skip


def reserved(package: str) -> bool:
    """Whether ``package`` is one of the packages kept for independent evaluation."""
    key = package.lower().replace("-", "_").encode("utf-8")
    return hashlib.sha256(key).hexdigest()[:16] in RESERVED_SHA256


def test_fresh_photos_are_fresh_and_well_formed() -> None:
    """photo_fresh.json: read by no calibration fit (not among data_files()), sharing no
    package or photo with the files that are, no reserved package; ids, checksums, labels
    closed under implies, indoor/outdoor; its queries all of split fresh and readable."""
    rp, fp = _bench("real_photos"), _bench("fresh_photos")
    path = BENCH / "data" / "photo_fresh.json"
    assert path not in rp.data_files() and path.name == fp.FRESH.name
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "sparsemm.real-photos" and data["version"] == 1
    fitted = rp.load_all(rp.data_files())
    assert fp.overlap(rp.load_all([path]), fitted) == []
    photos, sources, implies = data["photos"], data["sources"], data["implies"]
    assert 40 <= len(photos) <= 80 and len({p["source"] for p in photos}) >= 6
    assert {p["source"] for p in photos} == set(sources)
    for name, src in sources.items():
        assert src["kind"] in ("deb", "pypi") and src["package"] == name, name
        assert src["version"] and src["licence"], name
        assert not reserved(name), name
    ids = [p["id"] for p in photos]
    assert len(ids) == len(set(ids)) and not set(ids) & {p["id"] for p in fitted["photos"]}
    assert len({p["sha256"] for p in photos}) == len(photos)
    word = re.compile(r"[a-z][a-z ]*[a-z]")
    for p in photos:
        labels, maybe = p["labels"], p["maybe"]
        assert re.fullmatch(r"[0-9a-f]{64}", p["sha256"]) and p["bytes"] > 0, p["id"]
        assert not p["path"].startswith("/") and ".." not in p["path"].split("/"), p["id"]
        assert all(word.fullmatch(t) for t in labels + maybe), p["id"]
        assert labels == sorted(set(labels)) and maybe == sorted(set(maybe)), p["id"]
        assert rp.closure(labels, implies) == set(labels) and not set(maybe) & set(labels)
        assert len({"indoor", "outdoor"} & set(labels)) == 1 or {"indoor", "outdoor"} <= set(
            maybe
        ), p["id"]
    tags = {t for p in photos for t in p["labels"] + p["maybe"]}
    queries = data["queries"]
    assert 20 <= len(queries) <= 40 and {q["split"] for q in queries} == {"fresh"}
    assert len({q["id"] for q in queries}) == len(queries)
    assert sum(bool(q["exclude"]) for q in queries) >= 8
    for q in queries:
        assert set(q["include"]) | set(q["exclude"]) <= tags, q["text"]
        assert bool(parse_query(q["text"]).exclude) == bool(q["exclude"]), q["text"]
        # a photo sure to show a named thing is never left out through a maybe-label
        for p in photos:
            named = set(q["include"]) | set(q["exclude"])
            assert not rp.closure(p["maybe"], implies) & named & set(p["labels"]), p["id"]


def test_fresh_overlap_and_presence_figures() -> None:
    fp = _bench("fresh_photos")
    fitted = {
        "sources": {"a": {"package": "pkg-a"}},
        "photos": [{"id": "x", "sha256": "1" * 64}],
    }
    clean = {"sources": {"b": {"package": "pkg-b"}}, "photos": [{"id": "y", "sha256": "2" * 64}]}
    assert fp.overlap(clean, fitted) == []
    shared = {
        "sources": {"a2": {"package": "pkg-a"}},
        "photos": [{"id": "z", "sha256": "1" * 64}],
    }
    assert fp.overlap(shared, fitted) == ["package pkg-a", "photo z"]
    y = np.array([1, 1, 0, 0, 0])
    p = np.array([0.9, 0.0, 0.6, 0.1, 0.0])
    m = fp.presence(y, p)
    assert m["positives"] == 2 and m["labelled_above_half"] == 0.5
    assert m["absent_above_half"] == round(1 / 3, 4) and m["labelled_at_zero"] == 0.5
    assert m["auc"] == pc_auc(y, p)
    rng = np.random.default_rng(0)
    p = rng.beta(0.5, 4.0, 4000)
    photo = np.repeat(np.arange(400), 10).astype(str)
    calibrated = fp.presence((rng.random(p.size) < p).astype(int), p, photo, draws=50)
    low, high = calibrated["ece_90"]
    assert calibrated["ece"] < 0.03 and low <= high < 0.05
    assert abs(calibrated["ece"] - calibrated["ece_calibrated_floor"]) < 0.02
    biased = fp.presence((rng.random(p.size) < np.clip(p + 0.2, 0, 1)).astype(int), p, photo, 50)
    assert biased["ece"] > 0.15 > biased["ece_calibrated_floor"]
    assert biased["ece_90"][0] > high


def pc_auc(y: np.ndarray, p: np.ndarray) -> float | None:
    return _bench("photo_calibration").auc(y, p)


def test_the_reserved_check_knows_a_reserved_package() -> None:
    assert reserved("scratch") and reserved("Scratch") and not reserved("mate-backgrounds")
