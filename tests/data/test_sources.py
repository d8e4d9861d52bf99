"""Source readers: COCO json, captions JSONL/CSV, image folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparsemm.data.sources import (
    guess_format,
    read_captions_csv,
    read_captions_jsonl,
    read_coco,
    read_image_folder,
    read_items,
)
from sparsemm.errors import SparsemmError

COCO = {
    "397133": {
        "file_name": "000000397133.jpg",
        "split": "train",
        "labels": ["person", "oven"],
        "captions": ["A man in a kitchen.", "A baker at work."],
    },
    "37777": {
        "file_name": "000000037777.jpg",
        "split": "test",
        "labels": ["banana"],
        "captions": ["Fruit on a table."],
    },
    "252219": {
        "file_name": "000000252219.jpg",
        "split": "train",
        "labels": [],
        "captions": ["A street.", "Cars drive by.", "A city road."],
    },
}


def test_read_coco(tmp_path: Path) -> None:
    path = tmp_path / "coco.json"
    path.write_text(json.dumps(COCO))
    items = read_coco(path)
    assert [it["id"] for it in items] == ["397133", "37777", "252219"]
    assert items[0]["captions"] == ["A man in a kitchen.", "A baker at work."]
    assert items[0]["labels"] == ["person", "oven"] and items[0]["split"] == "train"
    assert "image" not in items[0]
    assert [it["id"] for it in read_coco(path, split="train")] == ["397133", "252219"]
    assert [it["id"] for it in read_coco(path, split="train", limit=1)] == ["397133"]
    with_root = read_coco(path, image_root=tmp_path / "imgs", limit=1)
    assert with_root[0]["image"] == str(tmp_path / "imgs" / "000000397133.jpg")
    with pytest.raises(SparsemmError, match=r"no items in split 'val'.*test, train"):
        read_coco(path, split="val")
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(SparsemmError, match="expected a JSON object"):
        read_coco(path)
    path.write_text(json.dumps({"1": {"captions": "x", "labels": [{"a": 1}]}}))
    with pytest.raises(SparsemmError, match="image 1: 'labels'"):
        read_coco(path)


def test_read_jsonl_merges_rows(tmp_path: Path) -> None:
    path = tmp_path / "caps.jsonl"
    rows = [
        {"id": "x1", "caption": "a cat", "image": "img/x1.jpg", "labels": ["cat"], "split": "tr"},
        {"id": "x1", "caption": "a small cat"},
        {"id": 7, "captions": ["a dog", "two dogs"], "split": "test"},
        {"id": "x3", "text": "a car"},
        {"id": "x4", "image": "/abs/x4.png"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = read_captions_jsonl(path)
    assert [it["id"] for it in items] == ["x1", "7", "x3", "x4"]
    assert items[0]["captions"] == ["a cat", "a small cat"]
    assert items[0]["image"] == str((tmp_path / "img" / "x1.jpg").resolve())
    assert items[0]["labels"] == ["cat"] and items[0]["split"] == "tr"
    assert items[1]["captions"] == ["a dog", "two dogs"] and items[1]["split"] == "test"
    assert items[2]["captions"] == ["a car"]
    assert items[3] == {"id": "x4", "image": "/abs/x4.png"}
    assert [it["id"] for it in read_items(path, split="test")] == ["7"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "caption": "x"}', "{not json"], r"caps\.jsonl:2: not valid JSON"),
        (['{"caption": "x"}'], r"caps\.jsonl:1: missing 'id' \(or an 'image' path"),
        (['{"id": "a"}'], r"caps\.jsonl:1: .*neither a caption"),
        (['{"id": "a", "caption": 3}'], r"caps\.jsonl:1: 'caption' must be a string"),
        (["[1, 2]"], r"caps\.jsonl:1: expected a JSON object"),
        (
            ['{"id": "a", "caption": "x", "split": "train"}', "", '{"id": "a", "split": "test"}'],
            r"caps\.jsonl:3: item 'a' has split 'test'",
        ),
    ],
)
def test_read_jsonl_errors(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "caps.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SparsemmError, match=message):
        read_captions_jsonl(path)


def test_read_csv(tmp_path: Path) -> None:
    path = tmp_path / "caps.csv"
    path.write_text(
        "id,caption,labels,split,image\n"
        'a,"a cat, sleeping",cat|animal,train,a.png\n'
        'a,a dozing cat,"cat|animal",train,\n'
        'b,a red car,"[""car"", ""red thing""]",test,\n'
        ",,,,\n"
    )
    items = read_captions_csv(path)
    assert [it["id"] for it in items] == ["a", "b"]
    assert items[0]["captions"] == ["a cat, sleeping", "a dozing cat"]
    assert items[0]["labels"] == ["cat", "animal"]
    assert items[0]["image"] == str((tmp_path / "a.png").resolve())
    assert items[1]["labels"] == ["car", "red thing"] and items[1]["split"] == "test"
    assert "image" not in items[1]

    multi = tmp_path / "multi.csv"
    multi.write_text('id,captions\n1,"[""one"", ""two""]"\n2,three|four\n')
    assert [it["captions"] for it in read_captions_csv(multi)] == [
        ["one", "two"],
        ["three", "four"],
    ]


def test_read_csv_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("name,caption\nx,y\n")
    with pytest.raises(SparsemmError, match=r"bad\.csv:1: the header needs an 'id'"):
        read_captions_csv(path)
    path.write_text("image,caption\nphotos/a.jpg,by path alone\n")  # the path names it
    assert read_captions_csv(path)[0]["id"] == "photos/a.jpg"
    path.write_text("id,caption\na,ok\nb,too,many\n")
    with pytest.raises(SparsemmError, match=r"bad\.csv:3: more cells"):
        read_captions_csv(path)
    path.write_text('id,caption,labels\na,ok,"[broken"\n')
    with pytest.raises(SparsemmError, match=r"bad\.csv:2: 'labels' is not a valid JSON list"):
        read_captions_csv(path)
    path.write_text("id,caption\n,orphan caption\n")
    with pytest.raises(SparsemmError, match=r"bad\.csv:2: missing 'id'"):
        read_captions_csv(path)
    with pytest.raises(SparsemmError, match="file not found"):
        read_captions_csv(tmp_path / "nope.csv")


def test_read_image_folder(tmp_path: Path) -> None:
    root = tmp_path / "photos"
    for rel in ["top.JPG", "cats/c1.png", "cats/c2.webp", "dogs/sub/d1.jpeg", "notes.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "h.png").write_bytes(b"")
    items = read_image_folder(root)
    assert [it["id"] for it in items] == [
        "cats/c1.png",
        "cats/c2.webp",
        "dogs/sub/d1.jpeg",
        "top.JPG",
    ]
    assert items[0]["labels"] == ["cats"] and items[2]["labels"] == ["sub"]
    assert "labels" not in items[3]
    assert items[0]["image"] == str((root / "cats" / "c1.png").resolve())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SparsemmError, match="no images under"):
        read_image_folder(empty)


def test_guess_format(tmp_path: Path) -> None:
    assert guess_format(tmp_path) == "images"
    assert guess_format("a/b.json") == "coco"
    assert guess_format("b.JSONL") == "jsonl"
    assert guess_format("b.csv") == "csv"
    with pytest.raises(SparsemmError, match="--format"):
        guess_format("b.parquet")
    with pytest.raises(SparsemmError, match="unknown format"):
        read_items(tmp_path, format="xml")
