"""SPINE word vectors, saved dense word vectors and checkpoints carry SHA-256 checksums in
their manifests, verified on open, and are checked for NaN/inf: a changed or damaged file is
refused naming it; folders written before the checksums open with a warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors, load_word_vectors, save_word_vectors


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _drop_checksums(manifest: Path) -> None:
    m = json.loads(manifest.read_text())
    m.pop("sha256")
    manifest.write_text(json.dumps(m))


def _sparse_vectors(tmp_path: Path) -> Path:
    mat = sp.random(6, 8, density=0.4, format="csr", dtype=np.float32, random_state=0)
    return SparseWordVectors(["dog", "cat", "car", "tree", "ball", "pizza"], mat).save(
        tmp_path / "spine"
    )


def test_spine_vectors_are_checksummed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = _sparse_vectors(tmp_path)
    assert set(json.loads((folder / "manifest.json").read_text())["sha256"]) == {
        "words.txt",
        "vectors.npz",
    }
    before = SparseWordVectors.load(folder)
    _flip_last_byte(folder / "vectors.npz")
    with pytest.raises(SparsemmError, match=r"vectors\.npz does not match its checksum"):
        SparseWordVectors.load(folder)
    (folder / "words.txt").write_text((folder / "words.txt").read_text().replace("dog", "dig"))
    _drop_checksums(folder / "manifest.json")  # an older folder: loads, with a warning
    _flip_last_byte(folder / "vectors.npz")  # back to the original bytes
    with caplog.at_level(logging.WARNING):
        old = SparseWordVectors.load(folder)
    assert "has no checksums" in caplog.text
    assert (old.matrix != before.matrix).nnz == 0


def test_nan_sparse_vectors_are_neither_saved_nor_loaded(tmp_path: Path) -> None:
    mat = sp.csr_matrix(np.array([[np.nan, 1.0], [0.0, 2.0]], dtype=np.float32))
    with pytest.raises(SparsemmError, match="NaN or inf"):
        SparseWordVectors(["a", "b"], mat).save(tmp_path / "bad")
    folder = _sparse_vectors(tmp_path)
    good = SparseWordVectors.load(folder)
    good.matrix.data[0] = np.inf  # a damaged file with a matching (forged) checksum
    sp.save_npz(folder / "vectors.npz", good.matrix, compressed=False)
    _drop_checksums(folder / "manifest.json")
    with pytest.raises(SparsemmError, match=r"vectors\.npz holds 1 NaN or inf"):
        SparseWordVectors.load(folder)


def test_dense_word_vectors_are_checksummed(tmp_path: Path) -> None:
    wv = WordVectors(["dog", "cat"], np.eye(2, 4, dtype=np.float32))
    folder = save_word_vectors(wv, tmp_path / "wv")
    np.testing.assert_array_equal(load_word_vectors(folder).vectors, wv.vectors)
    _flip_last_byte(folder / "vectors.npy")
    with pytest.raises(SparsemmError, match=r"vectors\.npy does not match its checksum"):
        load_word_vectors(folder, mmap=True)


@pytest.mark.parametrize("damaged", ["model.safetensors", "optim.safetensors"])
def test_a_damaged_checkpoint_is_not_resumed_from(tmp_path: Path, damaged: str) -> None:
    """Checkpoint weights carry their SHA-256 in state.json: a flipped byte in either file
    is refused by name before training continues from it; a state.json that is not a
    checkpoint state is refused too."""
    torch = pytest.importorskip("torch")
    from sparsemm.train.checkpoint import load_checkpoint, save_checkpoint

    def model_and_opt() -> tuple:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        return model, opt

    model, opt = model_and_opt()
    ck = save_checkpoint(tmp_path, model, opt, {"epoch": 2})
    assert set(json.loads((ck / "state.json").read_text())["sha256"]) == {
        "model.safetensors",
        "optim.safetensors",
    }
    assert load_checkpoint(tmp_path, *model_and_opt()) == {"epoch": 2}
    raw = bytearray((ck / damaged).read_bytes())
    raw[-3] ^= 0xFF  # a value byte: the file still parses
    (ck / damaged).write_bytes(bytes(raw))
    with pytest.raises(SparsemmError, match=f"{damaged} does not match its checksum"):
        load_checkpoint(tmp_path, *model_and_opt())
    (ck / "state.json").write_text("[1, 2]")
    with pytest.raises(SparsemmError, match="not a checkpoint state"):
        load_checkpoint(tmp_path, *model_and_opt())


def _detectors(tmp_path: Path) -> Path:
    from sparsemm.models.detectors import ConceptDetectors

    rng = np.random.default_rng(0)
    det = ConceptDetectors(
        ["dress", "shirt", "dog"],
        rng.normal(size=(5, 3)).astype(np.float32),
        np.zeros(3, np.float32),
        np.full(3, 0.1, np.float32),
    )
    det.save(tmp_path / "model")
    return tmp_path / "model"


def test_detector_terms_are_covered_by_a_checksum(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Swapping two detector names once made "dress but not t-shirt" return only shirts."""
    from sparsemm.models.detectors import META_FILE, ConceptDetectors

    folder = _detectors(tmp_path)
    assert ConceptDetectors.load(folder).terms == ["dress", "shirt", "dog"]
    meta_path = folder / META_FILE
    good = meta_path.read_text()
    meta = json.loads(good)
    meta["terms"][0], meta["terms"][1] = meta["terms"][1], meta["terms"][0]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SparsemmError, match="does not match its own checksum"):
        ConceptDetectors.load(folder)
    meta = json.loads(good)
    meta["counts"][2] += 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SparsemmError, match="does not match its own checksum"):
        ConceptDetectors.load(folder)
    # terms that are not words are refused even without a checksum
    meta = json.loads(good)
    meta.pop("meta_sha256")
    meta["terms"][2] = 7
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SparsemmError, match="must be a list of words"):
        ConceptDetectors.load(folder)
    # a file written before the checksum opens, and says it is not verified
    meta = json.loads(good)
    meta.pop("meta_sha256")
    meta_path.write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING):
        assert ConceptDetectors.load(folder).terms == ["dress", "shirt", "dog"]
    assert "not verified" in caplog.text
