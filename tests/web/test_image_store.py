"""ImageStore.from_collection: which item images a server may send, on a folder built here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparsemm.data.collection import Collection
from sparsemm.web.images import IMAGE_TYPES, ImageStore


def _reference(col: Collection) -> dict[str, Path]:
    """The rule written out path by path: resolve (symlinks followed, must exist), keep
    regular files with an image suffix."""
    out = {}
    for item in col.items:
        ref = item.get("image")
        if not isinstance(ref, str) or not ref:
            continue
        path = Path(ref).expanduser()
        path = path if path.is_absolute() else col.root / path
        try:
            path = path.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if path.suffix.lower() in IMAGE_TYPES and path.is_file():
            out[str(item["id"])] = path
    return out


@pytest.mark.skipif(os.name != "posix", reason="symlinks")
def test_image_store_keeps_exactly_the_readable_image_files(tmp_path: Path) -> None:
    root = tmp_path / "col"
    (root / "img" / "sub").mkdir(parents=True)
    (root / "img" / "a.jpg").write_bytes(b"x")
    (root / "img" / "B.PNG").write_bytes(b"x")
    (root / "img" / "notes.txt").write_bytes(b"x")
    (root / "img" / "dir.jpg").mkdir()
    (root / "img" / "sub" / "c.webp").write_bytes(b"x")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "d.jpeg").write_bytes(b"x")
    (root / "img" / "link.jpg").symlink_to(outside / "d.jpeg")
    (root / "img" / "link-to-txt.jpg").symlink_to(root / "img" / "notes.txt")
    (root / "img" / "dangling.jpg").symlink_to(tmp_path / "gone.jpg")
    (root / "linkdir").symlink_to(root / "img" / "sub")
    refs = {
        "a": "img/a.jpg",
        "upper": "img/B.PNG",
        "txt": "img/notes.txt",
        "dir": "img/dir.jpg",
        "nested": "img/sub/c.webp",
        "dotdot": "img/sub/../a.jpg",
        "dot": "./img/./a.jpg",
        "abs": str(outside / "d.jpeg"),
        "link": "img/link.jpg",
        "linked-txt": "img/link-to-txt.jpg",
        "dangling": "img/dangling.jpg",
        "via-linked-folder": "linkdir/c.webp",
        "missing": "img/none.jpg",
        "missing-folder": "nowhere/a.jpg",
        "empty": "",
    }
    items: list[dict] = [{"id": k, "image": v} for k, v in refs.items()]
    items += [{"id": "no-image"}, {"id": "not-text", "image": 3}]
    col = Collection(root=root, manifest={}, items=items)
    got = ImageStore.from_collection(col).paths
    assert got == _reference(col)
    assert set(got) == {"a", "upper", "nested", "dotdot", "dot", "abs", "link", "via-linked-folder"}
    assert got["link"] == (outside / "d.jpeg").resolve()
    assert got["via-linked-folder"] == (root / "img" / "sub" / "c.webp").resolve()
