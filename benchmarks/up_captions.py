"""When should ``sparsemm up`` train SR on a folder's captions instead of serving the
caption-free ImageNet concept model?

A folder of Fashion-MNIST collages (``sparsemm demo``'s data): N training collages with
their captions plus 200 test collages without any (as a user captions part of a folder),
run through ``sparsemm up`` twice per N on the same collection: ``--no-train`` (the
ImageNet concept model) and ``--train`` (SR on the N photos' captions, the served default
strategy of each). Scored on every ordered label pair "A but not B" over the whole folder
(own_photos.label_pair_metrics: AP@10, violation@10), and the single-label P@10.

    python benchmarks/up_captions.py -o runs/up-captions --sizes 60 200 500 1000

Writes metrics.json (with the git commit) and prints one line per (N, model).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from _common import git_commit
from own_photos import label_pair_metrics, up

from sparsemm.io import read_jsonl, write_json, write_jsonl

N_TEST = 200


def collage_rows(data: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Path]:
    """(train rows, test rows, their folder) of the demo's collages (``sparsemm demo``)."""
    items = data / "items.jsonl"
    if not items.is_file():
        raise SystemExit(f"{items} not found: run `sparsemm demo` first (or pass --collages)")
    rows = read_jsonl(items)
    return (
        [r for r in rows if r.get("split") == "train"],
        [r for r in rows if r.get("split") == "test"],
        items.parent,
    )


def make_folder(
    out: Path, train: list[dict[str, Any]], test: list[dict[str, Any]], src: Path
) -> tuple[Path, Path, dict[str, list[str]]]:
    """Copy the collages into ``out/photos`` and write the train ones' captions."""
    photos = out / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    labels, caps = {}, []
    for r in [*train, *test]:
        name = Path(r["image"]).name
        if not (photos / name).is_file():
            shutil.copy(src / r["image"], photos / name)
        labels[name] = list(r["labels"])
    for r in train:
        caps.append({"id": Path(r["image"]).name, "captions": list(r["captions"])})
    write_jsonl(out / "captions.jsonl", caps)
    return photos, out / "captions.jsonl", labels


def main() -> None:
    from sparsemm.query.searcher import Searcher

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("runs/up-captions"))
    ap.add_argument("--collages", type=Path, default=Path("runs/collages-demo/collages"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[60, 200, 500, 1000])
    args = ap.parse_args()
    train_rows, test_rows, src = collage_rows(args.collages)
    results: list[dict[str, Any]] = []
    for n in args.sizes:
        run = args.out / f"n{n}"
        photos, captions, labels = make_folder(run, train_rows[:n], test_rows[:N_TEST], src)
        for mode in ("--no-train", "--train"):
            t0 = time.perf_counter()
            col, _ = up(photos, run / "up", extra=("--captions", str(captions), mode))
            seconds = time.perf_counter() - t0
            searcher = Searcher(col)
            strategy = searcher.default_strategy
            m = label_pair_metrics(searcher, labels, (strategy,))
            row = {
                "n_captioned": n,
                "n_items": m["n_items"],
                "model": "sr" if mode == "--train" else "imagenet_concepts",
                "strategy": strategy,
                "seconds_up": round(seconds, 1),
                "single_label_p@10": m["single_label_p@10"],
                **{k: m[strategy][k] for k in ("pairs", "ap@10", "violation@10")},
                "chance_precision": m["chance_precision"],
            }
            results.append(row)
            print(
                f"N={n:5d} {row['model']:17} [{strategy:6}] AP@10 {row['ap@10']:.3f} "
                f"violation@10 {row['violation@10']:.3f} P@10 {row['single_label_p@10']:.3f} "
                f"({row['pairs']} pairs, chance {row['chance_precision']:.3f}; "
                f"up {row['seconds_up']:.0f} s)",
                flush=True,
            )
    write_json(args.out / "metrics.json", {"commit": git_commit(), "results": results})


if __name__ == "__main__":
    main()
