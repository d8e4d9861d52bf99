"""The Qdrant backend (through qdrant-client's local mode) gives exactly the inverted index's
results: sparse, filter and penalty exclusions, ties; plus resumable uploads and `sparsemm
index/search --backend qdrant` end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from index_testlib import random_codes

from fakes import KeywordEncoder
from sparsemm.cli.main import main
from sparsemm.data.collection import write_collection
from sparsemm.encoders.base import register_encoder
from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion, InvertedIndex, SearchResult
from sparsemm.index.qdrant import META_KEY, QdrantConfig, QdrantStore, active_lists, connect
from sparsemm.models.sr import SRConfig, SRModel

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*local Qdrant:UserWarning"),
    pytest.mark.filterwarnings("ignore:Local mode performs exact:UserWarning"),
]

DIM = 24
THRESHOLDS = (0.0, 0.5)


def _same(local: SearchResult, qd: SearchResult) -> None:
    """The index's hits scoring > 0 (it may rank zero scores after them; Qdrant leaves
    them out) equal Qdrant's: rows, ids and scores bit for bit."""
    pos = local.scores > 0
    np.testing.assert_array_equal(local.rows[pos], qd.rows)
    np.testing.assert_array_equal(local.scores[pos], qd.scores)  # bit for bit
    assert [i for i, p in zip(local.ids, pos, strict=True) if p] == qd.ids


def _pair(
    tmp_path: Path, codes: sp.csr_matrix, batch: int = 37
) -> tuple[InvertedIndex, QdrantStore]:
    ids = [f"x{i}" for i in range(codes.shape[0])]
    local = InvertedIndex.build(tmp_path / "ix", codes, ids)
    q = QdrantStore.create(connect(":memory:"), "items", DIM, QdrantConfig(thresholds=THRESHOLDS))
    q.upload(codes, ids, batch_size=batch)
    return local, q


def _exclusions(rng: np.random.Generator) -> list[Exclusion | None]:
    return [
        None,
        Exclusion(rng.choice(DIM, 3, replace=False)),
        Exclusion(rng.choice(DIM, 2, replace=False), threshold=0.5),
        Exclusion(rng.choice(DIM, 3, replace=False), mode="penalty", penalty=0.75),
    ]


@pytest.mark.parametrize("dyadic", [True, False])
def test_identical_results_to_the_inverted_index(tmp_path: Path, dyadic: bool) -> None:
    """Dyadic data has many exact ties (broken by row); float data has rounding near-ties."""
    rng = np.random.default_rng(11)
    codes = random_codes(rng, 200, DIM, max_nnz=6, dyadic=dyadic)
    local, qd = _pair(tmp_path, codes)
    assert [len(local), len(qd)] == [200, 200]
    for _ in range(6):
        q = np.zeros(DIM, np.float32)
        dims = rng.choice(DIM, 5, replace=False)
        q[dims] = rng.choice(np.array([0.25, 0.5, 1.0]), 5) if dyadic else rng.random(5)
        for ex in _exclusions(rng):
            for k in (1, 8, 250):
                _same(local.search(q, k, ex), qd.search(q, k, ex))
            # the served path's candidate lists: Qdrant's are exact (err 0)
            res, err = qd.search_quantized((np.flatnonzero(q), q[q != 0]), 8)
            assert err == 0.0
            _same(local.search(q, 8), res)
    rows = np.array([5, 199, 0, 5])
    assert (qd.codes(rows) != local.codes(rows)).nnz == 0 and qd.codes(rows).has_sorted_indices


def test_ties_at_the_cut_fetch_past_the_limit(tmp_path: Path) -> None:
    """100 items with one equal score: the k returned are the lowest rows, as locally."""
    codes = sp.csr_matrix(np.tile(np.eye(1, DIM, 3, dtype=np.float32), (100, 1)))
    local, qd = _pair(tmp_path, codes)
    q = np.eye(1, DIM, 3, dtype=np.float32)[0]
    _same(local.search(q, 5), qd.search(q, 5))
    assert qd.search(q, 5).rows.tolist() == [0, 1, 2, 3, 4]


def test_threshold_compared_like_the_index() -> None:
    """float32(0.1) is > 0.1 in float64 (the index's comparison), not in float32."""
    csr = sp.csr_matrix(np.array([[0.1, 0.2, 0.0], [0.0, 0.05, 0.1]], np.float32))
    assert active_lists(csr, 0.1) == [[0, 1], [2]]
    assert active_lists(csr, 0.0) == [[0, 1], [1, 2]]


def test_unserved_threshold_and_other_errors(tmp_path: Path) -> None:
    codes = random_codes(np.random.default_rng(0), 30, DIM, max_nnz=4)
    _, qd = _pair(tmp_path, codes)
    with pytest.raises(SparsemmError, match="thresholds"):
        qd.search(np.ones(DIM), 3, Exclusion([1, 2], threshold=0.3))
    with pytest.raises(SparsemmError, match="already exists"):
        QdrantStore.create(qd.client, "items", DIM)
    with pytest.raises(SparsemmError, match="no collection"):
        QdrantStore.open(qd.client, "nope")
    with pytest.raises(SparsemmError, match="already in"):
        qd.add(codes[:2], ["x1", "new"])
    with pytest.raises(SparsemmError, match="not a URL"):
        connect("localhost")
    with pytest.raises(SparsemmError, match="thresholds must be"):
        QdrantConfig(thresholds=(-1.0,))


def test_resume_and_orphan_points(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    codes = random_codes(rng, 90, DIM, max_nnz=5)
    ids = [f"x{i}" for i in range(90)]
    local = InvertedIndex.build(tmp_path / "ix", codes, ids)
    client = connect(":memory:")
    qd = QdrantStore.create(client, "c", DIM, QdrantConfig(thresholds=THRESHOLDS))
    qd.add(codes[:40], ids[:40], batch_size=16)
    # a crash after Qdrant took rows 40.. but before the count was recorded: orphans
    client.upsert("c", qd._points(40, codes[40:60], ids[40:60]), wait=True)
    qd = QdrantStore.open(client, "c")
    assert len(qd) == 40
    q = np.asarray(codes[45].toarray()).ravel()
    assert all(r < 40 for r in qd.search(q, 20).rows.tolist())
    with pytest.raises(SparsemmError, match="not the first"):
        qd.upload(codes[1:], ids[1:])
    with pytest.raises(SparsemmError, match="not the first"):  # fewer than it holds
        qd.upload(codes[:10], ids[:10])
    other = codes.copy()
    other.data[0] += 1
    with pytest.raises(SparsemmError, match="not the first"):  # other values, same ids
        qd.upload(other, ids)
    assert qd.upload(codes, ids, batch_size=16) == 50
    assert len(QdrantStore.open(client, "c")) == 90
    assert qd.upload(codes, ids) == 0  # nothing left
    for ex in (None, Exclusion([1, 5], threshold=0.5)):
        _same(local.search(q, 10, ex), qd.search(q, 10, ex))


def test_a_collection_of_an_earlier_version_opens(tmp_path: Path) -> None:
    """Collections written when the store also held dense vectors name them in their
    metadata; they open and search as before."""
    codes = random_codes(np.random.default_rng(5), 30, DIM, max_nnz=4)
    local, qd = _pair(tmp_path, codes)
    meta = dict(qd._meta, dense_dim=None, max_dense_norm=0.0)
    meta["config"] = dict(meta["config"], dense_name="dense", exact_dense=True)
    qd.client.update_collection("items", metadata={META_KEY: meta})
    old = QdrantStore.open(qd.client, "items")
    q = np.asarray(codes[7].toarray()).ravel()
    _same(local.search(q, 10), old.search(q, 10))


# ------------------------------------------------------------------------------- the CLI

WORDS = ("dog", "cat", "pizza", "car", "tree")
ITEMS = {
    "d1": ["dog"],
    "d2": ["dog", "tree"],
    "dc1": ["dog", "cat"],
    "c1": ["cat"],
    "p1": ["pizza", "car"],
    "t1": ["tree"],
}


class StoreToyEncoder(KeywordEncoder):
    name = "toykw_store"
    keywords = WORDS


register_encoder("toykw_store")(StoreToyEncoder)


def _toy_collection(tmp_path: Path) -> tuple[Path, Path]:
    enc = StoreToyEncoder()
    items, texts = [], []
    for i, (iid, objs) in enumerate(ITEMS.items()):
        caps = [" and ".join(objs)]
        items.append({"id": iid, "captions": caps, "labels": objs, "split": "train"})
        texts += [{"item": i, "text": c} for c in caps]
    col = tmp_path / "col"
    write_collection(
        col,
        items,
        {"name": "toykw_store", "dim": len(WORDS)},
        image_emb=enc.encode_text([" ".join(o) for o in ITEMS.values()]),
        text_emb=enc.encode_text([t["text"] for t in texts]),
        texts=texts,
    )
    d = len(WORDS)
    model = SRModel(SRConfig(text_dim=d, image_dim=d, latent_dim=d, top_k=3))
    with torch.no_grad():  # code = the keyword vector itself
        model.enc_text.weight.copy_(torch.eye(d))
        model.enc_text.bias.zero_()
    model.save_pretrained(tmp_path / "sr")
    return col, tmp_path / "sr"


def test_cli_index_and_search_on_qdrant(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    import sparsemm.index.qdrant as qmod

    client = connect(":memory:")
    monkeypatch.setattr(qmod, "connect", lambda *a, **k: client)
    # one in-memory client serves every CLI call here: searches must not close it
    monkeypatch.setattr(QdrantStore, "close", lambda self: None)
    col, sr = _toy_collection(tmp_path)
    # the model's own detectors: the served default then reads candidates from the store
    assert (
        main(["train", "detectors", str(sr), str(col), "--min-mentions", "2", "--no-progress"]) == 0
    )
    base = ["index", str(col), "--model", str(sr), "--backend", "qdrant", "--url", "http://x:1"]
    assert main([*base, "--no-progress", "--batch-size", "2"]) == 0
    assert "6 items in collection 'col' (6 uploaded now)" in capsys.readouterr().out
    assert main([*base, "--no-progress"]) == 0  # nothing left to resume
    assert "(0 uploaded now)" in capsys.readouterr().out
    qd = ["--backend", "qdrant", "--url", "http://x:1"]
    outs = []
    for extra in (["--engine", "index"], [*qd, "--strategy", "filter"], [], qd):
        assert main(["search", str(col), "dog but not cat", "-k", "5", "--json", *extra]) == 0
        outs.append(capsys.readouterr().out)
    # the hard filter, and the served default (match), give the same hits from Qdrant
    assert outs[0] == outs[1] and '"d1"' in outs[0] and '"dc1"' not in outs[0]
    assert outs[2] == outs[3] and '"match"' in outs[2] and '"d1"' in outs[2]
    assert main(["search", str(col), "dog", *qd, "--strategy", "penalty"]) == 2
    assert "--backend qdrant serves the default (match" in capsys.readouterr().err
