"""Captions for a photo folder: rows match images by path, id, file name or stem."""

from __future__ import annotations

import json
from pathlib import Path

from sparsemm.data.sync import attach_captions


def test_caption_rows_match_images_and_unmatched_rows_are_reported(tmp_path: Path, caplog) -> None:
    (tmp_path / "photos" / "trip").mkdir(parents=True)
    items = [
        {"id": "a.jpg", "image": str(tmp_path / "photos" / "a.jpg")},
        {"id": "trip/b.jpg", "image": str(tmp_path / "photos" / "trip" / "b.jpg")},
        {"id": "c.png", "image": str(tmp_path / "photos" / "c.png")},
    ]
    rows = [
        {"id": "a.jpg", "caption": "by id"},
        {"id": "b.jpg", "caption": "by file name"},
        {"id": "c", "caption": "by stem", "labels": ["x"]},
        {"id": "whatever", "image": "photos/a.jpg", "caption": "by image path"},
        {"image": "photos/a.jpg", "caption": "by image path alone"},
        {"id": "gone.jpg", "caption": "no such photo"},
    ]
    path = tmp_path / "caps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert attach_captions(items, path, tmp_path / "photos") == 5
    assert items[0]["captions"] == ["by id", "by image path", "by image path alone"]
    assert items[1]["captions"] == ["by file name"]
    assert items[2]["captions"] == ["by stem"] and items[2]["labels"] == ["x"]
    assert "1 caption row(s)" in caplog.text and "gone.jpg" in caplog.text


def test_write_collection_carries_only_the_named_subfolders(tmp_path: Path) -> None:
    import numpy as np

    from sparsemm.data.collection import write_collection

    col = tmp_path / "col"
    enc = {"name": "fake", "dim": 2}
    items = [{"id": "a"}]
    write_collection(col, items, enc, image_emb=np.ones((1, 2), np.float32))
    for sub in ("index", "cache"):
        (col / sub).mkdir()
        (col / sub / "f.txt").write_text(sub)
    more = [{"id": "a"}, {"id": "b"}]
    write_collection(col, more, enc, image_emb=np.ones((2, 2), np.float32), keep=("index",))
    assert (col / "index" / "f.txt").read_text() == "index"
    assert not (col / "cache").exists()
    write_collection(col, items, enc, image_emb=np.ones((1, 2), np.float32))
    assert not (col / "index").exists()  # the default keeps nothing, as before
