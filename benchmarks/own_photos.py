"""The caption-free ImageNet concept model (``sparsemm up``'s default) on real pixels.

Two measurements, both through the code paths a user runs (``sparsemm up``'s folder sync,
``build_index``, ``Searcher.search``):

1. scikit-image sample photos, copied into a folder: hand-checked queries with the photo(s)
   that must come first, including exclusions and terms ImageNet has no class for;
2. Fashion-MNIST collages (``sparsemm demo``'s data; test split): every ordered label pair
   (A, B) with at least one collage holding both, relevant = collages with A and without B
   (the label-pair protocol of docs/negation.md); AP@10, violation@10, inclusion@10 for the
   ``hybrid`` (default) and ``filter`` strategies, and the single-label P@10.

    python benchmarks/own_photos.py -o runs/own-photos [--collages 300]

Writes config.json, metrics.json (with the git commit) and prints the figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import git_commit

from sparsemm.errors import SparsemmError
from sparsemm.io import write_json
from sparsemm_experiments.eval.metrics import (
    ap_at_k,
    inclusion_at_k,
    precision_at_k,
    violation_at_k,
)

# scikit-image sample photos (natural photographs only; textures, micrographs and
# drawings are left out) and the file each is saved as
SKIMAGE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "clock", "coins")

# (query, photos that must rank first (any order), photos that must not be in the top 3,
# whether the model should refuse the query: a term with no ImageNet class is an error, not
# a guess). Hand-checked against the pictures: astronaut = Eileen Collins in a flight suit
# before a flag, coffee = a cup of coffee on a saucer, chelsea = a tabby cat, rocket = a
# launch vehicle on its pad, camera = a man behind a camera on a tripod, clock = a wall
# clock, coins = old coins on a cloth.
SKIMAGE_QUERIES: tuple[tuple[str, tuple[str, ...], tuple[str, ...], bool], ...] = (
    ("cat", ("chelsea",), (), False),
    ("coffee", ("coffee",), (), False),
    ("a cup", ("coffee",), (), False),
    ("rocket", ("rocket",), (), False),
    ("camera", ("camera",), (), False),
    ("tripod", ("camera",), (), False),
    ("clock", ("clock",), (), False),
    ("coins", ("coins",), (), False),  # ImageNet has no coin class
    ("astronaut", ("astronaut",), (), False),  # nor an astronaut one
    ("a cat but not a dog", ("chelsea",), (), False),
    ("coffee but not a cat", ("coffee",), ("chelsea",), False),
    ("a clock without coins", ("clock",), ("coins",), False),
    ("a cat but not a tabby", (), ("chelsea",), False),  # Chelsea *is* a tabby
    ("a rocket without a missile", (), ("rocket",), False),  # the model sees a missile
    ("person", (), (), True),  # ImageNet has no person class
    ("a man but no camera", (), (), True),
)
STRATEGIES = ("hybrid", "filter")


def skimage_folder(out: Path) -> Path:
    import skimage.data
    from PIL import Image

    folder = out / "skimage-photos"
    folder.mkdir(parents=True, exist_ok=True)
    for name in SKIMAGE_PHOTOS:
        if (folder / f"{name}.jpg").is_file():  # kept: a re-run re-encodes nothing
            continue
        arr = np.asarray(getattr(skimage.data, name)())
        Image.fromarray(arr).convert("RGB").save(folder / f"{name}.jpg", quality=92)
    return folder


def up(
    folder: Path, out: Path, model_dir: Path | None = None, extra: tuple[str, ...] = ()
) -> tuple[Path, float]:
    """What ``sparsemm up FOLDER -o OUT --no-serve [extra]`` does, timed."""
    from sparsemm.cli.main import main

    t0 = time.perf_counter()
    args = ["up", str(folder), "-o", str(out), "--no-serve", "--no-progress", *extra]
    if model_dir is not None:
        args += ["--model", str(model_dir)]
    if main(args) != 0:
        raise SystemExit("sparsemm up failed")
    return out / "collection", time.perf_counter() - t0


def run_skimage(out: Path) -> dict[str, Any]:
    from sparsemm.query.searcher import Searcher

    col, seconds = up(skimage_folder(out), out / "skimage-up")
    searcher = Searcher(col)
    result: dict[str, Any] = {"seconds_up": seconds}
    for strategy in STRATEGIES:
        rows = []
        for query, first, banned, refuse in SKIMAGE_QUERIES:
            hits, why = [], ""
            try:
                hits = searcher.search(query, k=3, strategy=strategy)
            except SparsemmError as exc:  # a term the model has no class for
                why = str(exc)
            top = [h.id.removesuffix(".jpg") for h in hits]
            if refuse:
                passed = bool(why)
            else:
                passed = (
                    not why and set(top[: len(first)]) == set(first) and not set(top) & set(banned)
                )
            concepts = ""
            if hits:
                concepts = ", ".join(
                    c.words[0] if c.words else str(c.dim) for c in hits[0].matched[:3]
                )
            rows.append(
                {
                    "query": query,
                    "expected_first": list(first),
                    "must_not_top3": list(banned),
                    "refuse": refuse,
                    "top3": top,
                    "top1_concepts": concepts,
                    "pass": passed,
                    "error": why,
                }
            )
        result[strategy] = {"queries": rows, "passed": sum(r["pass"] for r in rows)}
    return result


# Words people type when searching their photos: which ImageNet classes each maps to.
COMMON_WORDS = (
    "dog", "cat", "bird", "horse", "car", "bicycle", "boat", "plane", "train", "beach",
    "mountain", "snow", "flower", "tree", "food", "pizza", "coffee", "cake", "phone",
    "computer", "book", "guitar", "church", "bridge", "house", "kitchen", "street",
    "sunset", "person", "baby", "child", "wedding", "party", "selfie",
)  # fmt: skip


def run_vocabulary(model_dir: Path) -> dict[str, list[str]]:
    """Each common word's query code: its top classes, or [] when it maps to none."""
    from sparsemm.encoders.base import get_encoder
    from sparsemm.models.concepts import ImageNetConceptModel

    model = ImageNetConceptModel.from_pretrained(model_dir)
    enc = get_encoder("minilm")
    texts = [model.config.template.format(w) for w in COMMON_WORDS]
    codes = model.encode_text(enc.encode_text(texts, normalize=True)).toarray()
    out = {}
    for word, code in zip(COMMON_WORDS, codes, strict=True):
        top = np.argsort(-code, kind="stable")[: int((code > 0).sum())]
        out[word] = [model.names[j] for j in top]
    return out


def collage_folder(out: Path, n: int) -> tuple[Path, dict[str, list[str]]]:
    """``n`` test collages as a plain photo folder (labels kept aside for scoring)."""
    from sparsemm.io import read_jsonl
    from sparsemm_experiments.data.fashion import build_collages

    items = out / "collages" / "items.jsonl"
    settings = out / "collages" / "collages.json"
    if not (
        settings.is_file() and json.loads(settings.read_text()).get("counts", {}).get("test") == n
    ):
        items = build_collages(out / "collages", n_train=0, n_test=n, seed=0)
    folder = out / "collage-photos"
    folder.mkdir(parents=True, exist_ok=True)
    labels = {}
    for row in read_jsonl(items):
        name = Path(row["image"]).name
        if not (folder / name).is_file():
            shutil.copy(items.parent / row["image"], folder / name)
        labels[name] = list(row["labels"])
    return folder, labels


def label_pair_metrics(
    searcher: Any, labels: dict[str, list[str]], strategies: tuple[str, ...]
) -> dict[str, Any]:
    """Single-label P@10 and, per strategy, AP@10 / violation@10 / inclusion@10 over every
    ordered label pair (A, B) with an item holding both and one holding A alone."""
    ids = searcher.collection.ids
    classes = sorted({lab for labs in labels.values() for lab in labs})
    has = {c: {i for i in ids if c in labels.get(i, ())} for c in classes}
    result: dict[str, Any] = {"n_items": len(ids)}

    single = []
    unknown: set[str] = set()
    for c in classes:
        try:
            ranking = [h.id for h in searcher.search(c, k=10)]
        except SparsemmError:
            unknown.add(c)
            ranking = []
        single.append(precision_at_k(ranking, has[c], 10) if ranking else 0.0)
    result["single_label_p@10"] = float(np.mean(single))
    result["unknown_terms"] = sorted(unknown)

    pairs = [
        (a, b) for a, b in itertools.permutations(classes, 2) if has[a] & has[b] and has[a] - has[b]
    ]
    for strategy in strategies:
        ap, vio, inc, failed = [], [], [], 0
        for a, b in pairs:
            try:
                ranking = [
                    h.id for h in searcher.search(f"{a} but not {b}", k=10, strategy=strategy)
                ]
            except SparsemmError:
                ranking, failed = [], failed + 1
            relevant = has[a] - has[b]
            ap.append(ap_at_k(ranking, relevant, 10) if ranking else 0.0)
            vio.append(violation_at_k(ranking, has[b], 10) if ranking else 0.0)
            inc.append(inclusion_at_k(ranking, has[a], 10) if ranking else 0.0)
        result[strategy] = {
            "pairs": len(pairs),
            "ap@10": float(np.mean(ap)),
            "violation@10": float(np.mean(vio)),
            "inclusion@10": float(np.mean(inc)),
            "pairs_with_unknown_term": failed,
        }
    # chance level: the share of relevant items per pair
    result["chance_precision"] = float(np.mean([len(has[a] - has[b]) / len(ids) for a, b in pairs]))
    return result


def run_collages(out: Path, n: int) -> dict[str, Any]:
    from sparsemm.query.searcher import Searcher

    folder, labels = collage_folder(out, n)
    col, seconds = up(folder, out / "collage-up")
    result = label_pair_metrics(Searcher(col), labels, ("hybrid", "filter"))
    return {"seconds_up": seconds, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("runs/own-photos"))
    ap.add_argument("--collages", type=int, default=300, help="test collages to index")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "config.json", {"collages": args.collages, "queries": SKIMAGE_QUERIES})
    sk = run_skimage(args.out)
    print(f"scikit-image photos: sparsemm up took {sk['seconds_up']:.1f} s")
    for strategy in STRATEGIES:
        print(f"  strategy {strategy}:")
        for r in sk[strategy]["queries"]:
            mark = "ok  " if r["pass"] else "MISS"
            shown = ", ".join(r["top3"]) if r["top3"] else "(refused)" if r["error"] else "(none)"
            print(f"    {mark} {r['query']!r:30} top3: {shown:32} [{r['top1_concepts']}]")
        print(f"    {sk[strategy]['passed']}/{len(SKIMAGE_QUERIES)} hand-checked queries pass")
    vocab = run_vocabulary(args.out / "skimage-up" / "model")
    print("common words -> ImageNet classes (top 3 of the query code; - = refused):")
    for word, classes in vocab.items():
        extra = f" (+{len(classes) - 3})" if len(classes) > 3 else ""
        print(f"  {word:9} {', '.join(classes[:3]) + extra if classes else '-'}")
    print(f"  {sum(not c for c in vocab.values())}/{len(vocab)} words map to no class")
    fc = run_collages(args.out, args.collages)
    print(
        f"Fashion-MNIST collages ({fc['n_items']} test collages): up took {fc['seconds_up']:.1f} s"
    )
    print(
        f"  single label P@10 {fc['single_label_p@10']:.3f}; unknown terms: {fc['unknown_terms']}"
    )
    for strategy in ("hybrid", "filter"):
        m = fc[strategy]
        print(
            f"  {strategy:7} {m['pairs']} pairs: AP@10 {m['ap@10']:.3f}  violation@10 "
            f"{m['violation@10']:.3f}  inclusion@10 {m['inclusion@10']:.3f}  "
            f"(pairs with an unknown term: {m['pairs_with_unknown_term']})"
        )
    print(f"  chance precision (relevant share per pair): {fc['chance_precision']:.3f}")
    write_json(
        args.out / "metrics.json",
        {"git_commit": git_commit(), "skimage": sk, "vocabulary": vocab, "collages": fc},
    )
    print(json.dumps({"metrics": str(args.out / "metrics.json")}))


if __name__ == "__main__":
    main()
