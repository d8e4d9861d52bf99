"""Draw the README's picture from the outputs of `sparsemm demo`.

One query over the demo's test collages, ranked twice: by the dense single-line query (the
sentence as one embedding, strategy `slq`) and by the served default. Results that show
the excluded object get a red frame (from the collages' labels). The two grids are stacked
into one PNG.

    python scripts/readme_figure.py runs/collages-demo/collection -o docs/demo-results.png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from PIL import Image

from sparsemm import Searcher, parse_query
from sparsemm.query.request import percent
from sparsemm_experiments.viz.report import ResultItem, result_grid_png

QUERY = "a sneaker but not a bag"


def grid(searcher: Searcher, query: str, strategy: str | None, k: int, out: Path) -> Path:
    q = parse_query(query)
    hits = searcher.search(q, k=k, strategy=strategy)
    used = strategy or searcher.default_strategy
    shown = searcher.probabilistic(used)  # match probabilities as the CLI shows them
    items = []
    for h in hits:
        item = searcher.collection.items[h.row]
        image = item.get("image")
        path = Path(str(image)) if image else None
        if path is not None and not path.is_absolute():
            path = searcher.collection.root / path
        labels = [str(x) for x in item.get("labels", [])]
        items.append(
            ResultItem(
                id=h.id,
                image=str(path) if path else None,
                score=h.score,
                labels=labels,
                caption=h.caption,
                violates=any(b in labels for b in q.exclude),
                score_text=percent(h.score) if shown else "",
            )
        )
    bad = sum(i.violates for i in items)
    who = "dense, the sentence as one embedding" if used == "slq" else "sparsemm's default"
    title = f"{who} [{used}]: {bad} of {len(items)} show a {', '.join(q.exclude)}"
    return result_grid_png(items, out, cols=k, thumb=112, title=title)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("collection", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=Path("docs/demo-results.png"))
    ap.add_argument("--query", default=QUERY)
    ap.add_argument("-k", type=int, default=6)
    args = ap.parse_args()
    searcher = Searcher(args.collection)
    with tempfile.TemporaryDirectory() as tmp:
        parts = [
            Image.open(grid(searcher, args.query, s, args.k, Path(tmp) / f"{i}.png"))
            for i, s in enumerate(("slq", None))
        ]
        width = max(p.width for p in parts)
        canvas = Image.new("RGB", (width, sum(p.height for p in parts)), "white")
        y = 0
        for p in parts:
            canvas.paste(p, (0, y))
            y += p.height
        args.out.parent.mkdir(parents=True, exist_ok=True)
        canvas.save(args.out, optimize=True)
    print(f"{args.out}: {canvas.width}x{canvas.height}, {args.out.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
