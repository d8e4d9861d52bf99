"""``sparsemm bench paper``: the SR paper's Tables 1-3 on the COCO caption-proxy, one command.

The SR paper (Prachi, Bhatia & Bedathur, "Answering Multimodal Exclusion Queries with
Lightweight Sparse Disentangled Representations", ICTIR 2025) reports:

- **Table 1**: "A but not B" exclusion queries, every method x MRR/NDCG/AP @1/3/10, with
  significance against the baselines. Here: dense single-line query (SLQ), dense Avg Emb
  (w = 1 and the tuned w = 0.5), CBE, SpLiCE, VDR and SR, each with the SR paper's two-step
  rule (``paper``) and the project's best variants (code arithmetic, penalty, detector),
  plus violation@10 and the hard subset; paired t-tests against five baselines.
- **Table 2**: image-to-text and text-to-image AP@1/5/10 of every representation.
- **Table 3**: SR with latent dimension d = 500, 1000, 1500, 2000 (SPINE trained at the same
  d, since the caption bias lives in SPINE's dimensions) and without the SPINE bias.

Every stage is cached in the output folder and reused on a re-run: the encoded collection,
SPINE per d, SR per d, the VDR model and its codes, SpLiCE's concept embeddings, and each
benchmark run (``runs/<name>/``, reused while its fingerprint matches). The merged tables
come from the runs' ``per_query.npz`` files: every run scores the same queries (the test
split's label pairs), so their per-query values can be paired.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection, open_collection, sha256_file
from sparsemm.data.encode import encode_source
from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, read_json, write_json
from sparsemm.query.strategies import QueryCoder, sr_query_coder
from sparsemm.runtime import torch_threads
from sparsemm_experiments.data.paths import coco_json
from sparsemm_experiments.eval.bench import (
    METRICS,
    BenchConfig,
    retrieval_markdown,
    run_exclusion_bench,
)
from sparsemm_experiments.eval.exclusion import (
    bar_plot,
    git_commit,
    markdown_table,
    read_per_query,
    write_report,
)
from sparsemm_experiments.eval.tables import md_table
from sparsemm_experiments.presets import load_preset
from sparsemm_experiments.sr_coco import ProxyRunConfig, prepare_spine

log = logging.getLogger(__name__)

DENSE_METHODS = ("dense_a", "slq", "avg_emb", "avg_emb_0.5", "cbe", "dense_detector")
# Every run also scores avg_emb_0.5 (one grid point, about a second): it is the violation
# reference of the tuning rule, so each system's parameters are chosen against the same bar.
REFERENCE = "avg_emb_0.5"
SR_MAIN_METHODS = (REFERENCE, "code_a", "paper", "code_arith", "penalty", "detector")
SR_SWEEP_METHODS = (REFERENCE, "paper", "code_arith")
BASELINE_SPARSE_METHODS = (REFERENCE, "paper", "code_arith")

# Table 1 rows: (label, run, strategy). Runs: "dense", "sr-d<main>", "vdr", "splice".
# The five significance baselines are the paper's comparison methods.
TABLE1_BASELINES = ("Dense SLQ", "Dense Avg Emb", "CBE", "SpLiCE (two-step)", "VDR (two-step)")
TABLE3_METRICS = ("mrr@10", "ndcg@10", "ap@1", "ap@3", "ap@10", "violation@10")


# The run's settings, as data: presets/paper.json (the --quick preset overrides them).
_PAPER = load_preset("paper")


@dataclass(frozen=True)
class PaperBenchConfig:
    """Sizes of the reproduction. Defaults: the full COCO caption-proxy within about 30
    minutes of 2 CPU cores once the collection is encoded (measured in docs/results.md)."""

    dims: tuple[int, ...] = _PAPER["dims"]  # Table 3's SR latent dimensions
    main_dim: int = _PAPER["main_dim"]  # the SR row of Tables 1 and 2
    no_bias: bool = _PAPER["no_bias"]  # Table 3's "without SPINE bias" row (at main_dim)
    # SPINE vocabulary: most frequent GloVe + caption words
    spine_top_words: int = _PAPER["spine_top_words"]
    spine_epochs: int = _PAPER["spine_epochs"]
    sr_epochs: int = _PAPER["sr_epochs"]
    top_k: int = _PAPER["top_k"]  # SR's TopK (training and inference)
    vdr: bool = _PAPER["vdr"]
    vdr_steps: int = _PAPER["vdr_steps"]  # VDR training updates (batch 32; docs/vdr.md)
    vdr_top_k: int = _PAPER["vdr_top_k"]
    splice: bool = _PAPER["splice"]
    splice_concepts: int = _PAPER["splice_concepts"]  # most frequent LAION concepts
    # SpLiCE's penalty (docs/baselines.md sweeps it on train)
    splice_l1: float = _PAPER["splice_l1"]
    limit: int | None = None  # quick runs: the first N COCO images
    limit_items: int | None = None  # quick runs: first N items per split in the benchmark
    max_grid: int | None = None  # quick runs: grid points per strategy
    seed: int = 0
    train_threads: int = 1

    def __post_init__(self) -> None:
        if not self.dims or min(self.dims) < 1:
            raise SparsemmError("dims must be positive latent sizes")
        if self.main_dim not in self.dims:
            raise SparsemmError(f"main_dim {self.main_dim} must be one of dims {self.dims}")
        if self.top_k < 1 or self.top_k > min(self.dims):
            raise SparsemmError(f"top_k must be in [1, {min(self.dims)}], got {self.top_k}")


QUICK: dict[str, Any] = load_preset("paper_quick")  # presets/paper_quick.json


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


class _Runner:
    """Runs (or reuses) one exclusion benchmark per system under ``out/runs``."""

    def __init__(
        self, collection: Collection, out: Path, text_encoder: Any, bench: BenchConfig
    ) -> None:
        self.col, self.out, self.enc, self.bench = collection, out, text_encoder, bench
        self.contents: dict[str, dict[str, Any]] = {}
        self.reused: list[str] = []

    def run(
        self,
        name: str,
        methods: Sequence[str],
        model_id: str,
        item_codes: sp.csr_matrix | None = None,
        query_coder: QueryCoder | None = None,
        word_vectors: Any = None,
        info: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        run_dir = self.out / "runs" / name
        cfg = dataclasses.replace(self.bench, methods=tuple(methods))
        fp = _fingerprint(
            {"bench": dataclasses.asdict(cfg), "model": model_id, "items": len(self.col.items)}
        )
        done = run_dir / "metrics.json"
        if done.is_file() and (run_dir / "config.json").is_file():
            if read_json(run_dir / "config.json").get("paper_fingerprint") == fp:
                log.info("reusing the %s benchmark run in %s", name, run_dir)
                self.reused.append(name)
                self.contents[name] = read_json(done)
                return self.contents[name]
        t0 = time.perf_counter()
        content = run_exclusion_bench(
            self.col,
            run_dir,
            self.enc,
            query_coder=query_coder,
            word_vectors=word_vectors,
            config=cfg,
            run_info={"paper_fingerprint": fp, "model": model_id, **dict(info or {})},
            item_codes=item_codes,
        )
        log.info("benchmark run %s: %.1f s", name, time.perf_counter() - t0)
        self.contents[name] = content
        return content

    def per_query(self, name: str) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
        """Per-query values ``{method: {metric: (q,)}}`` and subset masks of one run."""
        per, subsets = read_per_query(self.out / "runs" / name)
        return per, dict(subsets)


# ------------------------------------------------------------------------------ models


def _train_captions(col: Collection) -> list[str]:
    return [str(t["text"]) for t in col.texts if col.items[int(t["item"])].get("split") == "train"]


def _spine(
    out: Path, col: Collection, d: int, cfg: PaperBenchConfig, progress: bool, glove: Any
) -> Any:
    pcfg = ProxyRunConfig(
        spine_top_words=cfg.spine_top_words,
        spine_epochs=cfg.spine_epochs,
        latent_dim=d,
        seed=cfg.seed,
    )
    with torch_threads(cfg.train_threads):
        return prepare_spine(out / "spine" / f"d{d}", _train_captions(col), pcfg, progress, glove)


def _sr(
    out_dir: Path, col: Collection, d: int, vectors: Any, cfg: PaperBenchConfig, progress: bool
) -> Any:
    from sparsemm.models.sr import SRConfig
    from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection, train_sr

    image, text, pair_item, bias = sr_pairs_from_collection(col, col.split_mask("train"), vectors)
    sr_cfg = SRConfig(text_dim=col.text_dim, image_dim=col.dim, latent_dim=d, top_k=cfg.top_k)
    tc = SRTrainConfig(epochs=cfg.sr_epochs, seed=cfg.seed)
    with torch_threads(cfg.train_threads):
        model, _ = train_sr(
            image, text, pair_item, bias, sr_cfg, out_dir, tc, resume=True, progress=progress
        )
    return model


def _vdr_codes(
    out: Path, col: Collection, cfg: PaperBenchConfig, progress: bool
) -> tuple[sp.csr_matrix, QueryCoder, str, dict[str, Any]]:
    from sparsemm_experiments.data.patches import proxy_patches
    from sparsemm_experiments.train.vdr import cross_modal_data
    from sparsemm_experiments.vdr_runs import VDRCodes, VDRRunConfig, train_or_load

    vcfg = VDRRunConfig(
        steps=cfg.vdr_steps,
        top_k=cfg.vdr_top_k,
        ks=(cfg.vdr_top_k,),
        ablate_bow=False,
        zero_shot=False,
        seed=cfg.seed,
        threads=cfg.train_threads,
    )
    if cfg.limit is not None:  # quick runs
        vcfg = dataclasses.replace(vcfg, batch_size=8, calibration_size=32, max_train_pairs=64)
    patches, mask = proxy_patches(col)
    data = cross_modal_data(col, "train", patches, mask, vcfg.max_train_pairs, True)
    with torch_threads(vcfg.threads):
        model, info = train_or_load(out / "vdr", data, vcfg, True, None, progress)
        codes = VDRCodes(model, vcfg.top_k, progress, cache_dir=out / "vdr")
        codes.encode_items(patches, mask)
    model_id = sha256_file(out / "vdr" / "model.safetensors")
    return codes.items(vcfg.top_k), codes.query_coder(vcfg.top_k), model_id, info


def _splice_codes(
    out: Path,
    col: Collection,
    encoder: Any,
    concepts_file: Path,
    cfg: PaperBenchConfig,
    progress: bool,
) -> tuple[sp.csr_matrix, QueryCoder, str, dict[str, Any]]:
    from sparsemm.baselines.splice import SpliceDecomposer, load_concepts
    from sparsemm_experiments.baselines.splice import embed_concepts, splice_query_coder

    concepts = load_concepts(concepts_file, cfg.splice_concepts)
    with torch_threads(1):
        cemb = embed_concepts(concepts, encoder, out / "splice", progress=progress)
    dense = col.image_embeddings()
    train = col.split_mask("train")
    rows, _ = col.caption_rows(train)
    dec = SpliceDecomposer(concepts, l1_penalty=cfg.splice_l1, progress=progress)
    dec.fit(dense[train], cemb, col.text_embeddings()[rows])
    codes = dec.transform(dense, "image")
    model_id = _fingerprint(
        {
            "concepts": hashlib.sha256("\n".join(concepts).encode()).hexdigest(),
            "l1": cfg.splice_l1,
            "collection": col.manifest.get("fingerprint", str(col.root)),
            "n_items": len(col.items),
        }
    )
    info = {
        "n_concepts": len(concepts),
        "l1_penalty": cfg.splice_l1,
        "nnz_items": float(codes.getnnz() / max(codes.shape[0], 1)),
    }
    return codes, splice_query_coder(dec, "text"), model_id, info


# ----------------------------------------------------------------------------- tables


def _table1_rows(main: str, have: Sequence[str]) -> list[tuple[str, str, str]]:
    rows = [
        ("Dense A only (reference)", "dense", "dense_a"),
        ("Dense SLQ", "dense", "slq"),
        ("Dense Avg Emb", "dense", "avg_emb"),
        ("Dense Avg Emb w=0.5", "dense", "avg_emb_0.5"),
        ("CBE", "dense", "cbe"),
        ("Dense detector", "dense", "dense_detector"),
        ("SpLiCE (two-step)", "splice", "paper"),
        ("SpLiCE code arith", "splice", "code_arith"),
        ("VDR (two-step)", "vdr", "paper"),
        ("VDR code arith", "vdr", "code_arith"),
        ("SR A only", main, "code_a"),
        ("SR (two-step)", main, "paper"),
        ("SR code arith", main, "code_arith"),
        ("SR penalty", main, "penalty"),
        ("SR detector", main, "detector"),
    ]
    return [r for r in rows if r[1] in have]


def _merge(
    runner: _Runner, rows: Sequence[tuple[str, str, str]]
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    merged: dict[str, dict[str, np.ndarray]] = {}
    subsets: dict[str, np.ndarray] | None = None
    for label, run, method in rows:
        per, subs = runner.per_query(run)
        if method not in per:
            continue
        if subsets is None:
            subsets = subs
        elif any(k not in subs or not np.array_equal(subsets[k], subs[k]) for k in subsets):
            raise SparsemmError(f"run {run!r} scored other queries than the first run")
        merged[label] = per[method]
    if subsets is None:
        raise SparsemmError("no benchmark run produced per-query values")
    return merged, subsets


def _retrieval_rows(runner: _Runner, systems: Mapping[str, str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    dense = runner.contents.get("dense", {}).get("retrieval", {}).get("dense")
    if dense:
        out["Dense (MiniLM caption views)"] = dense
    for label, run in systems.items():
        row = runner.contents.get(run, {}).get("retrieval", {}).get("sparse")
        if row:
            out[label] = row
    return out


def _table3(runner: _Runner, sweep: Mapping[str, str]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for label, run in sweep.items():
        c = runner.contents[run]
        row: dict[str, float | None] = {}
        for metric in TABLE3_METRICS:
            row[f"paper {metric}"] = c["subsets"]["all"]["means"]["paper"][metric]
        row["paper hard ap@10"] = c["subsets"]["hard"]["means"]["paper"]["ap@10"]
        row["code_arith ap@10"] = c["subsets"]["all"]["means"]["code_arith"]["ap@10"]
        row["code_arith hard ap@10"] = c["subsets"]["hard"]["means"]["code_arith"]["ap@10"]
        sparse = c.get("retrieval", {}).get("sparse") or {}
        row["t2i AP@1"] = sparse.get("t2i_AP@1")
        row["i2t AP@10"] = sparse.get("i2t_AP@10")
        out[label] = row
    return out


def _table3_markdown(table: Mapping[str, Mapping[str, float | None]]) -> str:
    cols = list(next(iter(table.values())))
    rows = [
        [name, *("-" if row[c] is None else f"{row[c]:.3f}" for c in cols)]
        for name, row in table.items()
    ]
    return "\n".join(md_table(["SR", *cols], rows, "l" + "r" * len(cols))) + "\n"


def _table3_plot(
    table: Mapping[str, Mapping[str, float | None]], dims: Sequence[int], main_dim: int, path: Path
) -> None:
    """AP@10 against d for the two-step rule and code arithmetic; x marks the no-bias SR."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    nobias = table.get(f"d={main_dim} no bias")
    for key, style in (("paper ap@10", "o-"), ("code_arith ap@10", "s-")):
        ys = [table[f"d={d}"][key] for d in dims]
        ax.plot(
            list(dims), [np.nan if y is None else float(y) for y in ys], style, label=f"SR {key}"
        )
        nb = None if nobias is None else nobias[key]
        if nb is not None:
            ax.plot([main_dim], [float(nb)], "x", markersize=10, label=f"{key}, no SPINE bias")
    ax.set_xlabel("SR latent dimension d")
    ax.set_ylabel("AP@10 (all queries)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=120)


# -------------------------------------------------------------------------------- run


def run_paper_bench(
    data_dir: str | Path,
    out_dir: str | Path,
    cfg: PaperBenchConfig | None = None,
    collection: str | Path | None = None,
    progress: bool = True,
    encoder: Any = "minilm",
    glove: Any = None,
    concepts_file: str | Path | None = None,
    on_stage: Callable[[str, float], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the whole reproduction into ``out_dir``; returns ``metrics.json``.

    ``data_dir`` holds ``coco/val2017.json`` (and ``splice/laion.txt`` unless
    ``concepts_file`` is given); ``collection`` reuses an encoded caption-proxy collection
    instead of encoding one in ``out_dir/collection``. ``encoder`` is the text encoder (a
    name or an object; MiniLM by default) and ``glove`` SPINE's input word vectors (default:
    the packaged GloVe 6B 50-d).
    """
    cfg = cfg or PaperBenchConfig()
    out = Path(out_dir)
    t_start = time.perf_counter()
    seconds: dict[str, float] = {}

    def stage(name: str, t0: float) -> None:
        seconds[name] = round(time.perf_counter() - t0, 1)
        log.info("stage %s: %.1f s", name, seconds[name])
        if on_stage is not None:
            on_stage(name, seconds[name])

    t0 = time.perf_counter()
    if collection is not None:
        col = open_collection(collection)
    else:
        col = encode_source(
            coco_json(data_dir),
            out / "collection",
            format="coco",
            encoder=encoder,
            limit=cfg.limit,
            progress=progress,
        )
    if col.has_images() and col.dim != col.text_dim:
        raise SparsemmError(
            f"bench paper runs on a caption-proxy collection (one text backbone); {col.root} "
            f"has {col.dim}-d images and {col.text_dim}-d texts"
        )
    if isinstance(encoder, str):
        from sparsemm_experiments.splice_runs import collection_text_encoder

        text_encoder = collection_text_encoder(col)
    else:
        text_encoder = encoder
    stage("collection", t0)

    bench = BenchConfig(limit_items=cfg.limit_items, max_grid=cfg.max_grid, seed=cfg.seed)
    runner = _Runner(col, out, text_encoder, bench)

    t0 = time.perf_counter()
    runner.run("dense", DENSE_METHODS, "dense:" + str(col.manifest.get("encoder")))
    stage("bench dense", t0)

    # Table 3 (and the SR rows of Tables 1-2): SPINE + SR at every d, and without bias.
    main = f"sr-d{cfg.main_dim}"
    sweep: dict[str, str] = {}
    sr_info: dict[str, Any] = {}
    variants = [(d, True) for d in cfg.dims] + ([(cfg.main_dim, False)] if cfg.no_bias else [])
    for d, with_bias in variants:
        name = f"sr-d{d}" + ("" if with_bias else "-nobias")
        t0 = time.perf_counter()
        vectors = None
        if with_bias:
            vectors = _spine(out, col, d, cfg, progress, glove)
            stage(f"spine d={d}", t0)
        t0 = time.perf_counter()
        model = _sr(out / "sr" / name, col, d, vectors, cfg, progress)
        stage(f"train {name}", t0)
        t0 = time.perf_counter()
        item_codes = sp.csr_matrix(model.encode(col.image_embeddings(), "image"))
        methods = SR_MAIN_METHODS if name == main else SR_SWEEP_METHODS
        runner.run(
            name,
            methods,
            sha256_file(out / "sr" / name / "model.safetensors"),
            item_codes=item_codes,
            query_coder=sr_query_coder(model),
            word_vectors=vectors,
            info={"sparse_model_name": f"SR d={d}" + ("" if with_bias else " no bias")},
        )
        stage(f"bench {name}", t0)
        label = f"d={d}" + ("" if with_bias else " no bias")
        sweep[label] = name
        sr_info[name] = {"latent_dim": d, "spine_bias": with_bias, "top_k": cfg.top_k}

    extras: dict[str, Any] = {}
    if cfg.vdr:
        t0 = time.perf_counter()
        codes, qc, model_id, info = _vdr_codes(out, col, cfg, progress)
        stage("train + encode vdr", t0)
        t0 = time.perf_counter()
        runner.run(
            "vdr",
            BASELINE_SPARSE_METHODS,
            model_id,
            item_codes=codes,
            query_coder=qc,
            info={"sparse_model_name": f"VDR (top-{cfg.vdr_top_k})"},
        )
        stage("bench vdr", t0)
        extras["vdr"] = {k: v for k, v in info.items() if k in ("pairs", "train", "seconds")}
    if cfg.splice:
        t0 = time.perf_counter()
        cfile = Path(concepts_file) if concepts_file else Path(data_dir) / "splice" / "laion.txt"
        codes, qc, model_id, info = _splice_codes(out, col, text_encoder, cfile, cfg, progress)
        stage("splice codes", t0)
        t0 = time.perf_counter()
        runner.run(
            "splice",
            BASELINE_SPARSE_METHODS,
            model_id,
            item_codes=codes,
            query_coder=qc,
            info={"sparse_model_name": f"SpLiCE (l1 {cfg.splice_l1})"},
        )
        stage("bench splice", t0)
        extras["splice"] = info

    # ------------------------------------------------------------------ merged tables
    t0 = time.perf_counter()
    rows1 = _table1_rows(main, list(runner.contents))
    per, subsets = _merge(runner, rows1)
    baselines = [b for b in TABLE1_BASELINES if b in per]
    n_q = int(next(iter(subsets.values())).shape[0])
    t1_config = {
        "name": "Table 1: 'A but not B' exclusion queries (COCO caption-proxy, test split)",
        "rows": {label: {"run": run, "strategy": m} for label, run, m in rows1},
        "chosen_parameters": {
            label: runner.contents[run].get("tuning", {}).get("chosen", {}).get(m, {})
            for label, run, m in rows1
        },
    }
    table1 = write_report(out / "table1", t1_config, per, subsets, list(METRICS), baselines)
    systems = {f"SR d={cfg.main_dim}": main}
    if "vdr" in runner.contents:
        systems["VDR"] = "vdr"
    if "splice" in runner.contents:
        systems["SpLiCE"] = "splice"
    systems.update({f"SR {k}": v for k, v in sweep.items() if v != main})
    table2 = _retrieval_rows(runner, systems)
    table3 = _table3(runner, sweep)
    bar_plot(
        table2,
        ["i2t_AP@1", "i2t_AP@10", "t2i_AP@1", "t2i_AP@10"],
        out / "plots" / "table2_retrieval.png",
        title="Table 2: retrieval",
    )
    _table3_plot(table3, cfg.dims, cfg.main_dim, out / "plots" / "table3_dimensions.png")
    stage("tables", t0)

    metrics: dict[str, Any] = {
        "format": "sparsemm.bench.paper",
        "version": 1,
        "git_commit": git_commit(),
        "config": dataclasses.asdict(cfg),
        "collection": str(col.root),
        "n_items": len(col.items),
        "n_queries": n_q,
        "table1": {
            "subsets": table1["subsets"],
            "baselines": baselines,
            "rows": t1_config["rows"],
            "chosen_parameters": t1_config["chosen_parameters"],
        },
        "table2": table2,
        "table3": table3,
        "sr_models": sr_info,
        "extras": extras,
        "reused_runs": runner.reused,
        "seconds": {**seconds, "total": round(time.perf_counter() - t_start, 1)},
    }
    write_json(out / "metrics.json", metrics)
    write_json(
        out / "config.json",
        {**dataclasses.asdict(cfg), "git_commit": metrics["git_commit"], "data": str(data_dir)},
    )
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(render_paper_report(metrics))
    log.info("bench paper done in %.1f s -> %s", metrics["seconds"]["total"], out)
    return metrics


def render_paper_report(m: Mapping[str, Any]) -> str:
    """``report.md`` from the ``metrics.json`` content (tables regenerate from it)."""
    t1 = m["table1"]
    lines = [
        "# SR paper tables on the COCO caption-proxy",
        "",
        f"Commit: `{m.get('git_commit', 'unknown')}`; {m['n_items']} items; "
        f"{m['n_queries']} exclusion queries on the test split; parameters tuned on train.",
        "",
        "## Table 1: 'A but not B' exclusion queries",
        "",
    ]
    for name, sub in t1["subsets"].items():
        lines += [f"### {name} ({sub['n_queries']} queries)", ""]
        lines.append(
            markdown_table(
                sub["means"],
                list(next(iter(sub["means"].values()))),
                baseline=t1["baselines"],
                p_values=sub.get("p_values") or {},
                n_queries=sub["n_queries"],
            )
        )
        lines += [f"![{name}](table1/{sub['plot']})", ""]
    lines += [
        "Strategies: *two-step* is the SR paper's rule (re-rank A's top-K by mass on D_A "
        "minus D_B); *code arith* cos(code(A) - w code(B), x); *penalty* subtracts the "
        "item's mass on B's dims; *detector* uses caption-word detectors; *Avg Emb* "
        "cos(emb(A) - w emb(B), x); *SLQ* embeds 'a photo of a A without a B'; *CBE* "
        "penalises similarity to what B retrieves. Parameters were tuned on the train split.",
        "",
        "## Table 2: standard retrieval (AP@k)",
        "",
        retrieval_markdown(m["table2"], bold_best=True),
        "![retrieval](plots/table2_retrieval.png)",
        "",
        "## Table 3: SR latent dimension and the SPINE bias",
        "",
        _table3_markdown(m["table3"]),
        "![dimensions](plots/table3_dimensions.png)",
        "",
        "## Time",
        "",
        *md_table(["stage", "seconds"], m["seconds"].items(), "lr"),
        "",
    ]
    if m.get("reused_runs"):
        lines += [f"Reused cached benchmark runs: {', '.join(m['reused_runs'])}.", ""]
    return "\n".join(lines)
