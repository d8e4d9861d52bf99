"""Concept detectors saved with a model: vocabulary, fit, save/load, integrity, and search
with them (query time fits nothing; a collection without captions ranks the same)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.cli.main import main
from sparsemm.data.collection import open_collection, write_collection
from sparsemm.errors import SparsemmError
from sparsemm.models.detectors import (
    META_FILE,
    WEIGHTS_FILE,
    ConceptDetectors,
    DetectorConfig,
    has_detectors,
)
from sparsemm.query.indexing import build_index
from sparsemm.query.searcher import Searcher
from sparsemm.train.detectors import detector_vocabulary, fit_concept_detectors

RNG = np.random.default_rng(0)
OBJECTS = ["dog", "cat", "hot dog", "tree"]


def _toy(n: int = 120) -> tuple[sp.csr_matrix, list[list[str]], list[list[str]]]:
    """Codes with one dim per object (plus noise dims); captions mention most objects."""
    labels, captions, rows = [], [], []
    for _ in range(n):
        objs = [o for o in OBJECTS if RNG.random() < 0.4] or ["tree"]
        said = [o for o in objs if RNG.random() < 0.8]
        labels.append(objs)
        captions.append([f"a photo with {' and '.join(said)}"] if said else ["a photo"])
        row = np.abs(RNG.normal(0, 0.05, 8))
        for o in objs:
            row[OBJECTS.index(o)] += 1.0
        rows.append(row)
    return sp.csr_matrix(np.array(rows, np.float32)), captions, labels


def test_vocabulary_words_bigrams_and_labels() -> None:
    caps = [["a hot dog on a plate"], ["hot dog stand"], ["a dog"], ["dogs running"]]
    vocab = dict(detector_vocabulary(caps, [["dog"], [], [], ["dining table"]],
                                     DetectorConfig(min_mentions=2)))  # fmt: skip
    assert vocab["hot dog"] == 2 and vocab["dog"] == 4 and vocab["hot"] == 2
    assert "dining table" not in vocab  # one item only
    no_pairs = dict(detector_vocabulary(caps, None, DetectorConfig(min_mentions=2, bigrams=False)))
    assert "hot dog" not in no_pairs


def test_fit_separates_objects_and_round_trips(tmp_path: Path) -> None:
    codes, captions, labels = _toy()
    det = fit_concept_detectors(codes, captions, labels, DetectorConfig(min_mentions=5))
    assert "dog" in det and "dogs" in det and "hot dog" in det  # plural matched by tokens
    assert det.lookup("giraffe") is None
    unit = codes.multiply(1 / np.sqrt(codes.multiply(codes).sum(axis=1))).tocsr()
    has_dog = np.array(["dog" in x for x in labels])
    z = det.logits(unit, "dog")
    assert z[has_dog].mean() > z[~has_dog].mean() + 2
    assert 0 < det.column("dog")[2] <= 1  # Elkan-Noto rate
    det.save(tmp_path)
    assert has_detectors(tmp_path)
    back = ConceptDetectors.load(tmp_path)
    assert back.terms == det.terms and back.counts == det.counts
    for a, b in ((back.weights, det.weights), (back.bias, det.bias), (back.rate, det.rate)):
        assert a.dtype == b.dtype and np.array_equal(a, b)  # bit-identical
    assert np.array_equal(back.logits(unit, "dog"), z)


def test_damaged_detectors_are_refused_by_name(tmp_path: Path) -> None:
    codes, captions, labels = _toy(60)
    fit_concept_detectors(codes, captions, labels, DetectorConfig(min_mentions=5)).save(tmp_path)
    data = bytearray((tmp_path / WEIGHTS_FILE).read_bytes())
    data[-5] ^= 0xFF
    (tmp_path / WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(SparsemmError, match=r"detectors.safetensors does not match its checksum"):
        ConceptDetectors.load(tmp_path)
    (tmp_path / META_FILE).write_text("[1, 2]")
    with pytest.raises(SparsemmError, match="not a sparsemm detectors file"):
        ConceptDetectors.load(tmp_path)
    with pytest.raises(SparsemmError, match="NaN or inf"):
        ConceptDetectors(["dog"], np.full((3, 1), np.nan), np.zeros(1), np.ones(1))
    with pytest.raises(SparsemmError, match="no concept detectors"):
        ConceptDetectors.load(tmp_path / "nothing")


def _collection(path: Path, captions: bool) -> Path:
    """The toy items as a collection whose image embedding is the code itself."""
    codes, caps, labels = _toy(80)
    dense = codes.toarray()
    items, texts = [], []
    for i in range(len(caps)):
        item = {"id": str(i), "split": "train" if i < 60 else "test"}
        if captions:
            item |= {"captions": caps[i], "labels": labels[i]}
            texts.append({"item": i, "text": caps[i][0]})
        items.append(item)
    write_collection(
        path,
        items,
        {"name": "precomputed", "dim": 8},
        image_emb=dense,
        text_emb=dense[[t["item"] for t in texts]] if texts else np.zeros((0, 8), np.float32),
        texts=texts,
    )
    return path


def test_train_detectors_cli_and_captionless_search(tmp_path: Path, capsys) -> None:
    """`train detectors` saves them in the model; a collection without captions then ranks
    exactly like the captioned one with the same model (query time fits nothing)."""
    import torch

    from sparsemm.models.sr import SRConfig, SRModel

    global RNG
    RNG = np.random.default_rng(1)
    with_caps = _collection(tmp_path / "with", captions=True)
    RNG = np.random.default_rng(1)
    without = _collection(tmp_path / "without", captions=False)
    model = SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=8, top_k=8))
    with torch.no_grad():
        model.enc_text.weight.copy_(torch.eye(8))
        model.enc_text.bias.zero_()
    model.save_pretrained(tmp_path / "sr")
    argv = ["train", "detectors", str(tmp_path / "sr"), str(with_caps), "--min-mentions", "5"]
    assert main([*argv, "--no-progress"]) == 0
    assert "concept detectors" in capsys.readouterr().out
    meta = json.loads((tmp_path / "sr" / META_FILE).read_text())
    assert "dog" in meta["terms"] and meta["config"]["min_mentions"] == 5

    class Enc:  # query texts -> the object's code dim (a keyword encoder)
        dim = 8

        def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
            out = np.zeros((len(texts), 8), np.float32)
            for i, t in enumerate(texts):
                for j, o in enumerate(OBJECTS):
                    if o in t:
                        out[i, j] = 1.0
            return out

    rankings = []
    for col in (with_caps, without):
        build_index(col, tmp_path / "sr")
        s = Searcher(col, encoder=Enc())
        assert s.context.detectors is not None
        hits = s.search("dog but not cat", k=10)
        rankings.append([h.id for h in hits])
        dog, cat = hits[0].evidence
        assert (dog.term, dog.side, dog.kind) == ("dog", "include", "detector")
        assert (cat.term, cat.side, cat.kind) == ("cat", "exclude", "detector")
        assert dog.value > 0.5 > cat.value and dog.text == f"dog {int(100 * dog.value)}%"
        # the chance of a cat, which was left out (not "not cat 0.02")
        assert cat.text.startswith("cat ") and cat.text.endswith("% (left out)")
        assert OBJECTS.index("dog") in dog.dims
        # the dims checked for an excluded term are those its detector weighs most
        assert OBJECTS.index("cat") in hits[0].excluded[0].dims
        assert hits[0].scored_by == {"dog": "detector", "cat": "detector"}
        odd = s.search("zzz dog but not cat", k=3)  # no detector: code similarity, said so
        assert odd[0].scored_by == {"zzz dog": "code similarity", "cat": "detector"}
        labels = {it["id"]: it.get("labels", []) for it in open_collection(with_caps).items}
        assert all("dog" in labels[i] for i in rankings[-1][:5])
    assert rankings[0] == rankings[1]


def test_detectors_of_other_weights_are_refused(tmp_path: Path) -> None:
    """A model retrained after its detectors were fitted: refused by name, not used."""
    import torch

    from sparsemm.models.sr import SRConfig, SRModel
    from sparsemm.train.detectors import fit_model_detectors

    global RNG
    RNG = np.random.default_rng(2)
    col = open_collection(_collection(tmp_path / "col", captions=True))
    model = SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=8, top_k=8))
    model.save_pretrained(tmp_path / "sr")
    det = fit_model_detectors(model, tmp_path / "sr", col, "train", DetectorConfig(min_mentions=5))
    assert ConceptDetectors.for_model(tmp_path / "sr").model_sha256 == det.model_sha256
    with torch.no_grad():
        model.enc_text.weight.mul_(2.0)
    model.save_pretrained(tmp_path / "sr")  # retrained: new weights, old detectors
    with pytest.raises(SparsemmError, match=r"fitted on other weights .* train detectors"):
        ConceptDetectors.for_model(tmp_path / "sr")
