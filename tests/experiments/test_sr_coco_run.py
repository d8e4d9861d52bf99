"""The COCO caption-proxy run end to end on a synthetic COCO-format file (no shared data)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fakes import KeywordEncoder, write_fake_coco
from sparsemm.errors import SparsemmError
from sparsemm.models.base import check_encoders
from sparsemm.models.sr import SRModel
from sparsemm.words.vectors import WordVectors
from sparsemm_experiments.sr_coco import ProxyRunConfig, render_report, run_sr_coco

OBJECTS = ["dog", "cat", "pizza", "car", "tree", "ball", "bench", "kite"]


def _captions(objs: list[str]) -> list[str]:
    a, b = objs
    return [f"a {a} near a {b}", f"the {b} and {a}", f"one {a} with {b}"]


def _fake_coco(root: Path) -> None:
    write_fake_coco(root, OBJECTS, _captions, n=80, first_id=1000)


def _toy_glove() -> WordVectors:
    rng = np.random.default_rng(1)
    words = [*OBJECTS, "near", "one", "park", "street", "grass", "table"]
    return WordVectors(words, rng.normal(size=(len(words), 8)).astype(np.float32))


def test_proxy_run_end_to_end(tmp_path: Path) -> None:
    _fake_coco(tmp_path / "data")
    cfg = ProxyRunConfig(
        spine_top_words=6, spine_epochs=3, sr_epochs=3, latent_dim=24, top_k=4, val_fraction=0.2
    )
    enc = KeywordEncoder(keywords=OBJECTS)
    m = run_sr_coco(
        tmp_path / "data", tmp_path / "run", cfg, progress=False, encoder=enc, glove=_toy_glove()
    )
    test = m["test"]
    assert test["n_images"] == 20 and test["n_queries"] == 60
    assert m["chosen_inference_mask"] in test
    for name, res in test.items():
        if isinstance(res, dict) and name != "dense":
            assert 0.0 <= res["R@1"] <= res["R@5"] <= res["R@10"] <= 1.0
            assert res["nnz_image"] <= 24
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["test"] == test
    assert (tmp_path / "run" / "report.md").read_text() == render_report(m)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["encoder"]["dim"] == 8
    # The model carries the encoders it was trained on, so `sparsemm index` can refuse it on
    # a collection from other encoders.
    sr_config = tmp_path / "run" / "sr" / "config.json"
    record = {
        "image_encoder": {"name": "kwfake", "dim": 8, "model": "keywords-v1"},
        "text_encoder": {"name": "kwfake", "dim": 8, "model": "keywords-v1"},
        "collection": str((tmp_path / "run" / "collection").resolve()),
    }
    assert json.loads(sr_config.read_text())["training"] == record
    model = SRModel.from_pretrained(tmp_path / "run" / "sr")
    assert model.training_info == record
    manifest = json.loads((tmp_path / "run" / "collection" / "manifest.json").read_text())
    check_encoders(model.training_info, manifest, "sr", "collection")
    other = {**manifest, "encoder": {"name": "minilm", "dim": 384}, "text_encoder": None}
    with pytest.raises(SparsemmError, match="other encoders"):
        check_encoders(model.training_info, other, "sr", "collection")
    # A model saved by a run from before the record existed: it still loads, and the next
    # run adds the record without training again.
    old = json.loads(sr_config.read_text())
    del old["training"]
    sr_config.write_text(json.dumps(old))
    assert SRModel.from_pretrained(tmp_path / "run" / "sr").training_info is None
    # Every stage is cached: a second run re-encodes nothing and trains no further epoch.
    calls = KeywordEncoder.calls
    state = tmp_path / "run" / "sr" / "checkpoint" / "state.json"
    spine_state = tmp_path / "run" / "spine" / "checkpoint" / "state.json"
    stamps = (state.stat().st_mtime_ns, spine_state.stat().st_mtime_ns)
    again = run_sr_coco(
        tmp_path / "data", tmp_path / "run", cfg, progress=False, encoder=enc, glove=_toy_glove()
    )
    assert again["test"] == test
    assert KeywordEncoder.calls == calls
    assert (state.stat().st_mtime_ns, spine_state.stat().st_mtime_ns) == stamps
    assert json.loads(sr_config.read_text())["training"] == record
