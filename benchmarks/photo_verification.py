"""Verification on real photographs: does P(match) compose when the picture holds the objects?

The COCO verification (``coco_concepts.py``) scores caption-proxy pictures: an image there
is the mean of its captions, so an object no caption names is hardly in it. Here the same
four-caption test runs on the real photographs of ``real_photos.py`` (every visible thing
hand-labelled), through the served search of the collection ``sparsemm up`` built:

- per photo with two labelled objects x and z (neither implying the other), an absent
  object y (not among the photo's labels or ``maybe`` labels, closed under ``implies``),
  drawn with weight 1 + how often it comes with x and z in the other photos;
- four captions from ``coco_concepts.TEMPLATES`` ("There is a x.", "There is no y.",
  "A x but no y.", "A x and a z."), one true, taking each type in turn; the others made
  false as in ``coco_concepts.four_captions``;
- the objects are label words seen in at least three photos, less the scene tags
  ``indoor``, ``outdoor``, ``night`` and ``text`` (not things one points at);
- each caption is searched over every photo (``Searcher.search``, the collection's default
  scorer) and the caption with the highest P(match) for the photo is its answer. A caption
  the model refuses (a word it cannot read) makes the row refused; it is counted, not
  scored.

Accuracy per type of the true caption, for the third phrasing of each template alone (held
out), and twice over: with the served calibration (fitted on these photos) and with every
photo scored by calibrations fitted without its own source (leave one source out, as in
``real_photos.py``; ``--exclude-weight`` is the left-out terms' weight that script chooses on
its train queries).

    python benchmarks/photo_verification.py -o runs/photo-verification [--up DIR]

``--up DIR`` reuses the output of an earlier ``sparsemm up`` of the same photos (else the
photos are fetched and ``sparsemm up`` runs, as in ``real_photos.py``). Writes
``metrics.json``, ``rows.jsonl`` and ``report.md`` into OUT.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from _common import git_commit
from coco_concepts import TYPES, cooccurrence, draw_absent, four_captions
from real_photos import closure, data_files, fetch_photos, leave_one_out, load_all, run_up
from real_photos import source_groups as photo_groups

SCENE_TAGS = {"indoor", "outdoor", "night", "text"}
MIN_PHOTOS = 3


def with_articles(text: str) -> str:
    """ "a apple" -> "an apple" (the templates were written with "a")."""
    return re.sub(r"\b([Aa]) (?=[aeiou])", r"\1n ", text)


def verification_rows(
    data: dict[str, Any], photo_ids: set[str], seed: int = 0
) -> list[dict[str, Any]]:
    """The four-caption rows over the labelled photos in ``photo_ids`` (see the docstring)."""
    imp = data["implies"]
    photos = [p for p in data["photos"] if p["id"] in photo_ids]
    counts = Counter(lab for p in photos for lab in set(p["labels"]))
    vocab = sorted(w for w, n in counts.items() if n >= MIN_PHOTOS and w not in SCENE_TAGS)
    words = set(vocab)
    co = cooccurrence([[w for w in p["labels"] if w in words] for p in photos])
    rng = np.random.default_rng(seed)
    rows = []
    for p in sorted(photos, key=lambda p: p["id"]):
        shown = closure(p["labels"], imp)
        unsure = closure(p.get("maybe", []), imp)
        present = sorted(w for w in set(p["labels"]) if w in words)
        pairs = [
            (a, b)
            for i, a in enumerate(present)
            for b in present[i + 1 :]
            if b not in closure([a], imp) and a not in closure([b], imp)
        ]
        absent = [w for w in vocab if w not in shown and w not in unsure]
        if not pairs or not absent:
            continue
        x, z = pairs[int(rng.integers(len(pairs)))]
        if rng.random() < 0.5:
            x, z = z, x
        y = draw_absent(rng, [x, z], absent, co)
        true_type = TYPES[len(rows) % len(TYPES)]
        phrasing = int(rng.integers(3))
        captions = four_captions(x, y, z, true_type, phrasing)
        for c in captions:
            c["text"] = with_articles(c["text"])
        rows.append(
            {
                "photo": p["id"],
                "source": p["source"],
                "true_type": true_type,
                "phrasing": phrasing,
                "split": "heldout" if phrasing == 2 else "train",
                "present": [x, z],
                "absent": y,
                "captions": captions,
            }
        )
    return rows


def caption_queries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct caption as a query entry of the real-photos format (its include and
    exclude labels as ``four_captions`` wrote them, so ``leave_one_out`` can judge it)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        for c in r["captions"]:
            inc, exc = c["include"], c["exclude"]
            out.setdefault(
                c["text"],
                {"id": c["text"], "text": c["text"], "include": inc, "exclude": exc},
            )
            out[c["text"]]["split"] = r["split"]
    return list(out.values())


def served_scores(
    searcher: Any, queries: list[dict[str, Any]], n: int
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """P(match) of every photo for every caption through ``Searcher.search`` (the
    collection's default scorer), and the captions the model refused, with why."""
    from sparsemm.errors import SparsemmError

    scores: dict[str, dict[str, float]] = {}
    refused: dict[str, str] = {}
    for q in queries:
        try:
            hits = searcher.search(q["text"], k=n)
        except SparsemmError as exc:
            refused[q["id"]] = str(exc)
            continue
        scores[q["id"]] = {Path(h.id).stem: float(h.score) for h in hits}
    return scores, refused


def accuracy(
    rows: list[dict[str, Any]], scores: dict[str, dict[str, float]], refused: dict[str, str]
) -> dict[str, Any]:
    """Per type of the true caption (and for the held-out phrasings alone): how often the
    true caption has the photo's highest P(match); rows with a refused caption apart."""
    right: dict[str, list[bool]] = {}
    n_refused = 0
    for r in rows:
        texts = [c["text"] for c in r["captions"]]
        if any(t in refused for t in texts):
            n_refused += 1
            continue
        p = [scores.get(t, {}).get(r["photo"], 0.0) for t in texts]
        ok = bool(r["captions"][int(np.argmax(p))]["true"])
        right.setdefault(r["true_type"], []).append(ok)
        if r["split"] == "heldout":
            right.setdefault(f"heldout:{r['true_type']}", []).append(ok)
            right.setdefault("heldout", []).append(ok)
    out: dict[str, Any] = {k: round(float(np.mean(v)), 4) for k, v in right.items()}
    out["overall"] = round(float(np.mean([x for t in TYPES for x in right.get(t, [])])), 4)
    out["rows"] = sum(len(right.get(t, [])) for t in TYPES)
    out["refused_rows"] = n_refused
    out["min_type"] = min((out[t] for t in TYPES if t in out), default=None)
    return out


def report(metrics: dict[str, Any]) -> str:
    head = "| scoring | " + " | ".join(TYPES) + " | overall | held-out phrasings | rows |"
    lines = [
        f"# Verification on real photos ({metrics['photos']} photos, {metrics['rows']} rows)",
        "",
        head,
        "|---" + "|---:" * (len(TYPES) + 3) + "|",
    ]
    for name, acc in metrics["accuracy"].items():
        cells = [f"{acc.get(t, float('nan')):.3f}" for t in TYPES]
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {acc['overall']:.3f} | "
            f"{acc.get('heldout', float('nan')):.3f} | {acc['rows']} |"
        )
    lines += ["", f"Refused rows (a caption the model cannot read): {metrics['refused_rows']}"]
    for text, why in list(metrics["refused"].items())[:10]:
        lines.append(f"- {text!r}: {why}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--up", type=Path, default=None, help="an earlier `sparsemm up` output")
    ap.add_argument("--cache", type=Path, default=None, help="downloaded packages")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exclude-weight", type=float, default=10.0)
    ap.add_argument("--no-loso", action="store_true", help="served calibration only")
    args = ap.parse_args(argv)
    data = load_all(data_files())
    up = args.up
    if up is None:
        missing = fetch_photos(data, args.out / "photos", args.cache or args.out / "cache")
        if len(missing) == len(data["photos"]):
            print("skipped: no photo could be had (needs apt-get/dpkg and pip)")
            return 0
        run_up(args.out / "photos", args.out / "up", [])
        up = args.out / "up"
    from sparsemm import Searcher

    searcher = Searcher(up / "collection")
    stems = {Path(i).stem for i in searcher.collection.ids}
    rows = verification_rows(data, stems, args.seed)
    queries = caption_queries(rows)
    scores, refused = served_scores(searcher, queries, len(stems))
    results = {"served calibration": accuracy(rows, scores, refused)}
    if not args.no_loso and getattr(searcher.model, "kind", "") == "imagenet_concepts":
        loso = leave_one_out(
            searcher,
            {**data, "queries": queries},
            None,
            photo_groups(data),
            args.exclude_weight,
        )
        results["held out by source"] = accuracy(rows, loso["held_scores"], refused)
    metrics = {
        "photos": len(stems),
        "rows": len(rows),
        "captions": len(queries),
        "refused_rows": results["served calibration"]["refused_rows"],
        "refused": refused,
        "exclude_weight": args.exclude_weight,
        "accuracy": results,
        "git_commit": git_commit(),
    }
    from sparsemm.io import write_json

    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "metrics.json", metrics)
    with open(args.out / "rows.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    text = report(metrics)
    (args.out / "report.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
