"""The exclusion benchmark runner: every strategy, tuned on one split, reported on another.

Protocol (docs/negation.md, the label-pair protocol; SR paper Sec. 5, Tables 1-2):

1. Queries: :func:`~sparsemm_experiments.eval.exclusion.build_exclusion_queries` over the labels of
   the
   evaluation split's items (ordered label pairs "A but not B").
2. Tuning (``tune_split``, default ``train``): the tune split's items are divided at random
   (seeded) into a *tuning evaluation* part (``tune_fraction``) and a *reference* part.
   Queries are built on the tuning evaluation items; the reference part is the captioned
   reference set of the detector strategies, so a detector never sees the captions of the
   items it is scored on. Every grid point of every strategy is evaluated and the one with
   the best mean AP@10 over all tuning queries among those with no more violations than
   ``violation_reference`` is kept (ties: the earlier grid point; see
   :func:`tune_strategies`).
3. Test: each strategy runs with its chosen parameters on the evaluation split, with the
   whole tune split as reference set. Per query: MRR/NDCG/AP @1,3,10, violation@10,
   inclusion@10 (:func:`~.metrics.evaluate_rankings`); means for the subsets
   "all" and "hard" with paired t-tests against the dense baselines, written by
   :func:`~sparsemm_experiments.eval.exclusion.write_report`.
4. Standard retrieval (SR paper Table 2 analogue): image-to-text and text-to-image AP@1/5/10
   of the dense embeddings and of the sparse codes on the evaluation split.

Everything a run used (chosen parameters, tuning grid results, model settings) goes into
``config.json`` / ``metrics.json``; ``report.md`` is rendered from them.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, write_json
from sparsemm.models.detectors import ConceptDetectors
from sparsemm.query.parse import Query
from sparsemm.query.strategies import (
    STRATEGIES,
    ExclusionContext,
    QueryCoder,
    ReferenceSet,
    TextEncoder,
    get_spec,
)
from sparsemm.query.strategies.ranking import rank_query

# register the baselines (slq, paper, cbe, ...) whether or not an install recorded the
# sparsemm.strategies entry points
from sparsemm_experiments.baselines import cbe as _cbe  # noqa: F401
from sparsemm_experiments.baselines import strategies as _baselines  # noqa: F401
from sparsemm_experiments.eval.exclusion import (
    ExclusionQuery,
    build_exclusion_queries,
    hard_mask,
    query_matrices,
    render_report,
    write_report,
)
from sparsemm_experiments.eval.metrics import evaluate_rankings
from sparsemm_experiments.eval.retrieval import multi_target_ap
from sparsemm_experiments.eval.tables import md_table

logger = logging.getLogger(__name__)

KS = (1, 3, 10)
METRICS = (
    *(f"{m}@{k}" for m in ("mrr", "ndcg", "ap") for k in KS),
    "violation@10",
    "inclusion@10",
)
TUNE_METRIC = "ap@10"
# Dense baselines the report marks significance against (those present among the methods):
# the SR paper's best dense baseline here, the include-term reference, the strongest dense.
BASELINES = ("avg_emb_0.5", "dense_a", "dense_detector")

# Codes an item set: dense (n, k) embeddings -> sparse (n, d) codes.
ItemCoder = Callable[[np.ndarray], sp.csr_matrix]


@dataclass(frozen=True)
class BenchConfig:
    split: str = "test"  # evaluation split (queries, items, reported numbers)
    tune_split: str | None = "train"  # split the parameters are chosen on; None: defaults
    # The reference (tune split) items' labels count as mentions for the detectors, as a
    # collection's own tags do in search; False: captions only.
    label_targets: bool = True
    tune_fraction: float = 0.25  # share of the tune split scored during tuning (rest: reference)
    methods: tuple[str, ...] = ()  # strategy names; () = every registered strategy
    limit_items: int | None = None  # quick runs: first N items of each split
    max_grid: int | None = None  # quick runs: at most this many grid points per strategy
    seed: int = 0  # tune-split division
    k: int = 10  # ranking depth scored
    # Tuning keeps grid points with no more violations than this method (None: max AP@10).
    violation_reference: str | None = "avg_emb_0.5"

    def __post_init__(self) -> None:
        if not 0.0 < self.tune_fraction < 1.0:
            raise SparsemmError(f"tune_fraction must be in (0, 1), got {self.tune_fraction}")
        if self.tune_split is not None and self.tune_split == self.split:
            raise SparsemmError(
                f"the tune split and the evaluation split are both {self.split!r}; tune on "
                "another split (e.g. --tune-split train) so test numbers stay unbiased"
            )


@dataclass
class ItemSet:
    """Rows of a collection used as evaluation items or reference items."""

    rows: np.ndarray  # (n,) collection item indices
    dense: np.ndarray  # (n, k)
    codes: sp.csr_matrix | None  # (n, d)
    labels: list[list[str]]
    captions: list[list[str]]


def captions_by_item(collection: Collection) -> list[list[str]]:
    """Each collection item's captions, in item order."""
    out: list[list[str]] = [[] for _ in collection.items]
    for t in collection.texts:
        out[int(t["item"])].append(str(t["text"]))
    return out


def item_set(
    collection: Collection,
    rows: np.ndarray,
    item_coder: ItemCoder | sp.csr_matrix | None,
    captions: list[list[str]],
    dense_all: np.ndarray,
) -> ItemSet:
    """The collection ``rows`` as an :class:`ItemSet`: their dense rows, their codes
    (``item_coder`` applied to them, or rows of precomputed codes), labels and captions."""
    dense = np.ascontiguousarray(dense_all[rows])
    if isinstance(item_coder, sp.spmatrix):  # precomputed codes of every collection item
        codes: sp.csr_matrix | None = sp.csr_matrix(item_coder[rows])
    else:
        codes = sp.csr_matrix(item_coder(dense)) if item_coder is not None else None
    labels = [list(collection.items[r].get("labels") or []) for r in rows]
    return ItemSet(rows, dense, codes, labels, [captions[r] for r in rows])


def split_tune_rows(rows: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The tune split's (scored, reference) rows: a seeded random ``fraction`` is scored,
    the rest is the detectors' reference set (each sorted)."""
    perm = np.random.default_rng(seed).permutation(len(rows))
    n_eval = max(1, round(fraction * len(rows)))
    return np.sort(rows[perm[:n_eval]]), np.sort(rows[perm[n_eval:]])


def evaluate_strategy(
    ctx: ExclusionContext,
    name: str,
    params: Mapping[str, Any],
    queries: Sequence[ExclusionQuery],
    matrices: tuple[np.ndarray, np.ndarray, np.ndarray],
    k: int = 10,
    metrics: Sequence[str] = METRICS,
) -> dict[str, np.ndarray]:
    """Per-query metric arrays of strategy ``name`` with ``params`` on ``queries``, ranked
    by :func:`sparsemm.query.strategies.ranking.rank_query` (the served path) for "A but not B"."""
    strategy = get_spec(name).build(ctx, **params)
    strategy.prepare({t for q in queries for t in (q.a, q.b)})
    rankings = np.full((len(queries), k), -1, dtype=np.int64)
    for i, q in enumerate(queries):
        rows, _ = rank_query(ctx, Query((q.a,), (q.b,)), strategy, k=k)
        rankings[i, : len(rows)] = rows
    rel, has_a, has_b = matrices
    return evaluate_rankings(rankings, rel, list(metrics), excluded=has_b, included=has_a)


def _select(
    rows: list[dict[str, Any]], max_violation: float | None, min_ap: float | None = None
) -> int:
    """Index of the chosen grid row (see :func:`tune_strategies`)."""
    ok = [i for i, r in enumerate(rows) if r.get("ap@10") is not None]
    if max_violation is not None:
        # Usable points: a grid point that keeps less than min_ap (half the reference's
        # AP@10) has emptied its ranking, which violates nothing but answers nothing.
        usable = [i for i in ok if min_ap is None or rows[i]["ap@10"] >= min_ap] or ok
        within = [i for i in usable if rows[i]["violation@10"] <= max_violation + 1e-12]
        if not within:  # nothing meets the bar: the least violating usable point
            return min(usable, key=lambda i: (rows[i]["violation@10"], -rows[i]["ap@10"], i))
        ok = within
    return max(ok, key=lambda i: (rows[i]["ap@10"], -i))


def tune_strategies(
    ctx: ExclusionContext,
    methods: Sequence[str],
    queries: Sequence[ExclusionQuery],
    k: int = 10,
    max_grid: int | None = None,
    violation_reference: str | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Grid search per strategy on ``queries``; returns (chosen params, every grid result).

    Criterion: the highest mean AP@10 over all tuning queries among the grid points whose
    mean violation@10 is no higher than that of ``violation_reference`` (a method run
    first, e.g. the dense Avg Emb baseline) - the operating point "better ranking at no more
    violations". Grid points below half the reference's AP@10 are not eligible (a filter
    that empties the ranking violates nothing); when no eligible point meets the bar, the
    least violating eligible one. Without a reference: the highest mean AP@10 (ties: the
    earlier grid point). ``max_grid`` keeps the first N grid points (quick
    runs). Grid points the context cannot serve (e.g. SPINE dims without ``--spine``) are
    recorded as skipped.
    """
    matrices = query_matrices(queries, ctx.n_items)
    hard = hard_mask(queries)
    chosen: dict[str, dict[str, Any]] = {}
    results: dict[str, list[dict[str, Any]]] = {}
    wanted = (TUNE_METRIC, "violation@10")
    order = list(methods)
    if violation_reference in order:
        order.remove(violation_reference)
        order.insert(0, violation_reference)
    max_violation: float | None = None
    min_ap: float | None = None
    for name in order:
        spec = get_spec(name)
        points = spec.grid_points()[: max_grid or None]
        rows: list[dict[str, Any]] = []
        for point in points:
            t0 = time.perf_counter()
            row: dict[str, Any] = {"params": {**spec.defaults, **point}}
            try:
                vals = evaluate_strategy(ctx, name, point, queries, matrices, k, wanted)
            except SparsemmError as exc:
                row.update({"ap@10": None, "skipped": str(exc)})
                rows.append(row)
                continue
            row.update(
                {
                    "ap@10": float(vals[TUNE_METRIC].mean()),
                    "ap@10_hard": float(vals[TUNE_METRIC][hard].mean()) if hard.any() else None,
                    "violation@10": float(vals["violation@10"].mean()),
                    "seconds": round(time.perf_counter() - t0, 3),
                }
            )
            rows.append(row)
        if all(r["ap@10"] is None for r in rows):
            raise SparsemmError(f"strategy {name!r} cannot run: {rows[0]['skipped']}")
        limit = None if name == violation_reference else max_violation
        best = _select(rows, limit, None if limit is None else min_ap)
        rows[best]["chosen"] = True
        chosen[name] = points[best]
        results[name] = rows
        if name == violation_reference:
            max_violation = rows[best]["violation@10"]
            min_ap = 0.5 * rows[best]["ap@10"]
        logger.info(
            "tuned %s on %d queries: %s -> AP@10 %.4f, violation@10 %.4f (%d grid points)",
            name,
            len(queries),
            points[best],
            rows[best]["ap@10"],
            rows[best]["violation@10"],
            len(points),
        )
    return {m: chosen[m] for m in methods}, {m: results[m] for m in methods}


DenseTexts: TypeAlias = np.ndarray | Callable[[np.ndarray], np.ndarray]
"""Captions in the dense items' space: every caption's vector (n_texts, k), row r = caption
r of the collection, or a function ``rows (m,) int64 -> (m, k)`` giving those captions'
vectors, so a caller encodes only the captions a run reads."""


def _check_dense_texts(dense_texts: DenseTexts | None, collection: Collection) -> None:
    if dense_texts is None or callable(dense_texts):
        return
    if dense_texts.ndim != 2 or dense_texts.shape[0] != len(collection.texts):
        raise SparsemmError(
            f"dense_texts has shape {dense_texts.shape}, expected one row per caption of the "
            f"collection ({len(collection.texts)}); pass every caption's vector, or a function "
            "giving the vectors of the caption rows it is called with"
        )


def _dense_texts_of(dense_texts: DenseTexts, rows: np.ndarray, dim: int) -> np.ndarray:
    """The (len(rows), dim) dense vectors of caption ``rows`` from either form."""
    if callable(dense_texts):
        out = np.asarray(dense_texts(rows), dtype=np.float32)
        what = "the dense_texts function returned"
    else:
        out = np.asarray(dense_texts[rows], dtype=np.float32)
        what = "dense_texts has"
    if out.shape != (len(rows), dim):
        raise SparsemmError(
            f"{what} shape {out.shape} for {len(rows)} captions; expected ({len(rows)}, {dim}) "
            "(one row per requested caption, in the dense items' space)"
        )
    return out


def retrieval_table(
    collection: Collection,
    rows: np.ndarray,
    dense_items: np.ndarray,
    codes_items: sp.csr_matrix | None,
    text_codes: Callable[[np.ndarray, list[str]], sp.csr_matrix] | None,
    ks: Sequence[int] = (1, 5, 10),
    dense_texts: DenseTexts | None = None,
) -> dict[str, dict[str, float]]:
    """Image-to-text and text-to-image AP@k of dense embeddings vs sparse codes.

    Images are the items of ``rows`` (their image embeddings or caption views); texts are
    their captions. Image-to-text: each image's relevant set is its captions;
    text-to-image: each caption's relevant set is its image (AP@k = RR@k then).
    ``dense_items`` (len(rows), k); ``dense_texts`` (:data:`DenseTexts`) puts the captions in
    that space when it is not the collection's text space (None: the text embeddings); a
    function is called once, with the ascending caption rows of the items.
    """
    _check_dense_texts(dense_texts, collection)
    text_item = collection.text_item_index()
    pos = np.full(len(collection.items), -1, dtype=np.int64)
    pos[rows] = np.arange(len(rows))
    trows = np.flatnonzero(pos[text_item] >= 0)
    if not len(trows):
        raise SparsemmError("the evaluation items have no captions for the retrieval table")
    texts = collection.text_embeddings()[trows]
    # Dense scoring uses the texts in the items' dense space (the same as texts when the
    # collection has one backbone; an aligned projection otherwise).
    dtexts = (
        texts if dense_texts is None else _dense_texts_of(dense_texts, trows, dense_items.shape[1])
    )
    owner = pos[text_item[trows]]
    caps_of = [np.flatnonzero(owner == i) for i in range(len(rows))]
    keep = [i for i, c in enumerate(caps_of) if len(c)]
    img_rel = [caps_of[i] for i in keep]
    txt_rel = [np.array([o]) for o in owner]
    out: dict[str, dict[str, float]] = {}
    i2t = multi_target_ap(dense_items[keep], dtexts, img_rel, ks)
    out["dense"] = {
        **{f"i2t_{k}": v for k, v in i2t.items()},
        **{f"t2i_{k}": v for k, v in multi_target_ap(dtexts, dense_items, txt_rel, ks).items()},
    }
    if codes_items is not None and text_codes is not None:
        tc = text_codes(texts, [collection.texts[r]["text"] for r in trows])
        ci = sp.csr_matrix(codes_items)
        out["sparse"] = {
            **{f"i2t_{k}": v for k, v in multi_target_ap(ci[keep], tc, img_rel, ks).items()},
            **{f"t2i_{k}": v for k, v in multi_target_ap(tc, ci, txt_rel, ks).items()},
            "nnz_image": float(ci.getnnz(axis=1).mean()),
            "nnz_text": float(tc.getnnz(axis=1).mean()),
        }
    return out


def retrieval_markdown(
    table: Mapping[str, Mapping[str, float]],
    labels: Mapping[str, str] | None = None,
    bold_best: bool = False,
) -> str:
    """A Markdown table of :func:`retrieval_table`-style rows (AP@k columns, nnz): one row
    per entry, named by ``labels`` (default: its key); ``bold_best`` bolds each column's
    best value (after rounding to 3 decimals). A missing value shows as "-"."""
    cols = [c for c in next(iter(table.values())) if c.startswith(("i2t", "t2i"))]
    rows = []
    best: dict[str, float] = {}
    if bold_best:
        for c in cols:
            vals = [v for row in table.values() if (v := row.get(c)) is not None]
            if vals:
                best[c] = round(max(vals), 3)
    for name, row in table.items():
        cells = []
        for c in cols:
            v = row.get(c)
            text = "-" if v is None else f"{v:.3f}"
            cells.append(f"**{text}**" if v is not None and round(v, 3) == best.get(c) else text)
        nnz = (
            [f"{row['nnz_image']:.1f}", f"{row['nnz_text']:.1f}"]
            if "nnz_image" in row
            else ["dense", "dense"]
        )
        rows.append([(labels or {}).get(name, name), *cells, *nnz])
    header = ["representation", *cols, "nnz image", "nnz text"]
    return "\n".join(md_table(header, rows, "l" + "r" * (len(cols) + 2))) + "\n"


def _tuning_markdown(
    chosen: Mapping[str, Mapping[str, Any]], results: Mapping[str, list[dict[str, Any]]]
) -> str:
    table = []
    for name, rows in results.items():
        best = next(r for r in rows if r.get("chosen"))
        params = ", ".join(f"{k}={v}" for k, v in chosen[name].items()) or "(defaults)"
        hard = "–" if best["ap@10_hard"] is None else f"{best['ap@10_hard']:.3f}"
        table.append(
            [name, params, len(rows), f"{best['ap@10']:.3f}", hard, f"{best['violation@10']:.3f}"]
        )
    header = [
        "method",
        "chosen parameters",
        "grid points",
        "tune AP@10",
        "tune AP@10 hard",
        "tune violation@10",
    ]
    return "\n".join(md_table(header, table, "llrrrr")) + "\n"


def run_exclusion_bench(
    collection: Collection,
    out_dir: str | Path,
    text_encoder: TextEncoder,
    item_coder: ItemCoder | None = None,
    query_coder: QueryCoder | None = None,
    word_vectors: Any = None,
    config: BenchConfig | None = None,
    run_info: Mapping[str, Any] | None = None,
    item_codes: sp.csr_matrix | None = None,
    dense_items: np.ndarray | None = None,
    dense_texts: DenseTexts | None = None,
    detectors: ConceptDetectors | None = None,
) -> dict[str, Any]:
    """Run the exclusion benchmark and write the report folder ``out_dir``.

    ``item_coder`` maps dense item embeddings to sparse codes and ``query_coder`` query text
    embeddings to codes (e.g. an SR model, :func:`~sparsemm.query.strategies.sr_query_coder`);
    without them only the dense strategies run. Models whose item input is not the
    collection's dense embedding (VDR, LexLIP, SpLiCE...) pass ``item_codes`` instead: the
    codes of every collection item, row i = item i. ``dense_items`` (n_items, k) replaces the
    collection's image embeddings for the dense strategies, e.g. with an aligned projection
    when the image and text backbones differ (:mod:`.models.lit`); it must live in
    the same space as ``text_encoder``'s output, and ``dense_texts`` then gives the captions
    in that space for the retrieval table: every caption's vector (n_texts, k), or a
    function ``rows -> (len(rows), k)`` called once with the caption rows of the evaluation
    items (:data:`DenseTexts`; only those captions need encoding). ``run_info`` (model
    paths, settings) is stored in ``config.json``. ``detectors`` are the sparse model's own
    concept detectors (what search serves with; they were trained on the tune split's
    items, so tuning with them is optimistic). Returns the ``metrics.json`` content.
    """
    cfg = config or BenchConfig()
    _check_dense_texts(dense_texts, collection)  # before the long run, not after it
    if item_codes is not None:
        if item_coder is not None:
            raise SparsemmError("pass either item_coder or item_codes, not both")
        if item_codes.shape[0] != len(collection.items):
            raise SparsemmError(
                f"item_codes has {item_codes.shape[0]} rows for {len(collection.items)} items"
            )
    coder: ItemCoder | sp.csr_matrix | None = item_codes if item_codes is not None else item_coder
    t_start = time.perf_counter()
    methods = list(cfg.methods or STRATEGIES)
    for m in methods:
        get_spec(m)
    if coder is None or query_coder is None:
        dropped = [m for m in methods if get_spec(m).kind == "sparse"]
        if dropped:
            logger.warning("no sparse model given: skipping %s", ", ".join(dropped))
        methods = [m for m in methods if m not in dropped]
    if detectors is None:
        no_model = [m for m in methods if getattr(get_spec(m).cls, "needs_concepts", False)]
        if no_model:
            logger.warning("the model has no concept detectors: skipping %s", ", ".join(no_model))
            methods = [m for m in methods if m not in no_model]
    if not methods:
        raise SparsemmError("no strategy left to run; pass a sparse model (--sr) or dense methods")

    captions = captions_by_item(collection)
    dense_all = collection.image_embeddings() if dense_items is None else dense_items
    if dense_all.shape[0] != len(collection.items):
        raise SparsemmError(
            f"dense_items has {dense_all.shape[0]} rows for {len(collection.items)} items"
        )

    def rows_of(split: str) -> np.ndarray:
        rows = np.flatnonzero(collection.split_mask(split))
        return rows[: cfg.limit_items] if cfg.limit_items else rows

    eval_set = item_set(collection, rows_of(cfg.split), coder, captions, dense_all)
    queries = build_exclusion_queries(eval_set.labels)
    if not queries:
        raise SparsemmError(
            f"no exclusion queries on split {cfg.split!r}: its items need labels, and some "
            "item must carry two labels"
        )

    def ref_labels(items: ItemSet) -> list[list[str]] | None:
        return items.labels if cfg.label_targets else None

    chosen: dict[str, dict[str, Any]] = {m: {} for m in methods}
    tuning: dict[str, list[dict[str, Any]]] = {}
    reference: ReferenceSet | None = None
    n_tune_queries = n_tune_items = 0
    if cfg.tune_split is not None:
        tune_rows = rows_of(cfg.tune_split)
        eval_rows, ref_rows = split_tune_rows(tune_rows, cfg.tune_fraction, cfg.seed)
        tune_eval = item_set(collection, eval_rows, coder, captions, dense_all)
        tune_ref = item_set(collection, ref_rows, coder, captions, dense_all)
        tune_queries = build_exclusion_queries(tune_eval.labels)
        n_tune_queries, n_tune_items = len(tune_queries), len(tune_eval.rows)
        if tune_queries:
            tctx = ExclusionContext(
                tune_eval.dense,
                tune_eval.codes,
                text_encoder,
                query_coder,
                ReferenceSet(
                    tune_ref.captions, tune_ref.dense, tune_ref.codes, ref_labels(tune_ref)
                ),
                word_vectors,
                detectors=detectors,
            )
            ref = cfg.violation_reference if cfg.violation_reference in methods else None
            chosen, tuning = tune_strategies(
                tctx, methods, tune_queries, cfg.k, cfg.max_grid, violation_reference=ref
            )
        else:
            logger.warning("no queries on the tuning items; using default parameters")
        full_ref = item_set(collection, np.sort(tune_rows), coder, captions, dense_all)
        reference = ReferenceSet(
            full_ref.captions, full_ref.dense, full_ref.codes, ref_labels(full_ref)
        )
    needs_ref = [m for m in methods if "reference" in get_spec(m).cls.requires]
    if reference is None and needs_ref:
        logger.warning("no tune split, so no reference set: skipping %s", ", ".join(needs_ref))
        methods = [m for m in methods if m not in needs_ref]

    ctx = ExclusionContext(
        eval_set.dense,
        eval_set.codes,
        text_encoder,
        query_coder,
        reference,
        word_vectors,
        detectors=detectors,
    )
    matrices = query_matrices(queries, ctx.n_items)
    per_query: dict[str, dict[str, np.ndarray]] = {}
    seconds: dict[str, float] = {}
    for name in methods:
        t0 = time.perf_counter()
        per_query[name] = evaluate_strategy(ctx, name, chosen[name], queries, matrices, cfg.k)
        seconds[name] = round(time.perf_counter() - t0, 3)
        logger.info(
            "%s: AP@10 %.4f, violation@10 %.4f (%d queries, %.1f s)",
            name,
            per_query[name]["ap@10"].mean(),
            per_query[name]["violation@10"].mean(),
            len(queries),
            seconds[name],
        )

    retrieval = retrieval_table(
        collection,
        eval_set.rows,
        eval_set.dense,
        eval_set.codes,
        query_coder,
        dense_texts=dense_texts,
    )
    baselines = [b for b in BASELINES if b in per_query]
    run_config = {
        "name": f"Exclusion benchmark ({cfg.split} split)",
        "benchmark": "exclusion",
        "collection": str(collection.root),
        "encoder": collection.manifest.get("encoder"),
        "bench": dataclasses.asdict(cfg),
        "methods": {
            m: {
                "description": get_spec(m).description,
                "params": {**get_spec(m).defaults, **chosen[m]},
            }
            for m in methods
        },
        "n_items": len(eval_set.rows),
        "n_queries": len(queries),
        "n_hard": int(hard_mask(queries).sum()),
        "n_tune_queries": n_tune_queries,
        "n_tune_items": n_tune_items,
        **dict(run_info or {}),
    }
    subsets = {"all": np.ones(len(queries), dtype=bool), "hard": hard_mask(queries)}
    content = write_report(out_dir, run_config, per_query, subsets, list(METRICS), baselines)
    content["retrieval"] = retrieval
    content["tuning"] = {"split": cfg.tune_split, "chosen": chosen, "grid": tuning}
    content["seconds"] = {**seconds, "total": round(time.perf_counter() - t_start, 3)}
    out = Path(out_dir)
    write_json(out / "metrics.json", content)
    sparse_name = str((run_info or {}).get("sparse_model_name", "sparse codes"))
    report = render_report(content, run_config)
    report += "\n## Standard retrieval (image views vs captions, AP@k)\n\n"
    report += retrieval_markdown(retrieval, {"sparse": sparse_name})
    report += "\n## Methods\n\n" + "".join(
        f"- **{m}**: {get_spec(m).description}\n" for m in methods
    )
    if tuning:
        ref = cfg.violation_reference if cfg.violation_reference in methods else None
        rule = "highest mean AP@10" + (
            f" among grid points with mean violation@10 <= {ref}'s" if ref else ""
        )
        report += (
            f"\n## Parameters chosen on the {cfg.tune_split} split "
            f"({n_tune_queries} tuning queries over {n_tune_items} held-out {cfg.tune_split} "
            f"items; criterion: {rule})\n\n"
        )
        report += _tuning_markdown(chosen, tuning)
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(report)
    logger.info("exclusion benchmark done in %.1f s -> %s", time.perf_counter() - t_start, out)
    return content
