"""A large synthetic collection grown from a real one, for the server and latency targets.

Item i of the new collection copies the metadata (captions, labels, image path, split) of a
source item drawn at random, under a new id, and gets that item's image embedding plus
Gaussian noise (``--noise``, relative to the embedding's unit length), renormalised. No
caption embeddings are written (serving does not read them). Index the result with the
source collection's model, as a user would::

    python benchmarks/grow_collection.py runs/demo/collection runs/coco-100k --items 100000
    sparsemm index runs/coco-100k --model runs/demo/sr --spine runs/demo/spine/vectors
    python benchmarks/load.py --collection runs/coco-100k --clients 100 --duration 30 --fresh-words
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sparsemm.data.collection import open_collection, write_collection
from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows

KEEP = ("captions", "labels", "image", "split")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="an encoded collection")
    ap.add_argument("out", help="the new collection folder (replaced if it exists)")
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--noise", type=float, default=0.05, help="embedding noise (unit scale)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.items < 1:
        raise SystemExit("--items must be >= 1")
    t0 = time.perf_counter()
    try:
        grow(args)
    except SparsemmError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"{args.items} items written to {args.out} in {time.perf_counter() - t0:.1f} s")


def grow(args: argparse.Namespace) -> None:
    col = open_collection(args.source)
    emb = col.image_embeddings()
    rng = np.random.default_rng(args.seed)
    src = rng.integers(0, len(col.items), args.items)
    noise = rng.standard_normal((args.items, emb.shape[1]), dtype=np.float32)
    noise *= np.float32(args.noise / np.sqrt(emb.shape[1]))
    new_emb = np.asarray(normalize_rows(emb[src] + noise), dtype=np.float32)
    items = []
    for i, s in enumerate(src.tolist()):
        it = col.items[s]
        items.append({"id": f"{it['id']}~{i}", **{k: it[k] for k in KEEP if k in it}})
    man = col.manifest
    extra = {k: man[k] for k in ("image_kind",) if k in man}
    extra["grown_from"] = {"source": str(col.root), "seed": args.seed, "noise": args.noise}
    write_collection(
        args.out,
        items,
        dict(man["encoder"]),
        image_emb=new_emb,
        extra=extra,
        text_encoder=dict(man["text_encoder"]) if man.get("text_encoder") else None,
    )


if __name__ == "__main__":
    main()
