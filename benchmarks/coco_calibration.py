"""COCO caption-proxy: is P(term | x) calibrated against what is in the picture?

For every test item of a COCO collection (``sparsemm demo coco``) and every term of the SR
model's detectors, the served scorer's probability (``match``'s
:class:`~sparsemm.query.scorers.DetectorScorer`) against the item's truth, by term family:

* **labels**: the 80 COCO labels, true when COCO annotates the object in the image,
  whether or not a caption names it;
* **category words**: the WordNet parents the detectors added ("vehicle", "animal"), true
  when a label or a caption word below them is in the image;
* **caption words**: every other term, true when a caption names it (all the truth there
  is for a word COCO does not annotate).

Prints, per family: pairs, positives, mean P against the positive rate, the expected
calibration error (ECE, 10 equal-width bins), log loss and AUC; writes metrics.json and
reliability.png. ``--split`` picks the items (default test: no detector or calibration was
fitted on them).

    python benchmarks/coco_calibration.py --collection runs/demo/collection \\
        --sr runs/demo/sr -o runs/coco-calibration
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import git_commit

FAMILIES = ("labels", "category words", "caption words")


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over equal-width bins of p."""
    edges = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = edges == b
        if sel.any():
            total += sel.sum() / len(p) * abs(float(p[sel].mean()) - float(y[sel].mean()))
    return total


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 10) -> list[dict[str, float]]:
    edges = np.minimum((p * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        sel = edges == b
        if sel.any():
            out.append(
                {
                    "bin": b / bins,
                    "pairs": int(sel.sum()),
                    "mean_p": round(float(p[sel].mean()), 4),
                    "rate": round(float(y[sel].mean()), 4),
                }
            )
    return out


def auc(p: np.ndarray, y: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    from scipy.stats import rankdata

    pos = y > 0
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if not n1 or not n0:
        return float("nan")
    r = rankdata(p)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def term_families(detectors: Any) -> np.ndarray:
    """(V,) family index of each detector term (see the module docstring)."""
    from sparsemm.concepts.wordnet import wordnet

    wn = wordnet()
    syn = [wn.by_wnid(w) if w else None for w in (detectors.wnids or [None] * len(detectors))]
    placed = [s for s in syn if s is not None]
    fam = np.full(len(detectors), 2, dtype=np.int64)
    for j, s in enumerate(syn):
        if detectors.label_terms[j]:
            fam[j] = 0
        elif s is not None and sum(1 for t in placed if t != s and s in wn.ancestors(t)) >= 2:
            fam[j] = 1
    return fam


def truth(
    detectors: Any, captions: list[list[str]], labels: list[list[str]], fam: np.ndarray
) -> np.ndarray:
    """(n, V) truth per family: labels from the annotations alone, the rest as the
    detectors' own targets (captions, and labels below a category word)."""
    from sparsemm.text import term_tokens
    from sparsemm.train.detectors import detector_targets

    y = detector_targets(captions, labels, detectors)
    keys = [{" ".join(term_tokens(x)) for x in labs} for labs in labels]
    for j in np.flatnonzero(fam == 0):
        k = " ".join(term_tokens(detectors.terms[j]))
        y[:, j] = [k in s for s in keys]
    return y


def probabilities(ctx: Any, scorer: Any, n_terms: int) -> np.ndarray:
    """(n, V) the served P(term | x) of every detector term."""
    return np.stack([scorer.unit_probability(u, ctx) for u in range(n_terms)], axis=1)


def summarise(p: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    eps = 1e-7
    pc = np.clip(p, eps, 1 - eps)
    return {
        "pairs": int(p.size),
        "positives": int(y.sum()),
        "mean_p": round(float(p.mean()), 4),
        "rate": round(float(y.mean()), 4),
        "ece": round(ece(p, y), 4),
        "log_loss": round(float(-(y * np.log(pc) + (1 - y) * np.log(1 - pc)).mean()), 4),
        "auc": round(auc(p, y), 4),
        "mean_p_positive": round(float(p[y > 0].mean()), 4) if y.any() else None,
        "reliability": reliability(p, y),
    }


def plot(metrics: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    for fam, m in metrics["families"].items():
        r = m["reliability"]
        ax.plot(
            [b["mean_p"] for b in r],
            [b["rate"] for b in r],
            marker="o",
            label=f"{fam} (ECE {m['ece']:.3f})",
        )
    ax.set_xlabel("P(term | x), served")
    ax.set_ylabel("share of pairs where it is true")
    ax.set_title("COCO test split: P(term | x)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--collection", type=Path, required=True)
    ap.add_argument("--sr", type=Path, required=True)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--split", default="test")
    args = ap.parse_args(argv)
    import coco_concepts

    from sparsemm.data.collection import open_collection
    from sparsemm.io import write_json
    from sparsemm.query.scorers import detector_scorer

    t0 = time.perf_counter()
    col = open_collection(args.collection)
    rows, labels, captions = coco_concepts.split_items(col, args.split)
    ctx = coco_concepts.build_context(col, args.sr, rows, None)
    det = ctx.detectors
    scorer = detector_scorer(det)
    fam = term_families(det)
    y = truth(det, captions, labels, fam)
    p = probabilities(ctx, scorer, len(det))
    metrics: dict[str, Any] = {
        "split": args.split,
        "items": len(rows),
        "terms": {f: int((fam == i).sum()) for i, f in enumerate(FAMILIES)},
        "families": {
            f: summarise(p[:, fam == i].ravel(), y[:, fam == i].ravel())
            for i, f in enumerate(FAMILIES)
            if (fam == i).any()
        },
        "seconds": round(time.perf_counter() - t0, 1),
        "git_commit": git_commit(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "metrics.json", metrics)
    plot(metrics, args.out / "reliability.png")
    print(f"{metrics['items']} {args.split} items; terms {metrics['terms']}")
    print("| family | pairs | positives | mean P | rate | ECE | log loss | AUC | mean P (true) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f, m in metrics["families"].items():
        print(
            f"| {f} | {m['pairs']} | {m['positives']} | {m['mean_p']:.4f} | {m['rate']:.4f} "
            f"| {m['ece']:.4f} | {m['log_loss']:.4f} | {m['auc']:.4f} | {m['mean_p_positive']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
