"""SpLiCE on a collection: concept dictionary -> codes -> the exclusion benchmark.

Steps of :func:`run_splice_bench` (SpLiCE: Bhalla et al., NeurIPS 2024; exclusion with the
SR paper's two-step method, Prachi et al., ICTIR 2025, applied to SpLiCE codes as that
paper does):

1. Concepts: the ``n_concepts`` most frequent lines of a SpLiCE vocabulary file, embedded
   with the collection's *text* encoder (cached as ``.npy`` under ``cache_dir``, keyed by a
   fingerprint of encoder, template and concept list).
2. :class:`~sparsemm.baselines.splice.SpliceDecomposer` fitted on the ``train`` split: the
   image-side mean from the items' embeddings, the text-side mean (for query texts) from the
   train items' captions, the concept mean from the concepts.
3. l1 sweep on ``train`` only: for each penalty, the benchmark's tuning items (the same
   seeded quarter of ``train`` that :func:`~sparsemm_experiments.eval.bench.run_exclusion_bench`
   scores
   while tuning) are coded and ``code_a`` and ``paper`` (a small grid,
   :data:`SWEEP_PAPER_GRID`) and ``code_arith`` (its grid) are scored on their queries. The
   chosen penalty is the one with the best ``paper`` AP@10 (the SR paper's method for
   SpLiCE; ``select_by`` picks another strategy), counting only grid points whose
   violation@10 is no higher than ``avg_emb_0.5``'s when any is, as the benchmark's tuning
   does; ties go to the larger (sparser) penalty.
4. Every collection item is coded with the chosen penalty and the full benchmark runs
   (every requested dense and sparse strategy, tuned on ``train``, reported on ``test``).
   The run folder also gets ``splice.json`` (sweep table, non-zeros, solver speed, example
   explanations), a SpLiCE section in ``report.md``, the fitted decomposer
   (``splice_model/``) and the item codes (``codes.npz``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.baselines.splice import SpliceDecomposer, load_concepts
from sparsemm.data.collection import Collection, open_collection
from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, save_csr, write_json
from sparsemm.query.strategies import (
    ExclusionContext,
    QueryCoder,
    TextEncoder,
    get_spec,
)
from sparsemm_experiments.baselines.splice import (
    embed_concepts,
    reconstruction_cosine,
    save_decomposer,
    splice_query_coder,
    top_concepts,
)
from sparsemm_experiments.eval.bench import BenchConfig, evaluate_strategy, run_exclusion_bench
from sparsemm_experiments.eval.exclusion import build_exclusion_queries, hard_mask, query_matrices
from sparsemm_experiments.eval.tables import md_table

logger = logging.getLogger(__name__)

DEFAULT_L1_GRID = (0.1, 0.15, 0.2, 0.25, 0.3)
# Strategies of the final benchmark: the dense baselines (with CBE) and every sparse
# strategy except the caption-word detectors, whose per-term logistic regressions over
# 10,000 concept dims do not fit the ~10 minute budget, and SLQ, which encodes one text per
# query pair (about a minute per split with MiniLM on one core) and does not depend on
# SpLiCE; pass methods= to add them.
DEFAULT_METHODS = (
    "dense_a",
    "avg_emb",
    "avg_emb_0.5",
    "cbe",
    "code_a",
    "paper",
    "code_arith",
    "filter",
    "penalty",
)
# The sweep's `paper` grid: a subset of the registered one (the final run tunes the full grid).
SWEEP_PAPER_GRID: tuple[dict[str, Any], ...] = tuple(
    {"top_k": k, "share": s, "pool": "topk"} for k in (25, 50) for s in (0.5, 0.7)
)
SELECT_BY = ("paper", "code_arith", "code_a")  # strategies the sweep can choose l1 by
QUICK_ITEMS = 120  # items per split in quick runs
QUICK_GRID = 2  # grid points per strategy in quick runs
QUICK_CONCEPTS = 1000  # concepts in quick runs


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """``n`` torch threads while encoding concepts (shared 2-core machines). Only when the
    encoder has loaded torch already: importing it just to set threads costs seconds."""
    if "torch" not in sys.modules:
        yield
        return
    from sparsemm.runtime import torch_threads

    with torch_threads(n):
        yield


def collection_text_encoder(collection: Collection) -> TextEncoder:
    """The collection's text encoder, built as ``sparsemm bench exclusion`` builds it."""
    from sparsemm.encoders.base import as_text_encoder, get_encoder

    info = collection.manifest.get("text_encoder", collection.manifest.get("encoder", {}))
    model_id = info.get("model")
    kwargs: dict[str, Any] = {}
    if model_id and Path(str(model_id)).expanduser().is_dir():
        kwargs["model"] = model_id
    return as_text_encoder(get_encoder(collection.text_encoder_name, **kwargs))


def _labels_of(collection: Collection, rows: np.ndarray) -> list[list[str]]:
    return [list(collection.items[int(r)].get("labels") or []) for r in rows]


def _select(rows: Sequence[Mapping[str, Any]], max_violation: float | None) -> int:
    """Best AP@10 among rows with violation@10 <= max_violation (all rows if none qualify)."""
    ok = list(range(len(rows)))
    if max_violation is not None:
        ok = [i for i in ok if rows[i]["violation@10"] <= max_violation + 1e-12] or ok
    return max(ok, key=lambda i: (rows[i]["ap@10"], -i))


def _row_lookup_coder(
    dense_all: np.ndarray, codes_all: sp.csr_matrix, decomposer: SpliceDecomposer
) -> Any:
    """An item coder returning precomputed codes for rows of ``dense_all`` (exact match).

    Used only when :func:`run_exclusion_bench` has no ``item_codes`` argument; rows it has
    not seen are decomposed.
    """
    index = {np.ascontiguousarray(r).tobytes(): i for i, r in enumerate(dense_all)}

    def code(x: np.ndarray) -> sp.csr_matrix:
        rows = [index.get(np.ascontiguousarray(r, dtype=dense_all.dtype).tobytes()) for r in x]
        if all(r is not None for r in rows):
            return sp.csr_matrix(codes_all[np.asarray(rows, dtype=np.int64)])
        return decomposer.transform(x, "image")

    return code


def sweep_l1(
    collection: Collection,
    decomposer: SpliceDecomposer,
    text_encoder: TextEncoder,
    l1_grid: Sequence[float],
    config: BenchConfig,
    paper_grid: Sequence[Mapping[str, Any]] = SWEEP_PAPER_GRID,
    select_by: str = "paper",
) -> tuple[float, list[dict[str, Any]]]:
    """Choose SpLiCE's l1 penalty on the tune split (see the module docstring, step 3).

    ``select_by``: the strategy whose tuning AP@10 picks the penalty (``paper``, the
    default; ``code_arith``; or ``code_a``, codes without exclusion). Returns (chosen
    penalty, one result row per penalty, in decreasing penalty order).
    """
    if select_by not in SELECT_BY:
        raise SparsemmError(f"select_by must be one of {', '.join(SELECT_BY)}, not {select_by!r}")
    if not l1_grid:
        raise SparsemmError("the l1 grid is empty; pass at least one penalty")
    if config.tune_split is None:
        raise SparsemmError("the l1 sweep needs a tune split (e.g. train)")
    tune_rows = np.flatnonzero(collection.split_mask(config.tune_split))
    if config.limit_items:
        tune_rows = tune_rows[: config.limit_items]
    perm = np.random.default_rng(config.seed).permutation(len(tune_rows))
    n_eval = max(1, round(config.tune_fraction * len(tune_rows)))
    # Only the scored part is coded: code_a and paper use no reference set.
    rows = np.sort(tune_rows[perm[:n_eval]])
    dense = collection.image_embeddings()[rows]
    queries = build_exclusion_queries(_labels_of(collection, rows))
    if not queries:
        raise SparsemmError(
            f"no exclusion queries on the {config.tune_split!r} tuning items; the l1 sweep "
            "needs labelled items with two or more labels"
        )
    matrices = query_matrices(queries, len(rows))
    hard = hard_mask(queries)
    wanted = ("ap@10", "violation@10")

    # The violation bar of the benchmark's tuning rule (a dense method: codes do not matter).
    dctx = ExclusionContext(dense, None, text_encoder)
    ref_vals = evaluate_strategy(dctx, "avg_emb_0.5", {}, queries, matrices, config.k, wanted)
    bar = float(ref_vals["violation@10"].mean())

    results: list[dict[str, Any]] = []
    for lam in sorted({float(x) for x in l1_grid}, reverse=True):
        t0, c0 = time.perf_counter(), time.process_time()
        codes = decomposer.transform(dense, "image", l1_penalty=lam)
        solve_s, solve_cpu = time.perf_counter() - t0, time.process_time() - c0
        ctx = ExclusionContext(dense, codes, text_encoder, _query_coder_at(decomposer, lam))
        row: dict[str, Any] = {
            "l1": lam,
            "nnz": float(codes.getnnz() / max(codes.shape[0], 1)),
            "solve_seconds_per_1000": round(1000.0 * solve_s / max(len(rows), 1), 3),
            "solve_cpu_seconds_per_1000": round(1000.0 * solve_cpu / max(len(rows), 1), 3),
            **reconstruction_cosine(decomposer, dense, codes, "image"),
        }
        code_a = evaluate_strategy(ctx, "code_a", {}, queries, matrices, config.k, wanted)
        row["code_a_ap@10"] = float(code_a["ap@10"].mean())
        row["code_a_violation@10"] = float(code_a["violation@10"].mean())
        for name, points in (
            ("paper", list(paper_grid)),
            ("code_arith", get_spec("code_arith").grid_points()),
        ):
            grid_rows = []
            for point in points:
                vals = evaluate_strategy(ctx, name, point, queries, matrices, config.k, wanted)
                grid_rows.append(
                    {
                        "params": dict(point),
                        "ap@10": float(vals["ap@10"].mean()),
                        "ap@10_hard": float(vals["ap@10"][hard].mean()) if hard.any() else None,
                        "violation@10": float(vals["violation@10"].mean()),
                    }
                )
            best = grid_rows[_select(grid_rows, bar)]
            row.update(
                {
                    f"{name}_ap@10": best["ap@10"],
                    f"{name}_ap@10_hard": best["ap@10_hard"],
                    f"{name}_violation@10": best["violation@10"],
                    f"{name}_params": best["params"],
                    f"{name}_grid": grid_rows,
                }
            )
        row["seconds"] = round(time.perf_counter() - t0, 2)
        logger.info(
            "l1 %.3g: %.1f non-zeros, cos %.3f, code_a AP@10 %.4f, paper AP@10 %.4f (%.1f s)",
            lam,
            row["nnz"],
            row["cosine"],
            row["code_a_ap@10"],
            row["paper_ap@10"],
            row["seconds"],
        )
        results.append(row)
    # Rows are in decreasing l1, so the stable max keeps the larger (sparser) penalty on ties.
    key = f"{select_by}_ap@10"
    chosen = max(range(len(results)), key=lambda i: (results[i][key], -i))
    for i, r in enumerate(results):
        r["chosen"] = i == chosen
        r["violation_bar"] = bar
    lam = float(results[chosen]["l1"])
    logger.info("chosen l1 penalty %.3g by %s (tuning queries: %d)", lam, select_by, len(queries))
    return lam, results


def _query_coder_at(decomposer: SpliceDecomposer, lam: float) -> QueryCoder:
    def code(emb: np.ndarray, texts: Sequence[str]) -> sp.csr_matrix:
        return decomposer.transform(emb, "text", l1_penalty=lam)

    return code


def _explanations(
    collection: Collection, rows: np.ndarray, codes: sp.csr_matrix, dec: SpliceDecomposer, n: int
) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        item = collection.items[int(r)]
        caps = item.get("captions") or []
        out.append(
            {
                "id": str(item["id"]),
                "caption": str(caps[0]) if caps else "",
                "labels": list(item.get("labels") or []),
                "top_concepts": [[c, round(w, 4)] for c, w in top_concepts(dec, codes, int(r), n)],
            }
        )
    return out


def _splice_markdown(info: Mapping[str, Any], content: Mapping[str, Any]) -> str:
    lines = [
        "",
        "## SpLiCE",
        "",
        f"{info['n_concepts']} concepts from `{info['concepts_file']}` embedded with "
        f"`{info['text_encoder']}`; chosen l1 = {info['l1_penalty']} (by `{info['select_by']}` "
        "AP@10 in the train sweep below); "
        f"item codes: {info['nnz_items']:.1f} non-zeros on average; solver "
        f"{info['solve_seconds_per_1000']:.2f} s wall / "
        f"{info['solve_cpu_seconds_per_1000']:.2f} s CPU per 1,000 items "
        f"({info['solver']}, tol {info['tol']}).",
        "",
        f"Sweep on the {info['tune_split']} split's tuning items (AP@10 / violation@10; "
        "`paper` and `code_arith` at their best grid point under the violation bar):",
        "",
        *md_table(
            [
                "l1",
                "non-zeros",
                "cos (uncentred)",
                "cos (centred)",
                "CPU s / 1000 items",
                "code_a",
                "paper",
                "code_arith",
                "chosen",
            ],
            [
                (
                    r["l1"],
                    f"{r['nnz']:.1f}",
                    f"{r['cosine']:.3f}",
                    f"{r['cosine_centered']:.3f}",
                    f"{r['solve_cpu_seconds_per_1000']:.2f}",
                    *(
                        f"{r[f'{m}_ap@10']:.3f} / {r[f'{m}_violation@10']:.3f}"
                        for m in ("code_a", "paper", "code_arith")
                    ),
                    "yes" if r["chosen"] else "",
                )
                for r in info["sweep"]
            ],
            "rrrrrrrrl",
        ),
    ]
    lines += ["", "Example explanations (test items, top concepts by weight):", ""]
    for ex in info["examples"]:
        concepts = ", ".join(f"{c} ({w:.2f})" for c, w in ex["top_concepts"])
        lines.append(f'- {ex["id"]} "{ex["caption"]}" [{", ".join(ex["labels"])}]: {concepts}')
    means = content["subsets"]["all"]["means"]
    sparse = [m for m in info["sparse_methods"] if m in means]
    if sparse:
        best = max(sparse, key=lambda m: means[m]["ap@10"])
        lines += ["", f"Best sparse strategy on SpLiCE codes (test AP@10, all): `{best}`."]
    return "\n".join(lines) + "\n"


def run_splice_bench(
    collection_dir: str | Path,
    out_dir: str | Path,
    concepts_file: str | Path,
    n_concepts: int = 10000,
    l1_grid: Sequence[float] = DEFAULT_L1_GRID,
    quick: bool = False,
    methods: Sequence[str] | None = None,
    cache_dir: str | Path | None = None,
    text_encoder: TextEncoder | None = None,
    concept_template: str = "{}",
    solver: str = "cd",
    tol: float = 1e-4,
    select_by: str = "paper",
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """SpLiCE codes for a collection, l1 chosen on ``train``, then the exclusion benchmark.

    ``concepts_file``: a SpLiCE vocabulary (one concept a line, least to most frequent);
    ``n_concepts`` most frequent are used (``quick``: at most 1,000, 120 items per split,
    the first two l1 values and two grid points per strategy). ``cache_dir`` (default
    ``out_dir/cache``) keeps the concept embeddings between runs; ``text_encoder`` defaults
    to the collection's own; ``select_by`` names the strategy whose train AP@10 picks the
    penalty (:func:`sweep_l1`). Returns the benchmark's ``metrics.json`` content with a
    ``splice`` entry (also written to ``out_dir/splice.json``).
    """
    t_start, c_start = time.perf_counter(), time.process_time()
    if select_by not in SELECT_BY:
        raise SparsemmError(f"select_by must be one of {', '.join(SELECT_BY)}, not {select_by!r}")
    out = Path(out_dir)
    col = open_collection(collection_dir)
    if col.has_images() and col.dim != col.text_dim:
        raise SparsemmError(
            f"SpLiCE decomposes image embeddings over text-embedded concepts, so both must "
            f"live in one space; {col.root} has {col.dim}-d images and {col.text_dim}-d texts "
            "(use a CLIP-style collection or the caption-proxy views)"
        )
    encoder = text_encoder if text_encoder is not None else collection_text_encoder(col)
    if quick:
        n_concepts = min(n_concepts, QUICK_CONCEPTS)
        l1_grid = list(l1_grid)[:2]
    cfg = BenchConfig(
        methods=tuple(methods or DEFAULT_METHODS),
        limit_items=QUICK_ITEMS if quick else None,
        max_grid=QUICK_GRID if quick else None,
        seed=seed,
    )
    assert cfg.tune_split is not None

    concepts = load_concepts(concepts_file, n_concepts)
    t0 = time.perf_counter()
    with _torch_threads(1):
        cemb = embed_concepts(
            concepts,
            encoder,
            cache_dir if cache_dir is not None else out / "cache",
            template=concept_template,
            progress=progress,
        )
    embed_s = time.perf_counter() - t0

    dense_all = col.image_embeddings()
    train = col.split_mask(cfg.tune_split)
    text_rows, _ = col.caption_rows(train)
    text_emb = col.text_embeddings()[text_rows] if col.has_texts() and len(text_rows) else None
    dec = SpliceDecomposer(concepts, solver=solver, tol=tol, progress=progress)
    dec.fit(dense_all[train], cemb, text_emb)

    lam, sweep = sweep_l1(col, dec, encoder, l1_grid, cfg, select_by=select_by)
    dec.l1_penalty = lam
    t0, c0 = time.perf_counter(), time.process_time()
    codes = dec.transform(dense_all, "image")
    solve_s, solve_cpu = time.perf_counter() - t0, time.process_time() - c0
    save_csr(out / "codes.npz", codes)
    save_decomposer(dec, out / "splice_model")

    test_rows = np.flatnonzero(col.split_mask(cfg.split))
    info: dict[str, Any] = {
        "concepts_file": str(concepts_file),
        "n_concepts": len(concepts),
        "concept_template": concept_template,
        "text_encoder": f"{getattr(encoder, 'name', type(encoder).__name__)}",
        "l1_penalty": lam,
        "l1_grid": [float(x) for x in l1_grid],
        "tune_split": cfg.tune_split,
        "select_by": select_by,
        "solver": solver,
        "tol": tol,
        "nnz_items": float(codes.getnnz() / max(codes.shape[0], 1)),
        "nnz_test_items": float(codes[test_rows].getnnz() / max(len(test_rows), 1)),
        "solve_seconds_per_1000": round(1000.0 * solve_s / max(codes.shape[0], 1), 3),
        "solve_cpu_seconds_per_1000": round(1000.0 * solve_cpu / max(codes.shape[0], 1), 3),
        "concept_embedding_seconds": round(embed_s, 2),
        **{
            f"test_{k}": v
            for k, v in reconstruction_cosine(
                dec, dense_all[test_rows], codes[test_rows], "image"
            ).items()
        },
        "sweep": sweep,
        "examples": _explanations(col, test_rows[:5], codes, dec, 8),
        "sparse_methods": [m for m in cfg.methods if get_spec(m).kind == "sparse"],
        "quick": quick,
    }
    qcoder = splice_query_coder(dec, "text")
    run_info = {
        "sparse_model_name": f"SpLiCE (l1 {lam}, {len(concepts)} concepts)",
        "splice": {k: v for k, v in info.items() if k not in ("sweep", "examples")},
    }
    kwargs: dict[str, Any] = {}
    if "item_codes" in inspect.signature(run_exclusion_bench).parameters:
        kwargs["item_codes"] = codes
    else:  # benchmark without precomputed-code support: look the codes up by row
        kwargs["item_coder"] = _row_lookup_coder(dense_all, codes, dec)
    content = run_exclusion_bench(
        col,
        out,
        encoder,
        query_coder=qcoder,
        config=cfg,
        run_info=run_info,
        **kwargs,
    )
    info["seconds_total"] = round(time.perf_counter() - t_start, 2)
    info["cpu_seconds_total"] = round(time.process_time() - c_start, 2)
    write_json(out / "splice.json", info)
    report = (out / "report.md").read_text(encoding="utf-8")
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(report + _splice_markdown(info, content))
    content["splice"] = info
    logger.info("SpLiCE benchmark done in %.1f s -> %s", info["seconds_total"], out)
    return content
