"""The demo's HTML report: dense and SR results side by side for "A but not B" queries.

For each example query the report shows the top results of a dense single-line query (the
whole sentence embedded, negation left to the encoder), of the dense baseline and of SR
(each with the strategy parameters the benchmark chose on the train split), marks results
that carry an excluded concept, explains every SR result (matched concept dimensions with
their contributions, excluded concepts checked) and draws word clouds of the concept
dimensions involved. The benchmark table (every strategy, all metrics) comes from the
benchmark's ``metrics.json``. Rendering: :mod:`sparsemm_experiments.viz.report`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.query.hits import Hit
from sparsemm.query.parse import parse_query
from sparsemm.query.searcher import Searcher
from sparsemm_experiments.naming import dimension_word_scores

log = logging.getLogger(__name__)

DENSE_STRATEGY = "avg_emb_0.5"  # the SR paper's strongest dense baseline
# the plain dense query ("a photo of a A without a B" as one sentence): what the served
# default is compared with, so the violations it avoids are visible side by side
SLQ_STRATEGY = "slq"
SPARSE_STRATEGY = "match"  # the served default (sparsemm.query.request.DEFAULT_STRATEGY)
N_CLOUD_WORDS = 30
TABLE_METRICS = ("ap@10", "ndcg@10", "mrr@10", "violation@10", "inclusion@10")


def _image_path(col: Collection, row: int) -> str:
    img = str(col.items[row].get("image") or "")
    p = Path(img)
    return str((p if p.is_absolute() else (col.root / p)).resolve())


def bench_table(bench: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): every strategy's means on all and hard queries from metrics.json."""
    subsets = bench.get("subsets", {})
    header = ["method"]
    for sub in ("all", "hard"):
        n = subsets.get(sub, {}).get("n_queries", 0)
        header += [f"{m} ({sub}, {n} q)" for m in TABLE_METRICS]
    rows = []
    for name in bench.get("methods", []):
        row = [str(name)]
        for sub in ("all", "hard"):
            means = subsets.get(sub, {}).get("means", {}).get(name, {})
            row += [f"{means[m]:.3f}" if m in means else "–" for m in TABLE_METRICS]
        rows.append(row)
    return header, rows


def method_legend(names: Sequence[str]) -> dict[str, str]:
    """Method (strategy) name -> one line on what it is, from the strategy registry; the
    result columns are named "dense: NAME" / "SR: NAME" after these."""
    from sparsemm.query.strategies import STRATEGIES

    legend: dict[str, str] = {}
    for name in dict.fromkeys(names):
        spec = STRATEGIES.get(name)
        if spec is not None:
            served = " — the served default" if name == SPARSE_STRATEGY else ""
            legend[name] = spec.description + served
    return legend


def _column(
    col: Collection, hits: Sequence[Hit], exclude: Sequence[str], include: Sequence[str]
) -> tuple[list[Any], dict[str, float]]:
    from sparsemm_experiments.viz.report import ResultItem

    items = []
    n_viol = n_incl = 0
    for h in hits:
        labels = set(h.labels)
        violates = any(b in labels for b in exclude)
        n_viol += violates
        n_incl += all(a in labels for a in include)
        items.append(
            ResultItem(
                id=h.id,
                image=_image_path(col, h.row),
                score=h.score,
                labels=list(h.labels),
                caption=h.caption,
                violates=violates,
                matched=[(c.dim, c.weight, list(c.words)) for c in h.matched],
                excluded=[(e.term, list(e.dims), e.item_mass, list(e.words)) for e in h.excluded],
            )
        )
    k = max(len(hits), 1)
    return items, {"includes A": n_incl / k, "carries B": n_viol / k}


def write_demo_report(
    out_dir: str | Path,
    col: Collection,
    bench: Mapping[str, Any] | None,
    queries: Sequence[str],
    n_results: int,
    timings: Mapping[str, float],
    text_encoder: Any = None,
    dense_strategy: str = DENSE_STRATEGY,
    sparse_strategy: str = SPARSE_STRATEGY,
    commands: Sequence[str] = (),
    slq_strategy: str | None = SLQ_STRATEGY,
) -> Path:
    """Write ``out_dir/index.html`` for an indexed collection (see the module docstring)."""
    from sparsemm_experiments.viz.report import DemoReport, QueryPanel, render_demo_report
    from sparsemm_experiments.viz.wordcloud import concept_cloud

    out = Path(out_dir)
    (out / "clouds").mkdir(parents=True, exist_ok=True)
    searcher = Searcher(col.root, encoder=text_encoder)
    chosen = dict((bench or {}).get("tuning", {}).get("chosen", {}))
    words, score, _ = dimension_word_scores(
        searcher.codes, [list(it.get("captions", [])) for it in col.items]
    )
    cloud_files: dict[int, str] = {}

    def cloud(dim: int) -> str | None:
        if dim not in cloud_files:
            best = np.argsort(-score[dim], kind="stable")[:N_CLOUD_WORDS]
            weights = {str(words[b]): float(score[dim, b]) for b in best if score[dim, b] > 0}
            if not weights:
                return None
            path = out / "clouds" / f"dim{dim}.png"
            concept_cloud(weights, path)
            cloud_files[dim] = str(path.resolve())
        return cloud_files[dim]

    model_name = (
        f"{searcher.model.kind.upper()} model {Path(str(searcher.index.meta['model'])).name}"
    )
    slq_name = f"dense: {slq_strategy}"
    dense_name = f"dense: {dense_strategy}"
    sparse_name = f"SR: {sparse_strategy}"
    methods = [(sparse_name, sparse_strategy), (dense_name, dense_strategy)]
    if slq_strategy is not None:
        methods.insert(0, (slq_name, slq_strategy))
    panels = []
    for text in queries:
        q = parse_query(text)
        columns: dict[str, list[Any]] = {}
        metrics: dict[str, dict[str, float]] = {}
        hits_of: dict[str, list[Hit]] = {}
        try:
            for name, strategy in methods:
                hits_of[name] = searcher.search(
                    q, k=n_results, strategy=strategy, **chosen.get(strategy, {})
                )
                columns[name], metrics[name] = _column(col, hits_of[name], q.exclude, q.include)
        except SparsemmError as exc:  # the model refuses it ("shirt but not t-shirt")
            log.warning("the report leaves out %r: %s", text, exc)
            continue
        sr_hits = hits_of[sparse_name]
        # The concept dimensions involved: the include term's strongest dims among the
        # SR results' matches, then each excluded term's dims.
        dims: list[tuple[str, int]] = []
        for h in sr_hits[:3]:
            dims += [(f"matched by '{' and '.join(q.include)}'", c.dim) for c in h.matched[:2]]
        if sr_hits:
            for e in sr_hits[0].excluded:
                dims += [(f"excluded: '{e.term}'", j) for j in e.dims[:2]]
        clouds = []
        seen: set[int] = set()
        for why, j in dims:
            if j in seen:
                continue
            seen.add(j)
            png = cloud(j)
            if png is not None:
                clouds.append((f"{model_name}, dimension {j}: {why}", png))
        panels.append(
            QueryPanel(
                query=text,
                include=list(q.include),
                exclude=list(q.exclude),
                columns=columns,
                metrics=metrics,
                clouds=clouds[:6],
            )
        )
    tables = []
    if bench is not None:
        header, rows = bench_table(bench)
        tables.append(("Exclusion benchmark on the test collages (means)", header, rows))
    n_test = int(col.split_mask("test").sum())
    summary = (
        f"{len(col.items)} collages of real Fashion-MNIST photos ({n_test} test), EfficientNet-"
        "Lite0 image features and MiniLM caption embeddings. Dense = a linear contrastive "
        "alignment of the same features (LiT-style), SR = sparse concept codes trained on the "
        "same pairs. Results are searched over the whole collection; a red border marks a "
        "result that shows the excluded item. Strategy parameters were chosen on the train "
        "split by the benchmark."
    )
    report = DemoReport(
        legend=method_legend(
            [s for _, s in methods] + [str(m) for m in (bench or {}).get("methods", [])]
        ),
        title="sparsemm demo: 'A but not B' on Fashion-MNIST collages",
        summary_md=summary,
        panels=panels,
        tables=tables,
        timings=dict(timings),
        commands=list(commands),
    )
    return render_demo_report(out, report)
