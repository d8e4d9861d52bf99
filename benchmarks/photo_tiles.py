"""How well the photo model's tiles read secondary things, for several tile settings.

For every labelled photo of an earlier ``sparsemm up`` (``--up DIR``, as built by
``real_photos.py``), the classifier reads the whole photo and the tiles of each setting
(six coarse tiles of 60%, finer grids of 40% and 33% of the shorter side); then, per setting and
number of classes kept over the tiles, the (photo, label word) pairs of
``photo_calibration.py`` are scored as the served model would score them, and reported: the
share of labelled and of absent things with any evidence, the share of labelled things at
P = 0, and the held-out (leave one source out) AUC and ECE of the wanted and left-out terms'
calibrations. The last setting scores a concept by its best single tile (each tile's own
top classes) instead of each class's best tile.

    python benchmarks/photo_tiles.py --up runs/real-photos/up -o runs/photo-tiles [--limit N]

Writes ``probs.npz`` (the classifier's probabilities, float16) and ``metrics.json`` in OUT.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from _common import git_commit

SCHEMES = {"6 of 60%": ("cur",), "12 of 40%": ("g40",), "20 of 33%": ("g33",)}
SCHEMES |= {"6 of 60% + 12 of 40%": ("cur", "g40"), "6 of 60% + 20 of 33%": ("cur", "g33")}
MIN_PROB = 0.01


def read_probs(searcher: Any, limit: int | None) -> dict[str, dict[str, np.ndarray]]:
    """Whole-photo and per-tile class probabilities of each photo, per tile setting."""
    from sparsemm.encoders.base import get_encoder
    from sparsemm.encoders.hf import load_image
    from sparsemm.models.concept_evidence import FACE_MAX_SIDE, _grid

    model = searcher.model.model
    bb = get_encoder("efficientnet")
    schemes = {
        # the six coarse tiles (60% of the shorter side, 3 x 2), whatever the model serves
        "cur": lambda sz: _grid(sz, 0.6, 3, 2),
        "g40": lambda sz: _grid(sz, 0.4, 4, 4),
        "g33": lambda sz: _grid(sz, 0.33, 5, 5),
    }
    out = {}
    items = list(zip(searcher.collection.ids, searcher.collection.items, strict=True))
    for pid, it in items[:limit]:
        pil = load_image(it["image"], max_side=FACE_MAX_SIDE)
        rec = {"whole": model.class_probabilities(bb.pooled_full([pil], side=224))[0]}
        for name, fn in schemes.items():
            crops = [pil.crop(b) for b in fn(pil.size)]
            rec[name] = model.class_probabilities(bb.pooled_squares(crops, side=224))
        out[Path(pid).stem] = {k: v.astype(np.float16) for k, v in rec.items()}
    return out


def sparsify(v: np.ndarray, k: int, best: bool = False) -> np.ndarray:
    o = np.zeros_like(v)
    top = np.argsort(-v, kind="stable")[:k]
    m = v[top] >= MIN_PROB
    if best:
        m[0] = True
    o[top[m]] = v[top[m]]
    return o


def evaluate(searcher: Any, probs: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    from photo_calibration import Pairs, labelled, leave_one_source_out, word_weights
    from real_photos import closure, data_files, load_all, source_groups

    model = searcher.model.model
    scorer = searcher.model.term_scorer()
    n_cls = model.n_classes
    data = load_all(data_files())
    groups = source_groups(data)
    ids = [Path(i).stem for i in searcher.collection.ids]
    row_of = {p: r for r, p in enumerate(ids)}
    keep = [p for p in data["photos"] if p["id"] in row_of and p["id"] in probs]
    codes = searcher.item_codes(np.array([row_of[p["id"]] for p in keep]))
    whole = np.stack([sparsify(probs[p["id"]]["whole"].astype(np.float32), 20, True) for p in keep])
    variants: dict[str, Any] = {}
    for k in (20, 40):
        for name, sch in SCHEMES.items():
            reg = [
                np.concatenate([probs[p["id"]][s] for s in sch]).astype(np.float32) for p in keep
            ]
            variants[f"{name}, {k} classes"] = (
                "max",
                np.stack([sparsify(r.max(0), k) for r in reg]),
            )
    reg = [
        np.concatenate([probs[p["id"]][s] for s in ("cur", "g40")]).astype(np.float32) for p in keep
    ]
    tiles = [np.stack([sparsify(t, 20) for t in r]) for r in reg]
    variants["6 of 60% + 12 of 40%, best single tile (20 classes a tile)"] = ("tile", tiles)
    words = sorted({w for p in keep for w in closure(p["labels"], data["implies"])})
    base: dict[str, list[Any]] = {f.name: [] for f in dataclasses.fields(Pairs)}
    e_reg: dict[str, list[float]] = {n: [] for n in variants}
    for w, broader, wt, face_w in word_weights(scorer, words):
        wc = wt[:n_cls]
        e_w = whole @ wc
        face = np.asarray(codes[:, scorer.face].toarray()).ravel() * face_w if face_w else 0 * e_w
        ev = {
            n: (v @ wc if kind == "max" else np.array([(t @ wc).max() for t in v]))
            for n, (kind, v) in variants.items()
        }
        for i, p, y in labelled(keep, w, data["implies"]):
            for f, v in (("word", w), ("photo", p["id"]), ("source", p["source"])):
                base[f].append(v)
            base["y"].append(y)
            base["e_whole"].append(e_w[i])
            base["e_region"].append(0.0)
            base["face"].append(face[i])
            base["broader"].append(int(broader))
            for n in ev:
                e_reg[n].append(float(ev[n][i]))
    arrays = {k: np.asarray(v) for k, v in base.items()}
    out: dict[str, Any] = {}
    for n in variants:
        pr = Pairs(**{**arrays, "e_region": np.asarray(e_reg[n])})
        y = pr.y == 1
        has = (pr.e_whole > 0) | (pr.e_region > 0) | (pr.face > 0)
        lo = leave_one_source_out(pr, groups, None)
        lo_ex = leave_one_source_out(pr, groups, (1.0,), 10.0)
        out[n] = {
            "labelled_with_evidence": round(float(has[y].mean()), 4),
            "absent_with_evidence": round(float(has[~y].mean()), 4),
            "labelled_at_p0": round(float((lo["predictions"][y] == 0).mean()), 4),
            "wanted_auc": lo["auc"],
            "wanted_ece": lo["pooled"]["ece"],
            "left_out_auc": lo_ex["auc"],
            "left_out_ece": lo_ex["pooled"]["ece"],
        }
        print(n, out[n], flush=True)
    return {"pairs": len(arrays["y"]), "positives": int(arrays["y"].sum()), "settings": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--up", type=Path, required=True, help="an earlier `sparsemm up` output")
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=None, help="read only the first N photos")
    args = ap.parse_args(argv)
    from sparsemm import Searcher
    from sparsemm.io import write_json

    searcher = Searcher(args.up / "collection")
    args.out.mkdir(parents=True, exist_ok=True)
    probs = read_probs(searcher, args.limit)
    np.savez_compressed(
        args.out / "probs.npz", **{f"{k}|{n}": v for k, r in probs.items() for n, v in r.items()}
    )
    metrics = evaluate(searcher, probs) | {"git_commit": git_commit(), "limit": args.limit}
    write_json(args.out / "metrics.json", metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
