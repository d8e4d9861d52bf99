"""The exclusion benchmark: query builder from item labels, significance tests, reports.

Builder (the label-pair protocol, docs/negation.md): queries are ordered label pairs (A, B),
A != B, kept when at least one evaluation item carries both; the relevant set is the
evaluation items labelled A and not B; a query with no relevant item is dropped. A query
is "hard" when |items with A and B| / |items with A| >= 0.25 on the evaluation items. On the
COCO val2017 ``test`` split this gives 1,979 queries, 263 of them hard.

Reporting: per-query metric arrays ``{method: {metric: (q,) array}}`` -> means per subset,
paired t-tests against named baselines, Markdown tables and bar plots, all written by
:func:`write_report` into one run folder (``config.json`` with the git commit,
``metrics.json``, ``per_query.npz``, ``report.md``, ``plot_<subset>.png``). The tables are
rendered from the ``metrics.json`` content, never typed.
"""

from __future__ import annotations

import io as _stdio
import logging
import math
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, read_json, write_json
from sparsemm_experiments.eval.metrics import higher_is_better, parse_metric_name
from sparsemm_experiments.eval.tables import md_table

logger = logging.getLogger(__name__)

PerQuery = Mapping[str, Mapping[str, np.ndarray]]  # method -> metric -> (q,) values
Summary = dict[str, dict[str, float]]  # method -> metric -> mean
PValues = dict[str, dict[str, dict[str, float]]]  # baseline -> method -> metric -> p

# One marker per baseline, in the order the baselines are named.
MARKERS = ("†", "‡", "§", "¶", "#")
METRICS_FORMAT = "sparsemm.benchmark.metrics"
METRICS_VERSION = 1
_DECIMALS = 3


# ---------------------------------------------------------------------------- builder


@dataclass(frozen=True, eq=False)
class ExclusionQuery:
    """One "A but not B" query over the evaluation items (indices into that list).

    ``relevant``: items with A and without B; ``a_items`` / ``b_items``: all items carrying
    A / B (for inclusion@k / violation@k); ``hard``: |A and B| / |A| >= the threshold.
    All index arrays are sorted int64.
    """

    a: str
    b: str
    relevant: np.ndarray
    a_items: np.ndarray
    b_items: np.ndarray
    hard: bool

    @property
    def n_both(self) -> int:
        """Number of evaluation items carrying both A and B."""
        return len(self.a_items) - len(self.relevant)

    @property
    def text(self) -> str:
        """The query as a user would type it."""
        return f"{self.a} but not {self.b}"


def build_exclusion_queries(
    labels: Sequence[Sequence[str]], min_both: int = 1, hard_threshold: float = 0.25
) -> list[ExclusionQuery]:
    """All ordered label pairs (A, B) of the benchmark, sorted by (A, B).

    ``labels[i]`` lists the labels of evaluation item i. A pair is kept when at least
    ``min_both`` items carry both A and B and at least one item carries A without B;
    ``hard`` = |A and B| / |A| >= ``hard_threshold``.
    """
    if isinstance(min_both, bool) or not isinstance(min_both, int) or min_both < 1:
        raise SparsemmError(f"min_both must be an integer >= 1, got {min_both!r}")
    if not 0.0 <= hard_threshold <= 1.0:
        raise SparsemmError(f"hard_threshold must lie in [0, 1], got {hard_threshold!r}")
    if isinstance(labels, str):
        raise SparsemmError("labels must be one list of label names per item, not a string")
    item_sets: list[set[str]] = []
    for i, item in enumerate(labels):
        if isinstance(item, str) or not all(isinstance(x, str) for x in item):
            raise SparsemmError(
                f"labels[{i}] must be a list of label names (e.g. ['dog', 'person']), got {item!r}"
            )
        item_sets.append(set(item))
    vocab = sorted(set().union(*item_sets)) if item_sets else []
    col = {name: j for j, name in enumerate(vocab)}
    has = np.zeros((len(item_sets), len(vocab)), dtype=bool)  # (n_items, n_labels)
    for i, s in enumerate(item_sets):
        has[i, [col[x] for x in s]] = True
    count = has.sum(axis=0)  # |A| per label
    both = has.T.astype(np.int64) @ has.astype(np.int64)  # (L, L): |A and B|
    members = [np.flatnonzero(has[:, j]).astype(np.int64) for j in range(len(vocab))]

    queries: list[ExclusionQuery] = []
    for ia, a in enumerate(vocab):
        for ib, b in enumerate(vocab):
            n_both = int(both[ia, ib])
            if ia == ib or n_both < min_both or n_both == count[ia]:
                continue
            queries.append(
                ExclusionQuery(
                    a=a,
                    b=b,
                    relevant=np.flatnonzero(has[:, ia] & ~has[:, ib]).astype(np.int64),
                    a_items=members[ia],
                    b_items=members[ib],
                    hard=bool(n_both / count[ia] >= hard_threshold),
                )
            )
    logger.info(
        "%d exclusion queries (%d hard) over %d items and %d labels",
        len(queries),
        sum(q.hard for q in queries),
        len(item_sets),
        len(vocab),
    )
    return queries


def query_matrices(
    queries: Sequence[ExclusionQuery], n_items: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean ``(q, n_items)`` matrices (relevant, carries A, carries B) for the queries,
    ready for ``evaluate_rankings(..., excluded=b, included=a)``."""
    rel = np.zeros((len(queries), n_items), dtype=bool)
    a = np.zeros_like(rel)
    b = np.zeros_like(rel)
    for i, q in enumerate(queries):
        rel[i, q.relevant] = True
        a[i, q.a_items] = True
        b[i, q.b_items] = True
    return rel, a, b


def hard_mask(queries: Sequence[ExclusionQuery]) -> np.ndarray:
    """``(q,)`` bool: which queries are hard."""
    return np.array([q.hard for q in queries], dtype=bool)


# ------------------------------------------------------------------------ statistics


def paired_ttest(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sided paired t-test of per-query values ``a`` vs ``b`` (scipy.stats.ttest_rel).

    t = mean(d) / (std(d, ddof=1) / sqrt(n)) with d = a - b. Identical arrays (all d = 0)
    give (0.0, 1.0); a constant non-zero difference (equal up to rounding) gives
    (+-inf, 0.0); fewer than two pairs give (nan, 1.0) since no test is possible.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise SparsemmError(
            f"paired t-test needs two 1-D arrays of the same length, got {a.shape} and {b.shape}"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise SparsemmError("paired t-test: per-query values contain NaN or inf")
    if len(a) < 2:
        return math.nan, 1.0
    d = a - b
    # Zero variance (up to rounding): scipy would divide by ~zero and warn.
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if float(np.ptp(d)) <= tol:
        mean = float(d.mean())
        if abs(mean) <= tol:
            return 0.0, 1.0
        return math.copysign(math.inf, mean), 0.0
    from scipy.stats import ttest_rel

    res = ttest_rel(a, b)
    return float(res.statistic), float(res.pvalue)


def _check_per_query(per_query: PerQuery, metrics: Sequence[str] | None = None) -> int:
    """Validate the nested dict; return the number of queries."""
    if not per_query:
        raise SparsemmError("no methods to report: per_query is empty")
    n: int | None = None
    for method, values in per_query.items():
        for metric in metrics if metrics is not None else values:
            if metric not in values:
                raise SparsemmError(f"method {method!r} has no values for metric {metric!r}")
            arr = np.asarray(values[metric])
            if arr.ndim != 1:
                raise SparsemmError(f"{method}/{metric}: expected a 1-D per-query array")
            if n is None:
                n = len(arr)
            elif len(arr) != n:
                raise SparsemmError(
                    f"{method}/{metric} has {len(arr)} per-query values, others have {n}"
                )
    return n or 0


def _mask(subset_mask: np.ndarray | None, n: int) -> np.ndarray:
    if subset_mask is None:
        return np.ones(n, dtype=bool)
    mask = np.asarray(subset_mask)
    if mask.dtype != bool or mask.shape != (n,):
        raise SparsemmError(f"a subset mask must be a boolean array of shape ({n},)")
    return mask


def summarize(per_query: PerQuery, subset_mask: np.ndarray | None = None) -> Summary:
    """Mean of every per-query array, over the queries selected by ``subset_mask``.

    Returns ``{method: {metric: mean}}``; the mean of an empty subset is NaN.
    """
    n = _check_per_query(per_query)
    mask = _mask(subset_mask, n)
    out: Summary = {}
    for method, values in per_query.items():
        out[method] = {}
        for metric, arr in values.items():
            sel = np.asarray(arr, dtype=np.float64)[mask]
            out[method][metric] = float(sel.mean()) if sel.size else math.nan
    return out


def significance(
    per_query: PerQuery,
    metrics: Sequence[str],
    baselines: Sequence[str],
    subset_mask: np.ndarray | None = None,
) -> PValues:
    """p-values of :func:`paired_ttest` for every (baseline, other method, metric)."""
    n = _check_per_query(per_query, metrics)
    mask = _mask(subset_mask, n)
    out: PValues = {}
    for base in baselines:
        if base not in per_query:
            raise SparsemmError(
                f"baseline {base!r} is not among the methods ({', '.join(per_query)})"
            )
        out[base] = {}
        for method in per_query:
            if method == base:
                continue
            out[base][method] = {
                metric: paired_ttest(
                    np.asarray(per_query[method][metric])[mask],
                    np.asarray(per_query[base][metric])[mask],
                )[1]
                for metric in metrics
            }
    return out


# ---------------------------------------------------------------------------- tables


def _as_list(baseline: str | Sequence[str] | None) -> list[str]:
    if baseline is None:
        return []
    return [baseline] if isinstance(baseline, str) else list(baseline)


def _count(n: int) -> str:
    return f"{n} query" if n == 1 else f"{n} queries"


def _fmt(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{_DECIMALS}f}"


def markdown_table(
    summary: Mapping[str, Mapping[str, float | None]],
    metrics: Sequence[str],
    per_query: PerQuery | None = None,
    baseline: str | Sequence[str] | None = None,
    alpha: float = 0.05,
    *,
    subset_mask: np.ndarray | None = None,
    p_values: Mapping[str, Mapping[str, Mapping[str, float | None]]] | None = None,
    n_queries: int | None = None,
) -> str:
    """A Markdown table: one row per method, one column per metric, plus a legend.

    The best value per column (after rounding to 3 decimals; the lowest for violation@k)
    is **bold**. A method that differs from the i-th baseline at p < ``alpha`` (two-sided
    paired t-test over the per-query values, restricted to ``subset_mask``) carries that
    baseline's marker (†, ‡, §, ¶, #). The p-values come from ``p_values``
    (``{baseline: {method: {metric: p}}}``, as stored in metrics.json) or are computed from
    ``per_query``.
    """
    baselines = _as_list(baseline)
    if len(baselines) > len(MARKERS):
        raise SparsemmError(f"at most {len(MARKERS)} baselines can be marked in one table")
    for name in baselines:
        if name not in summary:
            raise SparsemmError(
                f"baseline {name!r} is not among the methods ({', '.join(summary)})"
            )
    for metric in metrics:
        parse_metric_name(metric)
    if baselines and p_values is None:
        if per_query is None:
            raise SparsemmError("significance markers need per_query values or p_values")
        p_values = significance(per_query, metrics, baselines, subset_mask)
        if n_queries is None:
            n_queries = int(_mask(subset_mask, _check_per_query(per_query, metrics)).sum())

    best: dict[str, float] = {}
    for metric in metrics:
        vals = [
            round(float(v), _DECIMALS)
            for m in summary
            if (v := summary[m].get(metric)) is not None and math.isfinite(v)
        ]
        if vals:
            best[metric] = max(vals) if higher_is_better(metric) else min(vals)

    rows = []
    for method, row in summary.items():
        cells = []
        for metric in metrics:
            value = row.get(metric)
            cell = _fmt(value)
            if value is not None and math.isfinite(value):
                if round(float(value), _DECIMALS) == best.get(metric):
                    cell = f"**{cell}**"
                for marker, base in zip(MARKERS[: len(baselines)], baselines, strict=True):
                    p = (p_values or {}).get(base, {}).get(method, {}).get(metric)
                    if method != base and p is not None and p < alpha:
                        cell += marker
            cells.append(cell)
        rows.append([method, *cells])
    lines = md_table(["method", *metrics], rows, "l" + "r" * len(metrics))

    legend = []
    over = f" over {_count(n_queries)}" if n_queries is not None else ""
    for marker, base in zip(MARKERS[: len(baselines)], baselines, strict=True):
        legend.append(
            f"{marker} differs from {base} at p < {alpha:g} (two-sided paired t-test{over})."
        )
    lower = [m for m in metrics if not higher_is_better(m)]
    legend.append(
        "**Bold**: best in column"
        + (f" (lower is better for {', '.join(lower)})." if lower else ".")
    )
    return "\n".join(lines) + "\n\n" + "  \n".join(legend) + "\n"


# ----------------------------------------------------------------------------- plots


def bar_plot(
    summary: Mapping[str, Mapping[str, float | None]],
    metrics: Sequence[str],
    path: str | Path,
    title: str | None = None,
) -> Path:
    """Write a PNG bar chart grouped by metric, one bar per method; returns ``path``."""
    # The object-oriented API with an Agg canvas: no pyplot global state, no display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    methods = list(summary)
    if not methods or not metrics:
        raise SparsemmError("bar_plot needs at least one method and one metric")
    fig = Figure(figsize=(max(4.0, 1.0 + len(metrics) * (0.4 + 0.25 * len(methods))), 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(metrics))
    width = 0.8 / len(methods)
    top = 0.0
    for i, method in enumerate(methods):
        vals = [summary[method].get(m) for m in metrics]
        heights = [v if v is not None and math.isfinite(v) else 0.0 for v in vals]
        top = max(top, *heights)
        ax.bar(x - 0.4 + width * (i + 0.5), heights, width, label=method)
    ax.set_xticks(x)
    ax.set_xticklabels(metrics)
    ax.set_ylim(0.0, max(1.0, top * 1.05))
    ax.set_ylabel("mean over queries")
    if title:
        ax.set_title(title)
    ax.legend(fontsize="small", ncol=min(len(methods), 4), loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buf = _stdio.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        fh.write(buf.getvalue())
    return path


# ---------------------------------------------------------------------------- report


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy scalars/arrays, paths, tuples, sets; NaN/inf -> None."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def git_commit(cwd: str | Path | None = None) -> str:
    """``git rev-parse HEAD`` of the source checkout (or ``cwd``), else ``"unknown"``."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = res.stdout.strip()
    return commit if res.returncode == 0 and commit else "unknown"


def _file_stem(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("._") or "subset"


def write_report(
    out_dir: str | Path,
    config: Mapping[str, Any],
    per_query: PerQuery,
    subsets: Mapping[str, np.ndarray] | None,
    metrics: Sequence[str],
    baselines: str | Sequence[str] | None = None,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Write a benchmark run folder and return the ``metrics.json`` content.

    Files: ``config.json`` (``config`` plus ``git_commit``), ``metrics.json`` (per subset:
    ``n_queries``, ``means[method][metric]``, ``p_values[baseline][method][metric]``),
    ``per_query.npz`` (keys ``"<method>|<metric>"`` and ``"subset|<name>"``), ``report.md``
    (rendered from the metrics.json content by :func:`render_report`) and
    ``plot_<subset>.png``. ``subsets`` maps names to boolean ``(q,)`` masks; None means one
    subset ``"all"``.
    """
    out = Path(out_dir)
    n = _check_per_query(per_query, metrics)
    for metric in metrics:
        parse_metric_name(metric)
    bases = _as_list(baselines)
    if len(bases) > len(MARKERS):
        raise SparsemmError(f"at most {len(MARKERS)} baselines can be compared")
    if subsets is None:
        subsets = {"all": np.ones(n, dtype=bool)}
    masks = {name: _mask(mask, n) for name, mask in subsets.items()}
    stems = [_file_stem(name) for name in masks]
    if len(set(stems)) != len(stems):
        raise SparsemmError(f"subset names {list(masks)} collide as file names; rename them")

    cfg = dict(config)
    cfg.setdefault("git_commit", git_commit())
    write_json(out / "config.json", jsonable(cfg))

    arrays: dict[str, np.ndarray] = {}
    for method, values in per_query.items():
        if "|" in method:
            raise SparsemmError(f"method name {method!r} must not contain '|'")
        for metric in metrics:
            arrays[f"{method}|{metric}"] = np.asarray(values[metric], dtype=np.float64)
    for name, mask in masks.items():
        arrays[f"subset|{name}"] = mask
    with atomic_open(out / "per_query.npz", "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]

    content: dict[str, Any] = {
        "format": METRICS_FORMAT,
        "version": METRICS_VERSION,
        "git_commit": cfg["git_commit"],
        "metrics": list(metrics),
        "methods": list(per_query),
        "baselines": bases,
        "alpha": alpha,
        "test": "two-sided paired t-test (scipy.stats.ttest_rel) over per-query values",
        "per_query_file": "per_query.npz",
        "subsets": {},
    }
    for name, mask in masks.items():
        selected = {m: {k: per_query[m][k] for k in metrics} for m in per_query}
        content["subsets"][name] = {
            "n_queries": int(mask.sum()),
            "plot": f"plot_{_file_stem(name)}.png",
            "means": summarize(selected, mask),
            "p_values": significance(per_query, metrics, bases, mask) if bases else {},
        }
    content = jsonable(content)
    write_json(out / "metrics.json", content)

    for name, sub in content["subsets"].items():
        bar_plot(sub["means"], metrics, out / sub["plot"], title=f"{name} ({sub['n_queries']})")
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(render_report(content, cfg))
    logger.info("wrote benchmark report to %s", out)
    return content


def read_per_query(
    run_dir: str | Path,
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A run folder's ``per_query.npz`` as written by :func:`write_report`: per-query values
    ``{method: {metric: (q,)}}`` and the subset masks ``{name: (q,) bool}``."""
    with np.load(Path(run_dir) / "per_query.npz", allow_pickle=False) as z:
        arrays = {k: np.asarray(z[k]) for k in z.files}
    per: dict[str, dict[str, np.ndarray]] = {}
    subsets: dict[str, np.ndarray] = {}
    for key, val in arrays.items():
        head, name = key.split("|", 1)
        if head == "subset":
            subsets[name] = val.astype(bool)
        else:
            per.setdefault(head, {})[name] = val
    return per, subsets


def render_report(content: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> str:
    """``report.md`` text from ``metrics.json`` content: one table per subset."""
    title = (config or {}).get("name") or "Benchmark report"
    lines = [f"# {title}", "", f"Commit: `{content.get('git_commit', 'unknown')}`", ""]
    metrics = content["metrics"]
    for name, sub in content["subsets"].items():
        lines += [f"## {name} ({_count(sub['n_queries'])})", ""]
        lines.append(
            markdown_table(
                sub["means"],
                metrics,
                baseline=content.get("baselines") or None,
                alpha=content.get("alpha", 0.05),
                p_values=sub.get("p_values") or {},
                n_queries=sub["n_queries"],
            )
        )
        if sub.get("plot"):
            lines += [f"![{name}]({sub['plot']})", ""]
    return "\n".join(lines)


def report_from_metrics(run_dir: str | Path) -> str:
    """Re-render ``report.md`` text from a run folder's ``metrics.json`` and config."""
    run = Path(run_dir)
    config_path = run / "config.json"
    config = read_json(config_path) if config_path.is_file() else None
    return render_report(read_json(run / "metrics.json"), config)
