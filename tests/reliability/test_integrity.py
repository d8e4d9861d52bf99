"""Damaged index segments and model weights are refused by name, never read as data.

Index segment files and model weights carry a SHA-256 written when they are saved and
checked when they are opened; values are checked for NaN/inf even when the checksum is
missing (old artefacts) or forged, so a damaged value never turns into a wrong answer
with exit 0.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reltools import index_version
from safetensors.torch import load_file, save_file
from webtoy import make_collection, make_sr

from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.models.sr import SRConfig, SRModel
from sparsemm.query.indexing import build_index


def _segment(root: Path) -> Path:
    (seg,) = [p for p in root.iterdir() if p.name.startswith("seg-")]
    return seg


def _poke(path: Path, every: int, value: float) -> None:
    """Set every ``every``-th value of a .npy file to ``value``, in place."""
    arr = np.load(path, mmap_mode="r+")
    arr[::every] = value
    arr.flush()
    del arr


def _forge_segment_checksums(root: Path) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    for seg in manifest["segments"]:
        for fname in seg["sha256"]:
            data = (root / seg["name"] / fname).read_bytes()
            seg["sha256"][fname] = hashlib.sha256(data).hexdigest()
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture()
def index_root(tmp_path: Path) -> Path:
    codes, ids = index_version(1, 3000)
    InvertedIndex.build(tmp_path / "idx", codes, ids)
    return tmp_path / "idx"


def test_index_segments_carry_checksums_and_a_changed_value_is_refused(index_root: Path) -> None:
    manifest = json.loads((index_root / "manifest.json").read_text())
    (seg,) = manifest["segments"]
    assert sorted(seg["sha256"]) == sorted(
        [f"{a}.npy" for a in ("post_blocks", "post_rows", "post_imps", "list_stats")]
        + [f"{a}.npy" for a in ("row_indptr", "row_dims", "row_vals")]
        + ["ids.json"]
    )
    # the probe: every 997th value set to a huge but finite 1e38
    _poke(_segment(index_root) / "row_vals.npy", 997, 1e38)
    with pytest.raises(SparsemmError, match=r"row_vals\.npy does not match its checksum"):
        InvertedIndex.open(index_root)


def test_index_changed_impact_is_refused(index_root: Path) -> None:
    _poke(_segment(index_root) / "post_imps.npy", 997, 255)
    with pytest.raises(SparsemmError, match=r"post_imps\.npy does not match its checksum"):
        InvertedIndex.open(index_root)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_index_nan_values_are_refused_even_with_a_forged_checksum(
    index_root: Path, value: float
) -> None:
    _poke(_segment(index_root) / "row_vals.npy", 997, value)
    _forge_segment_checksums(index_root)
    with pytest.raises(SparsemmError, match=r"row_vals\.npy holds NaN or inf values"):
        InvertedIndex.open(index_root)


@pytest.mark.parametrize("value", [np.nan, np.inf, -1.0])
def test_index_bad_list_stats_are_refused_even_with_a_forged_checksum(
    index_root: Path, value: float
) -> None:
    _poke(_segment(index_root) / "list_stats.npy", 7, value)
    _forge_segment_checksums(index_root)
    with pytest.raises(SparsemmError, match=r"does not match the manifest"):
        InvertedIndex.open(index_root)


def test_index_without_checksums_opens_with_a_warning(
    index_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = json.loads((index_root / "manifest.json").read_text())
    for seg in manifest["segments"]:
        del seg["sha256"]  # as an older sparsemm wrote it
    (index_root / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING):
        index = InvertedIndex.open(index_root)
    assert len(index) == 3000
    assert "has no checksums" in caplog.text and "sparsemm index" in caplog.text
    _poke(_segment(index_root) / "row_vals.npy", 5, np.nan)  # still checked for NaN
    with pytest.raises(SparsemmError, match=r"row_vals\.npy holds NaN"):
        InvertedIndex.open(index_root)


def test_index_adds_and_merges_record_checksums(index_root: Path) -> None:
    index = InvertedIndex.open(index_root)
    codes, ids = index_version(2, 3000)
    index.add(codes, ids)  # merged with the first segment
    manifest = json.loads((index_root / "manifest.json").read_text())
    assert all(len(seg["sha256"]) == 8 for seg in manifest["segments"])
    assert len(InvertedIndex.open(index_root)) == 6000


def _toy(tmp_path: Path) -> tuple[Path, Path]:
    col = make_collection(tmp_path)
    model = make_sr(tmp_path)
    build_index(col, model)
    return col, model


def test_cli_search_on_a_damaged_index_is_one_error_line(tmp_path: Path, cli: Any) -> None:
    col, _ = _toy(tmp_path)
    assert cli("search", str(col), "dog", "--engine", "index").code == 0
    _poke(_segment(col / "index") / "row_vals.npy", 3, 1e38)
    cli("search", str(col), "dog", "--engine", "index").one_line_error(
        "row_vals.npy does not match its checksum", "rebuild the index"
    )


def _nan_rows(model_dir: Path, rows: int) -> None:
    path = model_dir / "model.safetensors"
    state = load_file(str(path))
    state["enc_text.weight"][:rows] = float("nan")
    save_file(state, str(path), metadata={"model_type": "sr"})


def test_model_weights_are_checksummed_and_checked_for_nan(tmp_path: Path) -> None:
    model = SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=60, top_k=4))
    model.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    data = (tmp_path / "m" / "model.safetensors").read_bytes()
    assert config["weights_sha256"] == hashlib.sha256(data).hexdigest()
    _nan_rows(tmp_path / "m", 50)  # the probe: 50 NaN rows of enc_text.weight
    with pytest.raises(SparsemmError, match=r"model\.safetensors is corrupt or does not match"):
        SRModel.from_pretrained(tmp_path / "m")
    # a forged checksum, or none at all (an older sparsemm): the values are still checked
    config["weights_sha256"] = hashlib.sha256(
        (tmp_path / "m" / "model.safetensors").read_bytes()
    ).hexdigest()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SparsemmError, match=r"NaN or inf weights \(enc_text.weight \(400 of"):
        SRModel.from_pretrained(tmp_path / "m")
    del config["weights_sha256"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SparsemmError, match="NaN or inf weights"):
        SRModel.from_pretrained(tmp_path / "m")


def test_old_model_without_a_checksum_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=60, top_k=4))
    model.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    del config["weights_sha256"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        SRModel.from_pretrained(tmp_path / "m")
    assert "no weights checksum" in caplog.text


def test_non_finite_weights_are_not_saved(tmp_path: Path) -> None:
    import torch

    model = SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=60, top_k=4))
    with torch.no_grad():
        model.enc_text.weight[3, 2] = float("nan")
    with pytest.raises(SparsemmError, match="weights hold NaN or inf values"):
        model.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_cli_search_with_a_damaged_model_is_one_error_line(tmp_path: Path, cli: Any) -> None:
    col, model = _toy(tmp_path)
    _nan_rows(model, 3)
    cli("search", str(col), "dog").one_line_error(
        "model.safetensors is corrupt or does not match config.json"
    )
    cli("index", str(col), "--model", str(model)).one_line_error("model.safetensors")


def test_lexlip_weights_are_checksummed_too(tmp_path: Path) -> None:
    from fakes import tiny_lexlip_config
    from sparsemm_experiments.models.lexlip import LexLIPModel

    vocab = np.arange(5, 25)
    model = LexLIPModel(
        tiny_lexlip_config(max_text_len=12, image_dim=8, queue_size=8, lexicon_size=len(vocab)),
        vocab,
    )
    model.save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["weights_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    state = load_file(str(path))
    name = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(path), metadata={"model_type": "lexlip"})
    with pytest.raises(SparsemmError, match=r"corrupt or does not match config\.json"):
        LexLIPModel.from_pretrained(tmp_path / "m")
    del config["weights_sha256"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SparsemmError, match=f"NaN or inf weights \\({name} \\(1 of"):
        LexLIPModel.from_pretrained(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text("[]")
    with pytest.raises(SparsemmError, match="a JSON object was expected, got list"):
        LexLIPModel.from_pretrained(tmp_path / "m")


def test_index_row_pointers_damaged_with_a_forged_checksum_are_refused(index_root: Path) -> None:
    """The row store's pointers are checked before a delta-coded row store is walked (a
    review found a segfault there)."""
    seg = _segment(index_root)
    assert np.load(seg / "row_dims.npy").dtype == np.uint8
    arr = np.load(seg / "row_indptr.npy", mmap_mode="r+")
    arr[1] = 1 << 40
    arr.flush()
    del arr
    _forge_segment_checksums(index_root)
    with pytest.raises(SparsemmError, match="does not match the manifest"):
        InvertedIndex.open(index_root)


def test_index_damaged_npy_header_is_one_error(index_root: Path) -> None:
    path = _segment(index_root) / "row_vals.npy"
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"'shape'") + 9] = ord("[")  # an unbalanced bracket in the header dict
    path.write_bytes(bytes(raw))
    _forge_segment_checksums(index_root)
    with pytest.raises(SparsemmError, match=r"row_vals\.npy is not a plain \.npy array"):
        InvertedIndex.open(index_root)
