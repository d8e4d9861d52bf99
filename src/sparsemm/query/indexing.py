"""Building a collection's index: every item coded by a sparse model, with named dimensions.

:func:`build_index` codes the collection's items (SR, VDR, the photo or CLIP concept model)
and stores the codes in an :class:`~sparsemm.index.InvertedIndex` inside the collection
folder, with a label for every concept dimension (:mod:`sparsemm.query.naming`) in the same
atomic commit; :func:`update_unit_lists` adds what the served ``match`` needs to certify
its results on large SR collections (:mod:`sparsemm.query.unit_lists`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import open_collection
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.linalg import normalize_rows
from sparsemm.models.base import check_encoders, config_digest
from sparsemm.models.detectors import model_weights_sha256
from sparsemm.models.lit_lite import AlignerLite
from sparsemm.query import unit_lists
from sparsemm.query.code_models import load_code_model
from sparsemm.query.handle import INDEX_DIR, LEGACY_LABELS, IndexedCollection
from sparsemm.query.naming import name_dimensions
from sparsemm.query.unit_lists import UnitLists, build_unit_lists, remove_unit_lists


def build_index(
    collection_dir: str | Path,
    model_dir: str | Path,
    spine_dir: str | Path | None = None,
    top_k: int | None = None,
    overwrite: bool = True,
    dense_model: str | Path | None = None,
    progress: bool = False,
) -> InvertedIndex:
    """Encode the collection's items (image embeddings / views) with SR; index the codes.

    Writes ``collection_dir/index/``: the inverted index with the dimension labels in its
    manifest's ``meta["labels"]``, so codes and labels are committed together in one atomic
    step; a crash leaves the previous index (and its labels) readable. A model that records
    its training collection's encoders must match the collection's (SparsemmError otherwise).
    ``dense_model`` names a linear aligner (``sparsemm train align``) that puts images and
    query texts in one dense space, for the dense strategies when the collection has two
    unaligned backbones.
    """
    col = open_collection(collection_dir)
    model = load_code_model(model_dir, top_k, collection=(col.manifest, collection_dir))
    if dense_model is not None:
        aligner = AlignerLite.from_pretrained(dense_model)
        check_encoders(aligner.training_info, col.manifest, dense_model, collection_dir)
        if (aligner.config.image_dim, aligner.config.text_dim) != (col.dim, col.text_dim):
            raise SparsemmError(
                f"the dense model {dense_model} aligns {aligner.config.image_dim}-d images "
                f"with {aligner.config.text_dim}-d texts, but the collection has "
                f"{col.dim}-d images and {col.text_dim}-d texts"
            )
    # Unit-length codes: the index's inner product is then the cosine the strategies use
    # (the photo model's codes hold probabilities, which its scorer reads as they are).
    codes = model.encode_items(col, progress=progress)
    codes = normalize_rows(codes) if model.unit_codes else sp.csr_matrix(codes, dtype=np.float32)
    spine_labels: list[list[str]] = []
    if spine_dir is not None and model.kind != "sr":
        raise SparsemmError("--spine labels SR dimensions; a VDR dimension is its own token")
    if spine_dir is not None:
        from sparsemm.words.evaluate import top_words
        from sparsemm.words.spine import SparseWordVectors

        vectors = SparseWordVectors.load(spine_dir)
        if vectors.dim != codes.shape[1]:
            raise SparsemmError(
                f"SPINE has {vectors.dim} dims but the model's codes have {codes.shape[1]}"
            )
        spine_labels = [[w for w, _ in top_words(vectors, j, 6)] for j in range(vectors.dim)]
    names = model.dim_names()
    # A VDR dimension is a word piece: its token is its label; others are named by the
    # vocabulary terms their top items share (sparsemm.query.naming).
    data_labels = [[n] for n in names] if names is not None else name_dimensions(col, codes, model)
    meta = {
        "model": str(Path(model_dir).resolve()),
        # which weights: a model retrained in the same folder is a different model
        "model_sha256": model_weights_sha256(model_dir),
        # and which settings: an edited config.json is refused by the Searcher
        "model_config_sha256": config_digest(model_dir),
        "model_type": model.kind,
        "spine": str(Path(spine_dir).resolve()) if spine_dir is not None else None,
        "top_k": model.top_k,
        "collection_encoder": col.encoder_name,
        "dense_model": str(Path(dense_model).resolve()) if dense_model is not None else None,
        "labels": {"data": data_labels, "spine": spine_labels},
    }
    # The folder open_collection found: a collection a crash left parked aside gets its
    # index there (the next collection write replaces both), not in a new bare folder.
    root = col.root / INDEX_DIR
    index = InvertedIndex.build(root, codes, col.ids, overwrite=overwrite, meta=meta)
    # Indexes built before labels moved into the manifest kept them in labels.json.
    with contextlib.suppress(FileNotFoundError):
        (root / LEGACY_LABELS).unlink()
    if model.kind == "sr" and len(index) >= unit_lists.MIN_ITEMS:  # read when called
        update_unit_lists(col.root, progress=progress)
    else:
        remove_unit_lists(col.root)
    return index


def update_unit_lists(collection_dir: str | Path, progress: bool = False) -> UnitLists | None:
    """Compute and save the collection's unit lists for the served ``match`` when its model
    has calibrated detectors and it holds at least :data:`~sparsemm.query.unit_lists.MIN_ITEMS`
    items; otherwise remove lists left from before (they would no longer fit)."""
    col = IndexedCollection(collection_dir)
    det = col.model.detectors  # no text encoder needed to know there are none
    small = len(col.index) < unit_lists.MIN_ITEMS
    if det is None or getattr(det, "calibration", None) is None or small:
        remove_unit_lists(col.collection.root)
        return None
    strat = col.match_strategy()
    lists = build_unit_lists(
        strat.scorer, col.text_context, col.codes, col.index, progress=progress
    )
    lists.save(col.collection.root)
    return lists
