"""Index and search serve VDR models as well as SR: dispatch on the saved model_type."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from sparsemm.cli.main import main
from sparsemm.data.encode import encode_source
from sparsemm.errors import SparsemmError
from sparsemm.query.code_models import load_code_model
from sparsemm.query.indexing import build_index
from sparsemm.query.searcher import Searcher
from sparsemm_experiments.code_models import VDRCodeModel
from sparsemm_experiments.models.vdr import VDRModel

THINGS = ["dog", "cat", "pizza", "car", "boat", "horse"]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A MiniLM caption-proxy collection and an (untrained) MiniLM-initialised VDR model."""
    root = tmp_path_factory.mktemp("vdr-index")
    rng = np.random.default_rng(0)
    data = {}
    for i in range(40):
        a, b = (str(x) for x in rng.choice(THINGS, size=2, replace=False))
        data[str(100 + i)] = {
            "file_name": f"{i}.jpg",
            "split": "test" if i % 4 == 0 else "train",
            "labels": [a, b],
            "captions": [f"a {a} next to a {b}", f"a photo of a {a} and a {b}"],
        }
    (root / "coco.json").write_text(json.dumps(data))
    col = encode_source(root / "coco.json", root / "col", format="coco", progress=False)
    model = VDRModel.from_minilm(image_dim=col.dim, text_top_k=64, image_top_k=64)
    model.save_pretrained(root / "vdr")
    return root / "col", root / "vdr"


def test_vdr_index_search_and_token_explanations(proxy: tuple[Path, Path]) -> None:
    col, vdr = proxy
    index = build_index(col, vdr)
    assert index.meta["model_type"] == "vdr" and index.meta["top_k"] == 64
    s = Searcher(col)
    assert isinstance(s.model, VDRCodeModel)
    # the index holds the unit-normalised codes the model gives
    direct = s.model.encode_items(s.collection)
    assert direct.shape[1] == s.model.model.config.vocab_size
    assert np.allclose(abs(s.codes).sum(axis=1).A.ravel() > 0, True)
    hits = s.search("dog but not cat", k=5, strategy="code_arith")
    assert hits
    # a dimension's label is its own word piece
    for h in hits:
        for c in h.matched:
            assert c.words == [s.model.model.tokens[c.dim]]
    # the dense strategies still use the caption views
    assert s.search("dog but not cat", k=5, strategy="avg_emb_0.5")


def test_cli_index_vdr_and_errors(proxy: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    col, vdr = proxy
    assert main(["index", str(col), "--model", str(vdr)]) == 0
    assert main(["search", str(col), "pizza but not car", "-k", "3", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "1." in out
    # SPINE labels are for SR dims only
    assert main(["index", str(col), "--model", str(vdr), "--spine", str(tmp_path)]) == 2
    assert "VDR dimension is its own token" in capsys.readouterr().err
    with pytest.raises(SparsemmError, match="not a saved model"):
        load_code_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "lexlip"}))
    with pytest.raises(SparsemmError, match="serves clip_concepts, imagenet_concepts, sr, vdr"):
        load_code_model(tmp_path)


class _ToyCodeModel:
    def __init__(self, path: str | Path, top_k: int | None = None) -> None:
        self.path, self.top_k = Path(path), top_k


def test_a_model_type_of_another_package_comes_through_the_models_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """load_code_model reads the sparsemm.models entry points for a model type MODEL_TYPES
    does not name (as VDR's adapter comes from sparsemm_experiments); one whose module is
    missing is skipped, and an unknown type names every type it could load."""
    from importlib.metadata import EntryPoint

    from sparsemm.query import code_models

    eps = [
        EntryPoint("toy", f"{__name__}:_ToyCodeModel", code_models.MODEL_GROUP),
        EntryPoint("gone", "no_such_module_xyz:Adapter", code_models.MODEL_GROUP),
        EntryPoint("sr", f"{__name__}:_ToyCodeModel", code_models.MODEL_GROUP),
    ]
    monkeypatch.setattr(
        "importlib.metadata.entry_points", lambda group: [e for e in eps if e.group == group]
    )
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "toy"}))
    model = load_code_model(tmp_path, top_k=7)
    assert isinstance(model, _ToyCodeModel) and model.top_k == 7
    types = code_models.model_types()
    assert types["sr"] is code_models.MODEL_TYPES["sr"]  # the library's own come first
    assert "gone" not in types
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "other"}))
    with pytest.raises(SparsemmError, match=r"holds a 'other' model; the index serves .*toy"):
        load_code_model(tmp_path)
