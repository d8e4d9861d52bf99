"""COCO caption-proxy: do the served scores mean something, and do category words work?

Two measurements on the test split of a COCO collection (``sparsemm demo coco``), through
the same scorer ``sparsemm search`` serves (``match``), with dense references:

1. **Verification.** Per test image with two objects its captions name (the caption-proxy
   image knows nothing else), four captions written from this script's own templates,
   exactly one true: an affirmation ("There is a dog."), a negation ("There is no cat."), an
   exclusion ("A dog but no cat.") and two objects ("A dog and a frisbee."). The true one
   takes each type in turn; the other three are false versions of the other types (an
   absent object X is drawn by how often it appears with the image's own labels, so it is
   a plausible mistake). Each caption is parsed (``sparsemm.query.parse``) and scored for
   the image; the caption with the highest score is the answer. Accuracy per type of the
   true caption. References: dense cosine of the caption with the image view; ``hybrid``'s
   score (not a probability, so not comparable across captions).
2. **Category words.** "A but not B" where A is a category word: a COCO supercategory
   (vehicle, animal, food, furniture, appliance, electronics, sports equipment, kitchenware)
   or a WordNet parent of COCO labels (fruit, vegetable, cutlery, seat). Relevant: images
   with a label in A and none of B, where B is a label inside or outside A, or another
   category. AP@10 / violation@10 against dense emb(A) and embedding arithmetic.

Each query set keeps a held-out third (template phrasings; category words), reported
separately. Writes config.json, metrics.json and report.md.

    python benchmarks/coco_concepts.py --collection runs/demo/collection --sr runs/demo/sr \\
        -o runs/coco-concepts
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from _common import git_commit

# COCO's supercategories, written as the words people type for them
SUPER: dict[str, list[str]] = {
    "vehicle": ["bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat"],
    "animal": [
        "bird",
        "cat",
        "dog",
        "horse",
        "sheep",
        "cow",
        "elephant",
        "bear",
        "zebra",
        "giraffe",
    ],
    "food": [
        "banana",
        "apple",
        "sandwich",
        "orange",
        "broccoli",
        "carrot",
        "hot dog",
        "pizza",
        "donut",
        "cake",
    ],
    "furniture": ["chair", "couch", "potted plant", "bed", "dining table", "toilet"],
    "appliance": ["microwave", "oven", "toaster", "sink", "refrigerator"],
    "electronics": ["tv", "laptop", "mouse", "remote", "keyboard", "cell phone"],
    "sports equipment": [
        "frisbee",
        "skis",
        "snowboard",
        "sports ball",
        "kite",
        "baseball bat",
        "baseball glove",
        "skateboard",
        "surfboard",
        "tennis racket",
    ],
    "kitchenware": ["bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl"],
}
# WordNet parents of COCO labels (the labels below them in WordNet)
PARENTS: dict[str, list[str]] = {
    "fruit": ["banana", "apple", "orange"],
    "vegetable": ["broccoli", "carrot"],
    "cutlery": ["fork", "knife", "spoon"],
    "seat": ["chair", "couch", "bench", "toilet"],
}
CATEGORIES = {**SUPER, **PARENTS}
# every third category word (in this order) is held out
CATEGORY_ORDER = list(CATEGORIES)
HELD_OUT_CATEGORIES = set(CATEGORY_ORDER[2::3])

# caption templates: three phrasings per type, the third held out
TEMPLATES: dict[str, list[str]] = {
    "affirmation": ["There is a {x}.", "A photo with a {x} in it.", "I can see a {x}."],
    "negation": [
        "There is no {y}.",
        "A photo without a {y}.",
        "No {y} can be seen.",
    ],
    "exclusion": [
        "A {x} but no {y}.",
        "A photo of a {x} without a {y}.",
        "There is a {x}, and no {y} in sight.",
    ],
    "two objects": [
        "A {x} and a {z}.",
        "A photo with a {x} and a {z}.",
        "I can see a {x} and a {z}.",
    ],
}
TYPES = list(TEMPLATES)


def cooccurrence(labels: list[list[str]]) -> Counter[tuple[str, str]]:
    """How many images carry both of two different labels, per ordered pair."""
    co: Counter[tuple[str, str]] = Counter()
    for labs in labels:
        for a in set(labs):
            for b in set(labs):
                if a != b:
                    co[(a, b)] += 1
    return co


def draw_absent(
    rng: np.random.Generator,
    present: list[str],
    absent: list[str],
    co: Counter[tuple[str, str]],
) -> str:
    """One absent object, drawn with weight 1 + how often it comes with the present ones
    (a hard negative: what usually accompanies what the image shows)."""
    w = np.asarray([1 + sum(co[(p, v)] for p in present) for v in absent], dtype=np.float64)
    return absent[int(rng.choice(len(absent), p=w / w.sum()))]


def four_captions(x: str, y: str, z: str, true_type: str, phrasing: int) -> list[dict[str, Any]]:
    """The four captions of one verification row, one per type, from phrasing ``phrasing``
    of each template: the ``true_type`` one true (x and z present, y absent), the others
    made false by putting the absent y where a present object belongs or negating a present
    one. Each caption also names the objects it wants and leaves out (``include``,
    ``exclude``)."""
    written = []
    for t in TYPES:
        tpl = TEMPLATES[t][phrasing]
        if t == true_type:
            a, b, c = x, y, z
        elif t == "affirmation":  # false: an absent object
            a, b, c = y, y, z
        elif t == "negation":  # false: a present object negated
            a, b, c = x, x, z
        elif t == "exclusion":  # false: the present z excluded
            a, b, c = x, z, z
        else:  # two objects, false: one absent
            a, b, c = x, y, y
        wanted, left_out = {
            "affirmation": ([a], []),
            "negation": ([], [b]),
            "exclusion": ([a], [b]),
            "two objects": ([a, c], []),
        }[t]
        written.append(
            {
                "type": t,
                "text": tpl.format(x=a, y=b, z=c),
                "true": t == true_type,
                "include": wanted,
                "exclude": left_out,
            }
        )
    return written


def verification_set(
    labels: list[list[str]], captions: list[list[str]], seed: int = 0, objects: str = "annotated"
) -> list[dict[str, Any]]:
    """Per image with at least two present objects: four captions, one true (see the
    docstring). ``objects="annotated"``: the present objects are every label COCO annotates
    in the image, whether or not a caption names it (what a photo shows); ``"named"``: only
    the labels some caption of the image mentions (sparsemm.text.CaptionIndex), all the
    caption-proxy view is built from. Absent objects are never labels of the image. Each
    row records which of its present objects the captions name (``named``)."""
    from sparsemm.text import CaptionIndex

    if objects not in ("annotated", "named"):
        raise ValueError(f"objects must be 'annotated' or 'named', not {objects!r}")
    index = CaptionIndex(captions)
    rng = np.random.default_rng(seed)
    co = cooccurrence(labels)
    vocab = sorted({lab for labs in labels for lab in labs})
    out = []
    n = 0
    mentioned = {v: index.mentions(v) for v in vocab}
    for i, labs in enumerate(labels):
        named = sorted(v for v in set(labs) if mentioned[v][i])
        present = named if objects == "named" else sorted(set(labs))
        if len(present) < 2:
            continue
        y = draw_absent(rng, present, [v for v in vocab if v not in labs], co)
        x, z = (present[j] for j in rng.choice(len(present), size=2, replace=False))
        true_type = TYPES[n % len(TYPES)]
        phrasing = int(rng.integers(3))
        written = four_captions(x, y, z, true_type, phrasing)
        out.append(
            {
                "item": i,
                "true_type": true_type,
                "phrasing": phrasing,
                "split": "heldout" if phrasing == 2 else "train",
                "present": [x, z],
                "absent": y,
                "named": [v in named for v in (x, z)],
                "captions": written,
            }
        )
        n += 1
    return out


def category_queries(labels: list[list[str]]) -> list[dict[str, Any]]:
    """ "A but not B" with A a category word: B a label or another category, kept when some
    image carries both and some image carries A without B."""
    has_label = [set(labs) for labs in labels]
    names = sorted({lab for labs in labels for lab in labs})
    out = []
    for a, members in CATEGORIES.items():
        in_a = {i for i, s in enumerate(has_label) if s & set(members)}
        if not in_a:
            continue
        for b in names + [c for c in CATEGORIES if c != a]:
            b_members = set(CATEGORIES.get(b, [b]))
            if b_members >= set(members):
                continue  # B covers A: nothing relevant
            in_b = {i for i, s in enumerate(has_label) if s & b_members}
            both = in_a & in_b
            if not both or not (in_a - in_b):
                continue
            out.append(
                {
                    "a": a,
                    "b": b,
                    "relevant": sorted(in_a - in_b),
                    "a_items": sorted(in_a),
                    "b_items": sorted(in_b),
                    "split": "heldout" if a in HELD_OUT_CATEGORIES else "train",
                }
            )
    return out


def split_items(collection: Any, split: str) -> tuple[np.ndarray, list[list[str]], list[list[str]]]:
    """(rows, labels, captions) of a collection split's items, in row order."""
    from sparsemm_experiments.eval.bench import captions_by_item

    rows = np.flatnonzero(collection.split_mask(split))
    by_item = captions_by_item(collection)
    labels = [list(collection.items[int(r)].get("labels") or []) for r in rows]
    return rows, labels, [by_item[int(r)] for r in rows]


def build_context(collection: Any, sr_dir: Path, rows: np.ndarray, top_k: int | None) -> Any:
    from sparsemm.encoders.base import get_encoder
    from sparsemm.models.detectors import ConceptDetectors, has_detectors
    from sparsemm.models.sr import SRModel
    from sparsemm.query.strategies import ExclusionContext, sr_query_coder

    model = SRModel.from_pretrained(sr_dir)
    k = top_k or model.config.inference_top_k or model.config.top_k
    dense = collection.image_embeddings()[rows]
    codes = sp.csr_matrix(model.encode(dense, "image", top_k=k))
    encoder = get_encoder("minilm")
    detectors = ConceptDetectors.for_model(sr_dir) if has_detectors(sr_dir) else None
    return ExclusionContext(
        dense,
        codes,
        encoder,
        sr_query_coder(model, top_k=k),
        cache_size=1 << 16,
        detectors=detectors,
    )


def run_verification(
    ctx: Any, items: list[dict[str, Any]], references: bool = True
) -> dict[str, Any]:
    """Accuracy per type of the true caption: ``match``, and with ``references`` hybrid's
    and the dense cosine's."""
    from sparsemm.query.parse import parse_query
    from sparsemm.query.strategies import get_strategy
    from sparsemm.query.strategies.ranking import score_query

    texts = sorted({c["text"] for it in items for c in it["captions"]})
    parsed = {t: parse_query(t) for t in texts}
    terms = {w for q in parsed.values() for w in (*q.include, *q.exclude)}
    match = get_strategy("match", ctx)
    match.prepare(terms)
    ctx.prefetch(list(terms) + texts, codes=True)
    hybrid = get_strategy("hybrid", ctx) if references else None
    dense_of = dict(zip(texts, ctx.embed(texts), strict=True)) if references else {}
    methods = ("match", "hybrid", "dense") if references else ("match",)
    correct: dict[str, dict[str, list[bool]]] = {m: {} for m in methods}
    rows = []
    for it in items:
        i = it["item"]
        sub = ctx.sub(ctx.items_codes[[i]])
        sub.items_dense = ctx.items_dense[[i]]
        m_sub = get_strategy("match", sub)
        scores: dict[str, list[float]] = {m: [] for m in methods}
        for c in it["captions"]:
            q = parsed[c["text"]]
            scores["match"].append(float(m_sub.probability(q.include, q.exclude)[0]))
            if not references:
                continue
            assert hybrid is not None
            h = score_query(sub, q, hybrid.__class__(sub, **hybrid.p))
            scores["hybrid"].append(float(h[0]) if np.isfinite(h[0]) else -1e9)
            scores["dense"].append(float(ctx.items_dense[i] @ dense_of[c["text"]]))
        truth = [c["true"] for c in it["captions"]]
        for m, s in scores.items():
            ok = truth[int(np.argmax(s))]
            correct[m].setdefault(it["true_type"], []).append(bool(ok))
            correct[m].setdefault(f"split:{it['split']}", []).append(bool(ok))
            if it["split"] == "heldout":
                correct[m].setdefault(f"heldout:{it['true_type']}", []).append(bool(ok))
            if not all(it.get("named", (True,))):  # an object no caption names
                correct[m].setdefault("unnamed", []).append(bool(ok))
        rows.append({**it, "scores": scores})
    summary = {
        m: {
            **{t: round(float(np.mean(v)), 4) for t, v in per.items()},
            "overall": round(float(np.mean([x for t in TYPES for x in per.get(t, [])])), 4),
        }
        for m, per in correct.items()
    }
    return {"n_images": len(items), "accuracy": summary, "rows": rows[:50]}


def run_categories(ctx: Any, queries: list[dict[str, Any]]) -> dict[str, Any]:
    from sparsemm_experiments.eval.bench import evaluate_strategy
    from sparsemm_experiments.eval.exclusion import ExclusionQuery, query_matrices

    eq = [
        ExclusionQuery(
            a=q["a"],
            b=q["b"],
            relevant=np.asarray(q["relevant"], dtype=np.int64),
            a_items=np.asarray(q["a_items"], dtype=np.int64),
            b_items=np.asarray(q["b_items"], dtype=np.int64),
            hard=False,
        )
        for q in queries
    ]
    mats = query_matrices(eq, ctx.n_items)
    split = np.asarray([q["split"] for q in queries])
    out: dict[str, Any] = {}
    for name in ("dense_a", "avg_emb_0.5", "hybrid", "match"):
        t0 = time.perf_counter()
        per = evaluate_strategy(ctx, name, {}, eq, mats, 10, ["ap@10", "violation@10"])
        out[name] = {
            s: {
                "queries": int((split == s).sum()) if s != "all" else len(queries),
                "ap@10": round(float(per["ap@10"][sel].mean()), 4),
                "violation@10": round(float(per["violation@10"][sel].mean()), 4),
            }
            for s, sel in (
                ("train", split == "train"),
                ("heldout", split == "heldout"),
                ("all", np.ones(len(split), bool)),
            )
        }
        out[name]["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def report(metrics: dict[str, Any]) -> str:
    v = metrics["verification"]["accuracy"]
    lines = [
        "# COCO caption-proxy: verification and category words",
        "",
        f"Verification: {metrics['verification']['n_images']} test images, 4 captions each.",
        "",
        "| scorer | " + " | ".join(TYPES) + " | overall | train phrasings | held-out phrasings "
        "| an object no caption names |",
        "|---|" + "---:|" * (len(TYPES) + 4),
    ]
    for m, acc in v.items():
        lines.append(
            f"| {m} | "
            + " | ".join(f"{acc.get(t, float('nan')):.3f}" for t in TYPES)
            + f" | {acc['overall']:.3f} | {acc.get('split:train', float('nan')):.3f} | "
            f"{acc.get('split:heldout', float('nan')):.3f} | "
            f"{acc.get('unnamed', float('nan')):.3f} |"
        )
    c = metrics["categories"]
    if not c:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"Category words: {metrics['n_category_queries']} queries "
        f"(held out: {', '.join(sorted(HELD_OUT_CATEGORIES))}).",
        "",
        "| method | AP@10 train | AP@10 held-out | AP@10 all | violation@10 all |",
        "|---|---:|---:|---:|---:|",
    ]
    for m, r in c.items():
        lines.append(
            f"| {m} | {r['train']['ap@10']:.3f} | {r['heldout']['ap@10']:.3f} | "
            f"{r['all']['ap@10']:.3f} | {r['all']['violation@10']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--collection", type=Path, required=True)
    ap.add_argument("--sr", type=Path, required=True)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--objects",
        choices=("annotated", "named"),
        default="annotated",
        help="present objects: every COCO annotation of the image (default) or only those "
        "its captions name",
    )
    ap.add_argument("--no-categories", action="store_true", help="the verification only (faster)")
    args = ap.parse_args(argv)
    from sparsemm.data.collection import open_collection
    from sparsemm.io import write_json

    col = open_collection(args.collection)
    rows, labels, captions = split_items(col, args.split)
    ctx = build_context(col, args.sr, rows, args.top_k)
    t0 = time.perf_counter()
    ver = run_verification(ctx, verification_set(labels, captions, args.seed, args.objects))
    cats = [] if args.no_categories else category_queries(labels)
    metrics = {
        "verification": {k: v for k, v in ver.items() if k != "rows"},
        "categories": run_categories(ctx, cats) if cats else {},
        "n_category_queries": len(cats),
        "seconds": round(time.perf_counter() - t0, 1),
        "git_commit": git_commit(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(
        args.out / "config.json",
        {
            **{k: str(v) for k, v in vars(args).items()},
            "templates": TEMPLATES,
            "categories": CATEGORIES,
            "git_commit": metrics["git_commit"],
        },
    )
    write_json(args.out / "metrics.json", metrics)
    (args.out / "examples.json").write_text(json.dumps(ver["rows"], indent=1), encoding="utf-8")
    (args.out / "report.md").write_text(report(metrics), encoding="utf-8")
    print(report(metrics))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
