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
        {"id": "gone.jpg", "caption": "no such photo"},
    ]
    path = tmp_path / "caps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert attach_captions(items, path, tmp_path / "photos") == 4
    assert items[0]["captions"] == ["by id", "by image path"]
    assert items[1]["captions"] == ["by file name"]
    assert items[2]["captions"] == ["by stem"] and items[2]["labels"] == ["x"]
    assert "1 caption row(s)" in caplog.text and "gone.jpg" in caplog.text
