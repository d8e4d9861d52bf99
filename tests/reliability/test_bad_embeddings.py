"""NaN/inf and wrong-dimension embeddings, and models used with a collection from another
encoder: refused with a message that says what to do (CLI: one line, exit 2)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reltools import captioned_collection, collection_version
from webtoy import WebKeywordEncoder

from sparsemm.data.collection import open_collection, write_collection
from sparsemm.data.encode import encode_items
from sparsemm.encoders.base import register_encoder
from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRConfig, SRModel


def with_emb(emb: Any) -> dict[str, Any]:
    kw = collection_version(1, 4)
    kw["image_emb"] = emb
    return kw


@pytest.mark.parametrize(
    ("emb", "message"),
    [
        (np.where(np.eye(4, 16) > 0, np.nan, 0.0), r"4 row\(s\) contain NaN or inf"),
        (np.full((4, 16), np.inf), "NaN or inf; re-encode those items"),
        (np.zeros((4, 15)), "expected dimension 16, got 15"),
        (np.zeros(64), r"expected a 2-D \(n, d\) array"),
        (np.zeros((3, 16)), "3 image embeddings for 4 items"),
    ],
)
def test_collections_refuse_bad_embeddings(tmp_path: Path, emb: Any, message: str) -> None:
    with pytest.raises(SparsemmError, match=message):
        write_collection(tmp_path / "col", **with_emb(emb))
    assert list(tmp_path.iterdir()) == []


def test_encoders_returning_bad_arrays_are_caught(tmp_path: Path) -> None:
    class Broken:
        name, dim, modalities, model_id = "broken", 4, ("text", "image"), "b"

        def __init__(self, out: np.ndarray) -> None:
            self.out = out

        def encode_text(self, texts: Sequence[str], **kw: Any) -> np.ndarray:
            return self.out[: len(texts)]

        def encode_image(self, images: Sequence[Any], **kw: Any) -> np.ndarray:
            return self.out[: len(images)]

    items = [{"id": "a", "captions": ["x"]}, {"id": "b", "captions": ["y"]}]
    with pytest.raises(SparsemmError, match="broken text embeddings: 1 row"):
        encode_items(items, Broken(np.array([[1, 0, 0, 0], [np.nan] * 4])), tmp_path / "c")
    with pytest.raises(SparsemmError, match="expected dimension 4, got 3"):
        encode_items(items, Broken(np.ones((2, 3))), tmp_path / "c")
    pics = [{"id": "a", "image": "a.png"}, {"id": "b", "image": "b.png"}]
    with pytest.raises(SparsemmError, match=r"returned shape \(2, 3\) for 2 images"):
        encode_items(pics, Broken(np.ones((2, 3))), tmp_path / "c", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_cli_precomputed_table_with_nan(tmp_path: Path, cli: Any) -> None:
    table = np.ones((3, 8), np.float32)
    table[1, 2] = np.nan
    np.save(tmp_path / "t.npy", table)
    (tmp_path / "t.ids.txt").write_text("a\nb\nc\n")
    (tmp_path / "s.jsonl").write_text("".join(f'{{"id": "{i}", "caption": "x"}}\n' for i in "abc"))
    res = cli(
        "encode", str(tmp_path / "s.jsonl"), "-o", str(tmp_path / "col"),
        "--encoder", "precomputed", "--model", str(tmp_path / "t.npy"),
    )  # fmt: skip
    res.one_line_error("t.npy: 1 row(s) contain NaN or inf; re-encode those items")
    assert not (tmp_path / "col").exists()


# --------------------------------------------------------------- models vs collections


def test_model_for_another_dimension_via_the_cli(tmp_path: Path, cli: Any) -> None:
    write_collection(tmp_path / "col", **collection_version(1, 30))  # 16-d
    SRModel(SRConfig(text_dim=6, image_dim=6, latent_dim=12, top_k=3)).save_pretrained(
        tmp_path / "sr"
    )
    res = cli("index", str(tmp_path / "col"), "--model", str(tmp_path / "sr"))
    res.one_line_error(
        "SR model expects image embeddings of dimension 6, got shape (30, 16)",
        "was the collection encoded with another encoder?",
    )
    assert not (tmp_path / "col" / "index").exists()


def test_model_trained_on_another_encoder_is_refused(tmp_path: Path, cli: Any) -> None:
    captioned_collection(tmp_path / "a", "encoder-a", 0)
    captioned_collection(tmp_path / "b", "encoder-b", 1)
    res = cli(
        "train", "sr", str(tmp_path / "a"), "-o", str(tmp_path / "sr"), "--no-bias",
        "--latent-dim", "16", "--top-k", "4", "--epochs", "1", "--batch-size", "8",
        "--no-progress", verbs=("train",),
    )  # fmt: skip
    assert res.code == 0, res.err
    res = cli("index", str(tmp_path / "b"), "--model", str(tmp_path / "sr"))
    res.one_line_error("encoder-a", "encoder-b")


class NanWords(WebKeywordEncoder):
    """webtoy's keyword encoder, but the word 'nan' embeds as NaN (a numerics failure)."""

    name = "relnan"

    def encode_text(self, texts: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        out = super().encode_text(texts, *args, **kwargs)
        out[["nan" in t.split() for t in texts]] = np.nan
        return out


register_encoder("relnan")(NanWords)


def test_nan_query_embedding_via_the_cli(tmp_path: Path, toy_collection: Path, cli: Any) -> None:
    col = tmp_path / "col"
    shutil.copytree(toy_collection, col)
    manifest = json.loads((col / "manifest.json").read_text())
    manifest["encoder"]["name"] = "relnan"
    (col / "manifest.json").write_text(json.dumps(manifest))
    assert open_collection(col).encoder_name == "relnan"
    assert cli("search", str(col), "dog").code == 0
    cli("search", str(col), "dog but not nan").one_line_error("NaN or inf")
