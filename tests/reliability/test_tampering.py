"""Probes of a red-team pass that found things going wrong in silence: malformed manifest
counts, edited model settings, a benchmark on a collection of photos, changed or truncated
segment files under a running server, forms of many parts and uploads just under the cap."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reltools import index_version

from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.query.searcher import Searcher


@pytest.fixture()
def index_root(tmp_path: Path) -> Path:
    codes, ids = index_version(1, 500)
    InvertedIndex.build(tmp_path / "idx", codes, ids, meta={"top_k": 8, "model": "m"})
    return tmp_path / "idx"


@pytest.mark.parametrize("count", [None, [1], math.nan, "500", -1, True])
def test_a_manifest_count_that_is_not_a_count_is_one_error(index_root: Path, count: Any) -> None:
    manifest = json.loads((index_root / "manifest.json").read_text())
    manifest["count"] = count
    (index_root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SparsemmError, match=r"manifest\.json has no valid item count"):
        InvertedIndex.open(index_root)


def test_edited_model_settings_are_refused(toy_root: Path, tmp_path: Path) -> None:
    """The index records the checksum of its model's settings (config.json without the
    weights checksum): an edit after indexing is named, not served."""
    from webtoy import WebKeywordEncoder

    root = tmp_path / "toy"
    shutil.copytree(toy_root, root, symlinks=True)
    from sparsemm.query.indexing import build_index

    build_index(root / "col", root / "sr", overwrite=True)  # the model at its new place
    Searcher(root / "col", encoder=WebKeywordEncoder())
    config = root / "sr" / "config.json"
    cfg = json.loads(config.read_text())
    config.write_text(json.dumps({**cfg, "top_k": cfg["top_k"] + 1}))
    with pytest.raises(SparsemmError, match=r"config\.json changed since the index"):
        Searcher(root / "col", encoder=WebKeywordEncoder())
    config.write_text(json.dumps(cfg, indent=1))  # the same settings, written otherwise
    Searcher(root / "col", encoder=WebKeywordEncoder())


def test_the_load_benchmark_queries_a_collection_without_labels_or_captions(
    tmp_path: Path,
) -> None:
    """`benchmarks/load.py` on a `sparsemm up` collection once failed with "need at least
    two terms": it now queries the index's concept names."""
    from load import collection_terms, search_paths

    from sparsemm.data.collection import write_collection

    items = [{"id": f"p{i}"} for i in range(6)]
    write_collection(tmp_path / "col", items, {"name": "e", "dim": 3},
                     image_emb=np.eye(6, 3, dtype=np.float32) + 0.1)  # fmt: skip
    codes = np.zeros((6, 3), np.float32)
    codes[:4, 0] = codes[2:, 1] = codes[5, 2] = 1.0
    labels = {"data": [["tabby"], ["coffee mug"], ["person (face)"]], "spine": []}
    import scipy.sparse as sp

    InvertedIndex.build(tmp_path / "col" / "index", sp.csr_matrix(codes),
                        [f"p{i}" for i in range(6)], meta={"labels": labels})  # fmt: skip
    terms = collection_terms(tmp_path / "col")
    assert terms == ["tabby", "coffee mug"]
    assert len(search_paths(terms, n=4)) == 4
