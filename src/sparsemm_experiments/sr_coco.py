"""The SR run on the COCO caption-proxy protocol (docs/formats.md), end to end.

encode (MiniLM caption views, cached) -> SPINE on GloVe (cached) -> SR on the ``train`` split
(minus a validation tenth) -> inference-mask choice on validation -> report on ``test``:
reconstruction error, non-zeros per code, text-to-image-view R@1/5/10 of SR vs dense, and
the top concept dimensions of a few test images with each dimension's SPINE top words.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection
from sparsemm.data.encode import encode_source
from sparsemm.encoders.base import Encoder
from sparsemm.io import atomic_open, write_json
from sparsemm.models.base import PretrainedMixin, encoder_record
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.runtime import torch_threads
from sparsemm.train.spine import train_caption_spine
from sparsemm.train.sr import SRTrainConfig, sr_pairs_from_collection, train_sr
from sparsemm.words.bias import sentence_bias
from sparsemm.words.evaluate import top_words
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors
from sparsemm_experiments.data.paths import coco_json
from sparsemm_experiments.eval.exclusion import git_commit
from sparsemm_experiments.eval.retrieval import recall_at_ks, target_ranks
from sparsemm_experiments.eval.tables import md_table
from sparsemm_experiments.train.detectors import ensure_model_detectors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProxyRunConfig:
    spine_top_words: int = 20000  # most frequent GloVe words + all train-caption words
    spine_epochs: int = 150  # SPINE epochs over that vocabulary (0.94 zeros; 60 gives ~0.91)
    sr_epochs: int = 20
    latent_dim: int = 1000  # SR d = SPINE hidden size
    top_k: int = 64  # training/inference TopK
    tau: float = 0.05
    contrastive_weight: float = 1.0
    use_bias: bool = True  # False: Table 3's "without SPINE bias" ablation
    val_fraction: float = 0.1  # share of train images held out to choose the inference mask
    limit: int | None = None  # quick runs: only the first N images of the COCO file
    seed: int = 0
    train_threads: int = 1  # torch threads for SPINE/SR training (see torch_threads)


def prepare_spine(
    out: Path,
    train_captions: list[str],
    cfg: ProxyRunConfig,
    progress: bool,
    glove: WordVectors | None = None,
) -> SparseWordVectors:
    """Train SPINE once (cached in ``out``) on the GloVe words plus ``train_captions``'
    words, with ``cfg``'s sizes (:func:`~sparsemm.train.spine.train_caption_spine`)."""
    return train_caption_spine(
        out,
        train_captions,
        latent_dim=cfg.latent_dim,
        top_words=cfg.spine_top_words,
        epochs=cfg.spine_epochs,
        seed=cfg.seed,
        progress=progress,
        glove=glove,
    )


def save_with_record(model: PretrainedMixin, collection: Collection, model_dir: Path) -> None:
    """Save ``model`` into ``model_dir`` with ``collection``'s encoders as its ``training``
    record (:func:`~sparsemm.models.base.encoder_record`), so ``sparsemm index``/``search``
    refuse it on a collection from other encoders.

    Re-saving a reloaded model (a finished, cached run, maybe from before the record
    existed) adds the record without training again. The save is one atomic change of
    config.json + weights: a kill before it leaves the model without a record (accepted
    everywhere), never a record of another run.
    """
    model.training_info = encoder_record(collection.manifest, collection.root)
    model.save_pretrained(model_dir)


def split_train_val(
    collection: Collection, val_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (fit, val) over items: a seeded random tenth of ``train`` is validation."""
    train = collection.split_mask("train")
    rng = np.random.default_rng(seed)
    val = train & (rng.random(len(train)) < val_fraction)
    return train & ~val, val


def _nnz(codes: sp.csr_matrix) -> float:
    return float(codes.getnnz(axis=1).mean()) if codes.shape[0] else 0.0


def evaluate_split(
    model: SRModel,
    collection: Collection,
    item_mask: np.ndarray,
    vectors: SparseWordVectors | None,
    masks: list[tuple[str, str, int]],
) -> dict[str, Any]:
    """Dense vs SR (each inference-mask variant) text-to-image-view retrieval on the items."""
    image = collection.image_embeddings()[item_mask]
    text_rows, targets = collection.caption_rows(item_mask)
    text = collection.text_embeddings()[text_rows]
    res: dict[str, Any] = {"n_images": int(item_mask.sum()), "n_queries": len(text_rows)}
    res["dense"] = recall_at_ks(target_ranks(text, image, targets))
    bias = None
    if vectors is not None:
        bias = sentence_bias([collection.texts[r]["text"] for r in text_rows], vectors)
    for name, mask, k in masks:
        img_codes = model.encode(image, "image", top_k=k, mask="all" if mask == "all" else "topk")
        txt_codes = model.encode(text, "text", bias=bias, top_k=k, mask=mask)
        rec = model.reconstruct(img_codes, "image")
        res[name] = {
            **recall_at_ks(target_ranks(txt_codes, img_codes, targets)),
            "nnz_image": _nnz(img_codes),
            "nnz_text": _nnz(txt_codes),
            "recon_image": float(((image - rec) ** 2).sum(axis=1).mean()),
            "recon_text": float(
                ((text - model.reconstruct(txt_codes, "text")) ** 2).sum(axis=1).mean()
            ),
        }
    return res


def mask_variants(top_k: int, use_bias: bool, latent_dim: int) -> list[tuple[str, str, int]]:
    """Inference masks compared on validation: top-k at k/2, k, 2k, 4k (within 1..d), top-k
    OR the query's sentence bias, and no mask."""
    ks = sorted({k for k in (top_k // 2, top_k, 2 * top_k, 4 * top_k) if 1 <= k <= latent_dim})
    out = [(f"topk{k}", "topk", k) for k in ks]
    if use_bias:
        out.append((f"topk{top_k}+bias", "topk_or_bias", top_k))
    out.append(("relu_all", "all", top_k))
    return out


def choose_mask(val: dict[str, Any], variants: list[tuple[str, str, int]], top_k: int) -> str:
    """Best mean R@1/5/10 on validation among variants with at most 2 x top_k non-zeros."""

    def score(name: str) -> float:
        r = val[name]
        return (r["R@1"] + r["R@5"] + r["R@10"]) / 3

    allowed = [n for n, _, _ in variants if val[n]["nnz_image"] <= 2 * top_k]
    return max(allowed, key=score)


def concept_examples(
    model: SRModel,
    collection: Collection,
    vectors: SparseWordVectors | None,
    item_rows: np.ndarray,
    top_k: int,
    n_dims: int = 5,
    n_words: int = 6,
) -> list[dict[str, Any]]:
    """For some items: captions, and top SR dimensions with each dimension's SPINE top words."""
    codes = model.encode(collection.image_embeddings()[item_rows], "image", top_k=top_k)
    out = []
    for r, row in zip(item_rows, codes, strict=True):
        order = np.argsort(-row.data)[:n_dims]
        dims = []
        for j in order:
            d = int(row.indices[j])
            words = [w for w, _ in top_words(vectors, d, n_words)] if vectors is not None else []
            dims.append({"dim": d, "value": round(float(row.data[j]), 4), "words": words})
        item = collection.items[int(r)]
        out.append(
            {
                "id": item["id"],
                "captions": item.get("captions", [])[:2],
                "labels": item.get("labels", []),
                "dims": dims,
            }
        )
    return out


def run_sr_coco(
    data_dir: str | Path,
    out_dir: str | Path,
    cfg: ProxyRunConfig | None = None,
    progress: bool = True,
    encoder: str | Encoder = "minilm",
    glove: WordVectors | None = None,
) -> dict[str, Any]:
    """The whole run; writes ``out_dir/{collection,spine,sr,metrics.json,report.md}``.

    ``encoder`` and ``glove`` default to MiniLM and the packaged GloVe 6B 50-d.
    """
    cfg = cfg or ProxyRunConfig()
    out = Path(out_dir)
    t0 = time.perf_counter()
    src = coco_json(data_dir)
    collection = encode_source(
        src, out / "collection", format="coco", encoder=encoder, limit=cfg.limit, progress=progress
    )
    t_enc = time.perf_counter() - t0
    fit, val = split_train_val(collection, cfg.val_fraction, cfg.seed)
    vectors = None
    if cfg.use_bias:
        train_caps = [
            t["text"]
            for t in collection.texts
            if collection.items[t["item"]].get("split") == "train"
        ]
        with torch_threads(cfg.train_threads):
            vectors = prepare_spine(out / "spine", train_caps, cfg, progress, glove)
    t_spine = time.perf_counter() - t0 - t_enc
    image, text, pair_item, bias = sr_pairs_from_collection(collection, fit, vectors)
    sr_cfg = SRConfig(
        text_dim=collection.text_dim,
        image_dim=collection.dim,
        latent_dim=cfg.latent_dim,
        top_k=cfg.top_k,
        tau=cfg.tau,
        contrastive_weight=cfg.contrastive_weight,
    )
    tc = SRTrainConfig(epochs=cfg.sr_epochs, seed=cfg.seed)
    with torch_threads(cfg.train_threads):
        model, history = train_sr(
            image, text, pair_item, bias, sr_cfg, out / "sr", tc, resume=True, progress=progress
        )
    t_sr = time.perf_counter() - t0 - t_enc - t_spine
    variants = mask_variants(cfg.top_k, cfg.use_bias, cfg.latent_dim)
    val_res = evaluate_split(model, collection, val, vectors, variants)
    chosen = choose_mask(val_res, variants, cfg.top_k)
    test = collection.split_mask("test")
    test_res = evaluate_split(model, collection, test, vectors, variants)
    kind = {n: (m, k) for n, m, k in variants}[chosen]
    if kind[0] == "topk":
        # Persist the validated inference k with the model, so `sparsemm index` uses it.
        model.config = dataclasses.replace(model.config, inference_top_k=kind[1])
    save_with_record(model, collection, out / "sr")
    # The served scorer's concept detectors, fitted on the training images (cached).
    ensure_model_detectors(model, out / "sr", collection, "train", progress=progress)
    examples = concept_examples(model, collection, vectors, np.flatnonzero(test)[:4], kind[1])
    encoder_info = {"name": collection.text_encoder_name, "dim": collection.text_dim}
    metrics = {
        "config": dataclasses.asdict(cfg),
        "encoder": encoder_info,
        "chosen_inference_mask": chosen,
        "validation": val_res,
        "test": test_res,
        "final_train_loss": history[-1] if history else None,
        "examples": examples,
        "seconds": {
            "encode": t_enc,
            "spine": t_spine,
            "sr": t_sr,
            "total": time.perf_counter() - t0,
        },
    }
    write_json(
        out / "config.json",
        {**dataclasses.asdict(cfg), "encoder": encoder_info, "git_commit": git_commit()},
    )
    write_json(out / "metrics.json", metrics)
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(render_report(metrics))
    return metrics


def render_report(m: dict[str, Any]) -> str:
    """Markdown tables generated from metrics.json."""
    chosen = m["chosen_inference_mask"]
    enc = m["encoder"]
    lines = [f"# SR on the COCO caption-proxy (chosen inference mask: {chosen})", ""]
    head = ["method", "R@1", "R@5", "R@10", "nnz image", "nnz text", "recon image", "recon text"]
    for split in ("validation", "test"):
        r = m[split]
        title = f"## {split}: {r['n_queries']} caption queries over {r['n_images']} image views"
        d = r["dense"]
        rows = [
            [
                f"dense {enc['name']}",
                *(f"{d[f'R@{k}']:.3f}" for k in (1, 5, 10)),
                f"{enc['dim']} (dense)",
                f"{enc['dim']} (dense)",
                "-",
                "-",
            ]
        ]
        for name, v in r.items():
            if not isinstance(v, dict) or name == "dense":
                continue
            mark = " (chosen)" if name == chosen else ""
            rows.append(
                [
                    f"SR {name}{mark}",
                    *(f"{v[f'R@{k}']:.3f}" for k in (1, 5, 10)),
                    f"{v['nnz_image']:.1f}",
                    f"{v['nnz_text']:.1f}",
                    f"{v['recon_image']:.3f}",
                    f"{v['recon_text']:.3f}",
                ]
            )
        lines += [title, "", *md_table(head, rows), ""]
    lines += ["## Top concept dimensions of some test images", ""]
    for ex in m["examples"]:
        caption = ex["captions"][0] if ex["captions"] else ""
        lines.append(f'- **{ex["id"]}** ({", ".join(ex["labels"])}): "{caption}"')
        for d in ex["dims"]:
            lines.append(f"  - dim {d['dim']} ({d['value']}): {', '.join(d['words'])}")
    s = m["seconds"]
    lines += [
        "",
        f"Wall time: encode {s['encode']:.0f} s, SPINE {s['spine']:.0f} s, "
        f"SR {s['sr']:.0f} s, total {s['total']:.0f} s.",
        "",
    ]
    return "\n".join(lines)
