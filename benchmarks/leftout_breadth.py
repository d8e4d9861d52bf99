"""Why excluding a broad word ("no animals") marks down photos that show none: diagnosis and
variants of the left-out term's presence calibration, held out by package on the pools.

A term to leave out is judged from the whole photo's summed class probability or, when
larger, from its tiles: each class keeps its largest probability over the tiles, and the
concept sums those (``sparsemm.query.scorers.UnitScorer.class_evidence``). For a word that
covers hundreds of classes ("animal": 398) that sum adds many small maxima, each from its
own tile, and passes 1 on photos with no animal at all. The left-out calibration (a missed
thing weighs ten false alarms) then reads it as present.

This script takes every (photo, label word) pair of the labelled pools
(``real_photos.data_files()``), and for each variant of the left-out evidence fits scale and
bias (and any extra weight) by log loss with positives weighted ``--miss-weight``, on every
package group but one, and predicts that one. Reported per variant: the weighted log loss
(what the fit minimises), the AUC, the labelled things it misses (P < 0.2 and P < 0.5), and
the absent things it reads as present (P > 0.5), overall and by how many classes the word
covers.

    python benchmarks/leftout_breadth.py POOL_COLLECTION -o OUT [--photos PHOTOS]

POOL_COLLECTION: ``OUT/collection`` of ``sparsemm up`` on the pool photos (as
``real_photos.py`` fetches them). ``--photos`` (the folder ``up`` read) reads every photo's
tiles again and adds the forms a code that kept each tile's own classes would allow (a
concept's evidence is its best tile's summed probability; about 1 s a photo). Writes
``OUT/leftout.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

sys.path.insert(0, str(Path(__file__).parent))
from photo_calibration import auc, build_pairs, log_loss, word_weights
from real_photos import data_files, load_all, source_groups

BREADTHS = ((1, 1), (2, 9), (10, 49), (50, 10_000))
FLOOR = 1e-4  # the evidence a variant's logit reads for "none" (0 stays P = 0 when alone)


def _logit(e: np.ndarray) -> np.ndarray:
    e = np.clip(e, FLOOR, 1.0 - 1e-6)
    return np.log(e) - np.log1p(-e)


def region_stats(searcher: Any, pairs: Any) -> dict[str, np.ndarray]:
    """Per pair: how many classes its word covers, the largest single class's tile
    evidence, and the photo's tile evidence summed over all classes."""
    model = searcher.model.model
    scorer = searcher.model.term_scorer()
    n, off = model.n_classes, model.region_offset
    ids = [Path(i).stem for i in searcher.collection.ids]
    row_of = {pid: r for r, pid in enumerate(ids)}
    codes = searcher.item_codes(np.arange(len(ids))).tocsr()
    total = np.asarray(codes[:, off : off + n].sum(axis=1)).ravel()
    per_word = {}
    for w, _broader, wt, _face in word_weights(scorer, sorted(set(pairs.word.tolist()))):
        cls = np.nonzero(wt[:n])[0]
        r = codes[:, off + cls].toarray() * wt[cls] if len(cls) else np.zeros((len(ids), 1))
        per_word[w] = (len(cls), r.max(axis=1))
    rows = np.array([row_of[p] for p in pairs.photo])
    return {
        "breadth": np.array([per_word[w][0] for w in pairs.word]),
        "r_max": np.array([per_word[w][1][r] for w, r in zip(pairs.word, rows, strict=True)]),
        "r_total": total[rows],
    }


def best_tile(searcher: Any, pairs: Any, photos: Path, top: int = 30) -> np.ndarray:
    """Per pair, its word's summed class probability in the photo's best tile (each tile's
    ``top`` classes), the photo read again from ``photos`` with the served tiles."""
    from sparsemm.encoders.hf import load_image
    from sparsemm.models.concept_evidence import FACE_MAX_SIDE, EvidenceReader, tile_boxes

    model = searcher.model.model
    reader = EvidenceReader(model, faces=object())
    n = model.n_classes
    weights = {
        w: wt[:n]
        for w, _b, wt, _f in word_weights(searcher.model.term_scorer(), sorted(set(pairs.word)))
    }
    tiles: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for item in searcher.collection.ids:
        pil = load_image(photos / item, max_side=FACE_MAX_SIDE)
        crops = [pil.crop(b) for b in tile_boxes(pil.size, model.config)]
        probs = model.class_probabilities(
            reader.backbone.pooled_squares(crops, side=int(model.config.image_size))
        )
        cls = np.argsort(-probs, axis=1)[:, :top]
        tiles[Path(item).stem] = (cls, np.take_along_axis(probs, cls, 1))
    out = []
    for photo, word in zip(pairs.photo, pairs.word, strict=True):
        cls, p = tiles[photo]
        out.append(float((weights[word][cls] * p).sum(axis=1).max()))
    return np.asarray(out)


def variants(pairs: Any, st: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Each variant's evidence inputs; each gets its own weight in the logit."""
    whole, rsum = pairs.e_whole, np.clip(pairs.e_region, 0.0, 1.0)
    expected = st["breadth"] / 1000.0 * st["r_total"]  # tile noise a word's share would get
    excess = np.clip(pairs.e_region - expected, 0.0, 1.0)
    tile = {}
    if "best_tile" in st:
        best = np.clip(st["best_tile"], 0.0, 1.0)
        tile = {
            "max(whole, best tile's summed classes)": [np.maximum(whole, best)],
            "whole and best tile's summed classes, own weights": [whole, best],
        }
    return tile | {
        "served: max(whole, tiles summed)": [np.maximum(whole, rsum)],
        "max(whole, best single class over the tiles)": [np.maximum(whole, st["r_max"])],
        "whole and tiles summed, own weights": [whole, rsum],
        "max(whole, tiles minus a word's share of the tile noise)": [np.maximum(whole, excess)],
        "whole, tiles minus noise and tiles summed, own weights": [whole, excess, rsum],
    }


def _design(inputs: list[np.ndarray], breadth: np.ndarray | None) -> tuple[np.ndarray, Any]:
    cols = [_logit(e) for e in inputs]
    if breadth is not None:
        cols.append(np.log1p(breadth))
    return np.stack(cols, 1), np.any([e > 0 for e in inputs], axis=0)


def _predict(v: np.ndarray, x: np.ndarray, has: np.ndarray, face: np.ndarray) -> np.ndarray:
    pc = np.where(has, 1.0 / (1.0 + np.exp(-(x @ v[:-1] + v[-1]))), 0.0)
    return 1.0 - (1.0 - pc) * (1.0 - face)


def held_out(
    pairs: Any, x: np.ndarray, has: np.ndarray, groups: np.ndarray, weight: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each group's P from a fit on the others (words read as a broader thing are left out
    of the fit, as the served fit does); and the fit on all."""
    face = np.clip(pairs.face, 0.0, 1.0)

    def fit(m: np.ndarray) -> np.ndarray:
        m = m & (pairs.broader == 0)
        v0 = np.zeros(x.shape[1] + 1)
        v0[0] = 0.5
        res = minimize(
            lambda v: log_loss(pairs.y[m], _predict(v, x[m], has[m], face[m]), weight),
            v0,
            method="L-BFGS-B",
        )
        return np.asarray(res.x)

    p = np.zeros(len(pairs.y))
    for g in sorted(set(groups.tolist())):
        t = groups == g
        p[t] = _predict(fit(~t), x[t], has[t], face[t])
    return p, fit(np.ones(len(pairs.y), dtype=bool))


def figures(y: np.ndarray, p: np.ndarray, breadth: np.ndarray, weight: float) -> dict[str, Any]:
    pos, neg = y == 1, y == 0
    out: dict[str, Any] = {
        "weighted_log_loss": round(log_loss(y, p, weight), 4),
        "auc": auc(y, p),
        "missed_below_0.2": round(float((p[pos] < 0.2).mean()), 4),
        "missed_below_0.5": round(float((p[pos] < 0.5).mean()), 4),
        "absent_above_0.5": round(float((p[neg] > 0.5).mean()), 4),
    }
    for lo, hi in BREADTHS:
        m = neg & (breadth >= lo) & (breadth <= hi)
        share = round(float((p[m] > 0.5).mean()), 4) if m.any() else None
        out[f"absent_above_0.5_classes_{lo}-{hi}"] = share
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("pool", type=Path, help="collection of sparsemm up on the pool photos")
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--miss-weight", type=float, default=10.0)
    ap.add_argument("--photos", type=Path, default=None, help="the photos, to read tiles again")
    a = ap.parse_args(argv)
    from sparsemm import Searcher

    searcher = Searcher(a.pool)
    data = load_all(data_files())
    pairs = build_pairs(searcher, data["photos"], data["implies"])
    st = region_stats(searcher, pairs)
    if a.photos is not None:
        st["best_tile"] = best_tile(searcher, pairs, a.photos)
    grp = source_groups(data)
    groups = np.array([grp.get(s, s) for s in pairs.source])
    rows = {}
    for name, inputs in variants(pairs, st).items():
        for with_breadth in (False, True):
            label = name + (", + a bias by log(1 + classes)" if with_breadth else "")
            x, has = _design(inputs, st["breadth"] if with_breadth else None)
            p, params = held_out(pairs, x, has, groups, a.miss_weight)
            rows[label] = figures(pairs.y, p, st["breadth"], a.miss_weight)
            rows[label]["fit_on_all"] = [round(float(v), 3) for v in params]
    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"pairs": len(pairs.y), "positives": int(pairs.y.sum()), "groups": len(set(groups))}
    (a.out / "leftout.json").write_text(json.dumps({**meta, "variants": rows}, indent=1))
    print(f"{meta}; miss weight {a.miss_weight:g}; held out by package group")
    head = ["wLL", "AUC", "miss<.2", "miss<.5", "FA>.5"] + [f"FA {lo}-{hi}" for lo, hi in BREADTHS]
    print(f"{'variant':78s} " + " ".join(f"{h:>9s}" for h in head))
    for label, r in rows.items():
        vals = [v for k, v in r.items() if k != "fit_on_all"]
        print(
            f"{label[:78]:78s} " + " ".join(f"{v:9.3f}" if v is not None else " " * 9 for v in vals)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
