"""SpLiCE as a research baseline: what the runs need around the library's decomposer.

The solver and :class:`~sparsemm.baselines.splice.SpliceDecomposer` (fit, transform,
recompose) are the library's, since the CLIP/SigLIP concept model codes items with them.
This module adds what only the benchmark runs use (``splice_runs``, ``paper_bench``):

- :func:`embed_concepts`: a concept vocabulary's text embeddings, cached by fingerprint;
- :func:`splice_query_coder`: query embeddings -> SpLiCE codes, for the exclusion strategies;
- :func:`reconstruction_cosine`, :func:`top_concepts`, :func:`explain`: how well codes
  rebuild the embeddings, and which concepts a code holds;
- :func:`save_decomposer` / :func:`load_decomposer`: a fitted decomposer as ``config.json``,
  ``concepts.json`` and ``model.safetensors`` (no pickle).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.baselines.splice import SpliceDecomposer, check_matrix
from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, load_npy, read_json, save_npy, write_json
from sparsemm.linalg import normalize_rows

logger = logging.getLogger(__name__)

MODEL_TYPE = "splice"


# ------------------------------------------------------------------------- concepts


def concept_fingerprint(concepts: Sequence[str], encoder_id: str, template: str) -> str:
    """Stable short hash of (encoder, template, concept list) naming an embedding cache."""
    h = hashlib.sha256()
    h.update(json.dumps([encoder_id, template, list(concepts)]).encode("utf-8"))
    return h.hexdigest()[:16]


def embed_concepts(
    concepts: Sequence[str],
    encoder: Any,
    cache_dir: str | Path | None = None,
    template: str = "{}",
    batch_size: int = 256,
    progress: bool = False,
) -> np.ndarray:
    """(n_concepts, k) unit-length text embeddings of ``template.format(concept)``.

    With ``cache_dir`` the array is stored as ``concepts-<fingerprint>.npy`` (fingerprint of
    the encoder name and model, the template and the concept list) and reloaded next time.
    """
    if "{}" not in template:
        raise SparsemmError(f"the concept template must contain '{{}}', got {template!r}")
    enc_id = (
        f"{getattr(encoder, 'name', type(encoder).__name__)}:{getattr(encoder, 'model_id', '')}"
    )
    path = None
    if cache_dir is not None:
        fp = concept_fingerprint(concepts, enc_id, template)
        path = Path(cache_dir) / f"concepts-{fp}.npy"
        if path.is_file():
            emb = load_npy(path)
            if emb.shape[0] == len(concepts):
                logger.info("concept embeddings from cache %s", path)
                return emb.astype(np.float32)
    t0 = time.perf_counter()
    texts = [template.format(c) for c in concepts]
    emb = np.asarray(
        encoder.encode_text(texts, batch_size=batch_size, normalize=True, progress=progress),
        dtype=np.float32,
    )
    emb = normalize_rows(check_matrix(emb, None, "concept embeddings"))
    logger.info("embedded %d concepts in %.1f s", len(concepts), time.perf_counter() - t0)
    if path is not None:
        save_npy(path, emb)
    return emb


def splice_query_coder(decomposer: SpliceDecomposer, modality: str = "text") -> Any:
    """A :data:`sparsemm.query.strategies.QueryCoder`: query embeddings -> SpLiCE codes."""

    def code(emb: np.ndarray, texts: Sequence[str]) -> sp.csr_matrix:
        return decomposer.transform(emb, modality)

    return code


# ------------------------------------------------------------------------- codes


def reconstruction_cosine(
    decomposer: SpliceDecomposer,
    embeddings: np.ndarray,
    codes: sp.csr_matrix,
    modality: str = "image",
) -> dict[str, float]:
    """Mean cosine of targets with their reconstructions, centred and uncentred."""
    z = decomposer.center(embeddings, modality)
    zc = normalize_rows(np.asarray(codes @ decomposer.dictionary_))
    x = normalize_rows(embeddings)
    xr = decomposer.recompose(codes, modality)
    return {
        "cosine_centered": float((z * zc).sum(axis=1).mean()),
        "cosine": float((x * xr).sum(axis=1).mean()),
    }


def top_concepts(
    decomposer: SpliceDecomposer, codes: sp.csr_matrix, row: int = 0, n: int = 10
) -> list[tuple[str, float]]:
    """The ``n`` heaviest (concept, weight) pairs of one code row, heaviest first."""
    codes = sp.csr_matrix(codes)
    if not 0 <= row < codes.shape[0]:
        raise SparsemmError(f"row {row} out of range for {codes.shape[0]} codes")
    concepts = decomposer.concepts
    if codes.shape[1] != len(concepts):
        raise SparsemmError(
            f"codes have {codes.shape[1]} dims but the decomposer {len(concepts)} concepts"
        )
    lo, hi = codes.indptr[row], codes.indptr[row + 1]
    idx, val = codes.indices[lo:hi], codes.data[lo:hi]
    order = np.argsort(-val, kind="stable")[:n]
    return [(concepts[int(idx[i])], float(val[i])) for i in order]


def explain(
    decomposer: SpliceDecomposer, embeddings: np.ndarray, n: int = 10, modality: str = "image"
) -> list[list[tuple[str, float]]]:
    """Top concepts of each embedding's code (decomposes ``embeddings`` first)."""
    codes = decomposer.transform(embeddings, modality)
    return [top_concepts(decomposer, codes, i, n) for i in range(codes.shape[0])]


# ------------------------------------------------------------------------- persistence


def decomposer_config(decomposer: SpliceDecomposer) -> dict[str, Any]:
    """The settings ``config.json`` records (and the fitted scales)."""
    return {
        "model_type": MODEL_TYPE,
        "l1_penalty": decomposer.l1_penalty,
        "solver": decomposer.solver,
        "tol": decomposer.tol,
        "max_iter": decomposer.max_iter,
        "working_set": decomposer.working_set,
        "batch_size": decomposer.batch_size,
        "image_scale": getattr(decomposer, "image_scale_", None),
        "text_scale": getattr(decomposer, "text_scale_", None),
    }


def save_decomposer(decomposer: SpliceDecomposer, out_dir: str | Path) -> Path:
    """Write ``config.json``, ``concepts.json`` and ``model.safetensors`` (no pickle)."""
    from safetensors.numpy import save as save_bytes

    decomposer.require_fitted()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        "dictionary": np.ascontiguousarray(decomposer.dictionary_, dtype=np.float32),
        "concept_mean": np.ascontiguousarray(decomposer.concept_mean_, dtype=np.float32),
        "image_mean": np.ascontiguousarray(decomposer.image_mean_, dtype=np.float32),
        "text_mean": np.ascontiguousarray(decomposer.text_mean_, dtype=np.float32),
    }
    with atomic_open(out / "model.safetensors", "wb") as fh:
        fh.write(save_bytes(tensors, metadata={"model_type": MODEL_TYPE}))
    write_json(out / "concepts.json", decomposer.concepts)
    write_json(out / "config.json", decomposer_config(decomposer))
    return out


def load_decomposer(model_dir: str | Path, progress: bool = False) -> SpliceDecomposer:
    """A decomposer :func:`save_decomposer` wrote; a one-line SparsemmError for a folder
    that does not hold one, or holds a damaged one."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    d = Path(model_dir)
    files = ("config.json", "concepts.json", "model.safetensors")
    if not all((d / f).is_file() for f in files):
        raise SparsemmError(f"{d} is not a saved SpLiCE decomposer (needs {', '.join(files)})")
    cfg = read_json(d / "config.json")
    if cfg.get("model_type") != MODEL_TYPE:
        raise SparsemmError(f"{d} holds a {cfg.get('model_type')!r} model, not 'splice'")
    try:
        t = load_file(str(d / "model.safetensors"))
    except (OSError, ValueError, SafetensorError) as exc:
        raise SparsemmError(f"{d}/model.safetensors is corrupt ({exc}); re-create it") from exc
    concepts = read_json(d / "concepts.json")
    if t["dictionary"].shape[0] != len(concepts):
        raise SparsemmError(f"{d}: concepts.json does not match the dictionary; re-create it")
    obj = SpliceDecomposer(
        concepts,
        l1_penalty=cfg["l1_penalty"],
        solver=cfg["solver"],
        tol=cfg["tol"],
        max_iter=cfg["max_iter"],
        working_set=cfg["working_set"],
        batch_size=cfg["batch_size"],
        progress=progress,
    )
    obj.dictionary_ = t["dictionary"]
    obj.concept_mean_ = t["concept_mean"]
    obj.image_mean_ = t["image_mean"]
    obj.text_mean_ = t["text_mean"]
    obj.image_scale_ = float(cfg["image_scale"])
    obj.text_scale_ = float(cfg["text_scale"])
    return obj
