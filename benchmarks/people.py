"""How the photo model finds people, and what a classical person detector would add.

Reads the collection ``benchmarks/real_photos.py`` built (``OUT/up/collection``) and the
labelled photo files, and counts, over photos labelled with a person (a photo whose
"maybe" names a person is left out) and over the others, how many each kind of evidence
finds:

- a face: the face unit's P(person) at 0.5 or more;
- the classes that imply a person (what people wear or hold) over the whole photo, and
  over its tiles, at 0.1 / 0.3 of summed probability;
- with ``--hog`` (needs ``opencv-python-headless``, not a dependency): OpenCV's HOG people
  detector (Dalal and Triggs' linear SVM, OpenCV's default coefficients) on the photo
  shrunk to 800 pixels, at SVM margins 0.3 / 0.5 / 0.8, alone and beside the others, with
  its seconds a photo.

    python benchmarks/people.py OUT [--hog]

Prints the table and writes ``OUT/people.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from real_photos import closure, data_files, load_all


def hog_margins(photos: dict[str, Path]) -> tuple[dict[str, float], float]:
    """Best HOG people-detector margin per photo (0: none), and seconds a photo."""
    import cv2

    from sparsemm.encoders.hf import load_image

    hog = cv2.HOGDescriptor()
    hog.setSVMDetector(cv2.HOGDescriptor_getDefaultPeopleDetector())
    out = {}
    t0 = time.perf_counter()
    for pid, path in photos.items():
        pil = load_image(path, max_side=800)
        pil.thumbnail((800, 800))
        _, weights = hog.detectMultiScale(
            np.asarray(pil.convert("L")), winStride=(8, 8), padding=(8, 8), scale=1.05
        )
        out[pid] = float(np.max(weights)) if len(weights) else 0.0
    return out, (time.perf_counter() - t0) / max(1, len(photos))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("out", type=Path, help="the folder benchmarks/real_photos.py wrote")
    ap.add_argument("--hog", action="store_true", help="also run OpenCV's HOG people detector")
    args = ap.parse_args(argv)
    from sparsemm import Searcher

    data = load_all(data_files())
    searcher = Searcher(args.out / "up" / "collection")
    scorer = searcher.model.term_scorer()
    concept = scorer.read("person").concepts[0]
    ids = [Path(i).stem for i in searcher.collection.ids]
    codes = searcher.item_codes(np.arange(len(ids)))
    w = scorer._unit_weights(concept).copy()
    w[scorer.face] = 0.0
    whole = np.asarray(codes @ w).ravel()
    region = scorer._region_weights(w)
    tiles = np.asarray(codes @ region).ravel() if region is not None else 0 * whole
    face = np.asarray(codes[:, scorer.face].toarray()).ravel()
    labels = {p["id"]: p for p in data["photos"]}
    keep, y = [], []
    for i, pid in enumerate(ids):
        p = labels.get(pid)
        if p is None:
            continue
        sure = closure(p["labels"], data["implies"])
        if "person" in closure(p.get("maybe", []), data["implies"]) and "person" not in sure:
            continue
        keep.append(i)
        y.append("person" in sure)
    idx, yy = np.asarray(keep), np.asarray(y)
    found: dict[str, np.ndarray] = {
        "face": face[idx] >= 0.5,
        "person classes, whole photo >= 0.1": whole[idx] >= 0.1,
        "person classes, a tile >= 0.1": tiles[idx] >= 0.1,
        "person classes, a tile >= 0.3": tiles[idx] >= 0.3,
    }
    found["face or a tile >= 0.3"] = found["face"] | found["person classes, a tile >= 0.3"]
    extra: dict[str, Any] = {}
    if args.hog:
        files = {
            p.stem: p for p in (args.out / "photos").iterdir() if p.stem in {ids[i] for i in idx}
        }
        margins, seconds = hog_margins(files)
        m = np.asarray([margins.get(ids[i], 0.0) for i in idx])
        extra["hog_seconds_per_photo"] = round(seconds, 3)
        for t in (0.3, 0.5, 0.8):
            found[f"HOG >= {t}"] = m >= t
            found[f"face, a tile >= 0.3 or HOG >= {t}"] = found["face or a tile >= 0.3"] | (m >= t)
    rows = {
        k: {
            "found": round(float(v[yy].mean()), 3),
            "false_alarms": round(float(v[~yy].mean()), 3),
        }
        for k, v in found.items()
    }
    result = {"photos_with_a_person": int(yy.sum()), "others": int((~yy).sum()), **extra}
    result["evidence"] = rows
    print(
        f"{result['photos_with_a_person']} photos with a person, {result['others']} without"
        + (f"; HOG {extra['hog_seconds_per_photo']} s a photo" if extra else "")
    )
    for k, r in rows.items():
        print(f"  {k:42s} finds {r['found']:.3f}   false alarms {r['false_alarms']:.3f}")
    (args.out / "people.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
