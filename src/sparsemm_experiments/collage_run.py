"""The offline demo on real pixels: Fashion-MNIST collages, end to end.

collages (real Fashion-MNIST photos, captions from templates) -> encode (EfficientNet-Lite0
image features, MiniLM caption embeddings: two unaligned backbones) -> SPINE on GloVe ->
cross-modal SR (one encoder/decoder per modality) and the dense baseline trained on the same
pairs (a linear contrastive alignment of the same features, LiT-style) -> inverted index ->
the exclusion benchmark on the test collages (every strategy, tuned on train) -> an HTML
report showing, for example queries, dense and SR results side by side with explanations.

Every stage is cached in the output folder (collages and collection by their settings,
SPINE/SR/aligner by resumable checkpoints), so a second run reuses them and an interrupted
one continues.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsemm.data.collection import Collection, open_collection
from sparsemm.data.encode import encode_source
from sparsemm.encoders.base import get_encoder
from sparsemm.errors import SparsemmError
from sparsemm.io import read_json, write_json
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.runtime import torch_threads
from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection, train_sr
from sparsemm_experiments.data.fashion import build_collages
from sparsemm_experiments.eval.exclusion import git_commit
from sparsemm_experiments.models.lit import AlignConfig, AlignedTextEncoder, LinearAligner
from sparsemm_experiments.sr_coco import ProxyRunConfig, prepare_spine, save_with_record
from sparsemm_experiments.train.detectors import ensure_model_detectors
from sparsemm_experiments.train.lit import train_aligner

log = logging.getLogger(__name__)

HEADLINE = ("avg_emb_0.5", "dense_detector", "code_arith", "detector", "hybrid", "match")
DEMO_QUERIES = (
    "sneaker but not bag",
    "dress but not sandal",
    "coat but not ankle boot",
    "bag but not sneaker",
    "pullover but not shirt",
    "trousers but not pullover",
)


@dataclass(frozen=True)
class CollageRunConfig:
    n_train: int = 2000  # train collages (Fashion-MNIST train photos)
    n_test: int = 500  # test collages (Fashion-MNIST test photos): the benchmark's items
    image_size: int = 224  # collage side in pixels (EfficientNet-Lite0's input size)
    spine_top_words: int = 5000  # most frequent GloVe words + all caption words
    spine_epochs: int = 100
    latent_dim: int = 1000  # SR d = SPINE hidden size
    top_k: int = 64  # SR TopK at training and inference
    sr_epochs: int = 10  # chosen on a validation tenth of train (20 overfits the dense model)
    align_dim: int = 512  # dense baseline's shared space
    align_epochs: int = 10
    tau: float = 0.05  # both models' InfoNCE temperature
    use_bias: bool = True  # False: SR without the SPINE caption bias (ablation)
    bench: bool = True  # run the exclusion benchmark (every strategy)
    max_grid: int | None = None  # quick runs: fewer tuning grid points per strategy
    n_results: int = 10  # results per column in the report
    seed: int = 0
    train_threads: int = 1  # torch threads for training (see sparsemm_experiments.sr_coco)


def _stage(timings: dict[str, float], name: str, t0: float) -> None:
    timings[name] = round(time.perf_counter() - t0, 1)
    log.info("stage %s: %.1f s", name, timings[name])


def _collages(out: Path, cfg: CollageRunConfig, progress: bool) -> Path:
    """Build the collages once; rebuild when the settings differ from the cached ones."""
    folder = out / "collages"
    meta = folder / "collages.json"
    if meta.is_file() and (folder / "items.jsonl").is_file():
        have = read_json(meta)
        same = (
            have.get("seed") == cfg.seed
            and have.get("image_size") == cfg.image_size
            and have.get("counts") == {"train": cfg.n_train, "test": cfg.n_test}
        )
        if same:
            return folder / "items.jsonl"
    return build_collages(
        folder,
        cfg.n_train,
        cfg.n_test,
        seed=cfg.seed,
        image_size=cfg.image_size,
        progress=progress,
    )


def train_models(
    col: Collection, out: Path, cfg: CollageRunConfig, progress: bool
) -> tuple[SRModel, LinearAligner, Any, dict[str, float]]:
    """SPINE, SR and the aligner on the train split (each cached / resumable). SR and the
    aligner are saved with the collection's encoders as their ``training`` record
    (:func:`~sparsemm_experiments.sr_coco.save_with_record`)."""
    timings: dict[str, float] = {}
    train_mask = col.split_mask("train")
    if not train_mask.any():
        raise SparsemmError("the collage collection has no train items")
    vectors = None
    if cfg.use_bias:
        t0 = time.perf_counter()
        rows, _ = col.caption_rows(train_mask)
        spine_cfg = ProxyRunConfig(
            spine_top_words=cfg.spine_top_words,
            spine_epochs=cfg.spine_epochs,
            latent_dim=cfg.latent_dim,
            seed=cfg.seed,
        )
        with torch_threads(cfg.train_threads):
            vectors = prepare_spine(
                out / "spine", [col.texts[r]["text"] for r in rows], spine_cfg, progress
            )
        _stage(timings, "spine", t0)
    image, text, pair_item, bias = sr_pairs_from_collection(col, train_mask, vectors)
    t0 = time.perf_counter()
    sr_cfg = SRConfig(
        text_dim=text.shape[1],
        image_dim=image.shape[1],
        latent_dim=cfg.latent_dim,
        shared=False,  # EfficientNet and MiniLM are not aligned: one encoder per modality
        top_k=cfg.top_k,
        tau=cfg.tau,
    )
    tc = SRTrainConfig(epochs=cfg.sr_epochs, seed=cfg.seed)
    with torch_threads(cfg.train_threads):
        sr, _ = train_sr(
            image, text, pair_item, bias, sr_cfg, out / "sr", tc, resume=True, progress=progress
        )
    save_with_record(sr, col, out / "sr")
    _stage(timings, "sr", t0)
    t0 = time.perf_counter()
    ensure_model_detectors(sr, out / "sr", col, "train", progress=progress)
    _stage(timings, "detectors", t0)
    t0 = time.perf_counter()
    al_cfg = AlignConfig(
        image_dim=image.shape[1], text_dim=text.shape[1], dim=cfg.align_dim, tau=cfg.tau
    )
    ac = SRTrainConfig(epochs=cfg.align_epochs, seed=cfg.seed)
    with torch_threads(cfg.train_threads):
        aligner, _ = train_aligner(
            image, text, pair_item, al_cfg, out / "align", ac, resume=True, progress=progress
        )
    save_with_record(aligner, col, out / "align")
    _stage(timings, "align", t0)
    return sr, aligner, vectors, timings


def run_bench(
    col: Collection,
    out_dir: Path,
    sr: SRModel,
    aligner: LinearAligner,
    text_encoder: Any,
    vectors: Any,
    cfg: CollageRunConfig,
    detectors: Any = None,
) -> dict[str, Any]:
    """The exclusion benchmark on the test collages: dense strategies in the aligned space,
    sparse ones on the SR codes (SR reads the raw MiniLM embeddings of the query texts)."""
    from sparsemm.query.strategies import sr_query_coder
    from sparsemm_experiments.eval.bench import BenchConfig, run_exclusion_bench

    return run_exclusion_bench(
        col,
        out_dir,
        AlignedTextEncoder(text_encoder, aligner),
        # SR reads the raw image features; the dense strategies get the aligned projection.
        item_codes=sr.encode(col.image_embeddings(), "image"),
        query_coder=sr_query_coder(sr, text_encoder=text_encoder),
        word_vectors=vectors,
        config=BenchConfig(max_grid=cfg.max_grid, seed=cfg.seed),
        run_info={
            "sparse_model_name": "SR",
            "dense_model": "linear alignment of EfficientNet-Lite0 and MiniLM (LiT-style)",
            "collage_run": dataclasses.asdict(cfg),
        },
        dense_items=aligner.encode_image(col.image_embeddings()),
        dense_texts=aligner.encode_text_features(col.text_embeddings()),
        detectors=detectors,
    )


def headline(bench: Mapping[str, Any], methods: Sequence[str] = HEADLINE) -> str:
    """One line: test AP@10 and violation@10 (all/hard queries) of the headline methods."""
    subsets = bench["subsets"]
    parts = []
    for m in methods:
        if m not in subsets["all"]["means"]:
            continue
        a, h = subsets["all"]["means"][m], subsets["hard"]["means"].get(m, {})
        hard = f"{h['ap@10']:.3f}" if "ap@10" in h else "-"
        hviol = f"{h['violation@10']:.3f}" if "violation@10" in h else "-"
        parts.append(f"{m} {a['ap@10']:.3f}/{hard} (violation {a['violation@10']:.3f}/{hviol})")
    n, nh = subsets["all"]["n_queries"], subsets["hard"]["n_queries"]
    return f"test exclusion AP@10 all/hard ({n}/{nh} queries): " + "; ".join(parts)


def run_collage_demo(
    out_dir: str | Path,
    cfg: CollageRunConfig | None = None,
    queries: Sequence[str] = DEMO_QUERIES,
    progress: bool = True,
) -> dict[str, Any]:
    """Run every stage into ``out_dir`` (see the module docstring); return the summary that
    is also written to ``out_dir/summary.json``."""
    from sparsemm.query.indexing import build_index
    from sparsemm_experiments.demo_report import write_demo_report

    cfg = cfg or CollageRunConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    items = _collages(out, cfg, progress)
    _stage(timings, "collages", t0)

    t0 = time.perf_counter()
    col = encode_source(
        items, out / "collection", encoder="efficientnet", text_encoder="minilm", progress=progress
    )
    _stage(timings, "encode", t0)

    sr, aligner, vectors, t_models = train_models(col, out, cfg, progress)
    timings.update(t_models)

    t0 = time.perf_counter()
    build_index(
        col.root,
        out / "sr",
        spine_dir=out / "spine" / "vectors" if cfg.use_bias else None,
        dense_model=out / "align",
    )
    _stage(timings, "index", t0)

    text_encoder = get_encoder("minilm")
    bench: dict[str, Any] | None = None
    if cfg.bench:
        t0 = time.perf_counter()
        from sparsemm.models.detectors import ConceptDetectors

        detectors = ConceptDetectors.for_model(out / "sr")
        bench = run_bench(col, out / "bench", sr, aligner, text_encoder, vectors, cfg, detectors)
        _stage(timings, "bench", t0)

    t0 = time.perf_counter()
    col = open_collection(col.root)
    report = write_demo_report(
        out / "report",
        col,
        bench,
        queries,
        cfg.n_results,
        timings,
        text_encoder,
        commands=[
            f"sparsemm serve {col.root}   # the search page on http://127.0.0.1:8000",
            f'sparsemm search {col.root} "sneaker but not bag" --explain',
        ],
    )
    _stage(timings, "report", t0)
    timings["total"] = round(time.perf_counter() - t_all, 1)
    summary = {
        "headline": headline(bench) if bench is not None else None,
        "config": dataclasses.asdict(cfg),
        "git_commit": git_commit(),
        "timings_s": timings,
        "report": str(report),
        "collection": str(col.root),
        "bench": str(out / "bench") if bench is not None else None,
    }
    write_json(out / "summary.json", summary)
    return summary
