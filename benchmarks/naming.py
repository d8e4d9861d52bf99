"""How well concept dimensions are named: label precision@50, held out, before and after.

Names are computed from the codes and captions of the collection's ``train`` items and
measured on its ``test`` items (so a name cannot fit the very items it is scored on):

* dims: for each dimension some test item activates, the share of its 50 highest-valued
  test items whose captions (or labels) mention its first name; mean over those dims;
* chips: for "A but not B" label-pair queries served by ``Searcher.search``, the share of
  the top-10 hits whose first concept chip (the best matched dimension's first name, as the
  web page shows it) is mentioned by that hit's captions or labels.

Namers: "lift words" (the caption words most over-represented among a dimension's items,
the earlier naming, kept as the baseline to beat) and
``sparsemm.query.naming.top_share_names`` at several base-rate weights (the vocabulary
terms most shared by a dimension's top items, minus a share of their base rate; template
words never name a dimension).

    python benchmarks/naming.py runs/collages-demo/collection runs/demo/collection
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import Counter

import numpy as np

from sparsemm.query.naming import mentions, top_share_names
from sparsemm.query.searcher import Searcher
from sparsemm.text import CaptionIndex
from sparsemm_experiments.naming import dimension_labels, label_precision


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("collections", nargs="+")
    ap.add_argument("--queries", type=int, default=60, help="label pairs for the chip check")
    ap.add_argument("--base-rates", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    args = ap.parse_args()
    for col in args.collections:
        s = Searcher(col)
        if s.model.detectors is None:
            raise SystemExit(f"{col}: the model has no detectors (`sparsemm train detectors`)")
        items = s.collection.items
        caps = [list(it.get("captions", [])) for it in items]
        labs = [list(it.get("labels") or []) for it in items]
        tr = np.array([i for i, it in enumerate(items) if it.get("split") != "test"])
        te = np.array([i for i, it in enumerate(items) if it.get("split") == "test"])
        codes = s.codes
        idx_tr = CaptionIndex([caps[i] for i in tr], [labs[i] for i in tr])
        idx_te = CaptionIndex([caps[i] for i in te], [labs[i] for i in te])
        idx_all = CaptionIndex(caps, labs)
        terms = s.model.detectors.terms
        labels = sorted({x for ls in labs for x in ls})
        rng = np.random.default_rng(0)
        pairs = list(itertools.permutations(labels, 2))
        pairs = [pairs[i] for i in rng.permutation(len(pairs))[: args.queries]]
        ctr, captr = codes[tr], [caps[i] for i in tr]
        namers = {"lift words": lambda ctr=ctr, captr=captr: dimension_labels(ctr, captr)}
        for b in args.base_rates:
            namers[f"top share - {b:g} x base"] = lambda b=b, ctr=ctr, idx_tr=idx_tr, terms=terms: (
                top_share_names(ctr, idx_tr, terms, base_rate=b)
            )
        print(f"{col}: names from {len(tr)} train items, measured on {len(te)} test items")
        print(f"{'namer':>24} {'dims P@50':>10} {'chips P':>8} {'distinct':>9} {'s':>6}  most used")
        for name, make in namers.items():
            t0 = time.perf_counter()
            names = make()
            secs = time.perf_counter() - t0
            dims_p, _ = label_precision(codes[te], idx_te, names)
            s.labels_data = names
            pad = itertools.zip_longest(names, s.labels_spine, range(s.dim), fillvalue=[])
            s.dim_labels = [n or w for n, w, _ in pad]
            hit_ok = []
            for a, b in pairs:
                for h in s.search(f"{a} but not {b}", k=10):
                    chip = h.matched[0].words[0] if h.matched and h.matched[0].words else None
                    hit_ok.append(chip is not None and bool(mentions(idx_all, chip)[h.row]))
            c = Counter(n[0] for n in names if n)
            top = ", ".join(f"{w} {k}" for w, k in c.most_common(4))
            print(
                f"{name:>24} {dims_p:10.3f} {np.mean(hit_ok):8.3f} {len(c):9d} {secs:6.1f}  {top}"
            )


if __name__ == "__main__":
    main()
