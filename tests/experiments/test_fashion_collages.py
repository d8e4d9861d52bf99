"""Fashion-MNIST loading (IDX, Debian folder, download) and the captioned collage builder.

Most tests run on a tiny fake Fashion-MNIST written here in IDX format: 40 random train and
20 random test images, every class present in both splits.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from sparsemm.data.sources import read_captions_jsonl, read_items
from sparsemm.errors import SparsemmError
from sparsemm_experiments.data import fashion
from sparsemm_experiments.data.fashion import (
    CLASSES,
    FILES,
    LABELS,
    OUTFIT_PAIRS,
    build_collages,
    collage_captions,
    count_phrase,
    download_fashion_mnist,
    find_fashion_mnist,
    load_fashion_mnist,
    number_word,
    read_idx,
    sample_layout,
)

SIZES = {"train": 40, "test": 20}


def write_idx(path: Path, arr: np.ndarray, compress: bool = True) -> None:
    """Independent IDX writer: magic (0, 0, 0x08 = ubyte, rank), big-endian dims, data."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    raw = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim)
    raw += struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(raw, mtime=0) if compress else raw)


def fake_splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(123)
    out = {}
    for split, n in SIZES.items():
        # Random 7x7 patterns blown up to 28x28 (4x4 blocks): distinct images that stay
        # recognisable after the collage's resampling, unlike per-pixel noise.
        coarse = rng.integers(0, 256, size=(n, 7, 7), dtype=np.uint8)
        images = np.kron(coarse, np.ones((4, 4), dtype=np.uint8))
        labels = rng.permutation(np.arange(n) % 10).astype(np.uint8)
        out[split] = (images, labels)
    return out


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fmnist")
    for split, (images, labels) in fake_splits().items():
        write_idx(folder / f"{FILES[split][0]}.gz", images)
        write_idx(folder / f"{FILES[split][1]}.gz", labels)
    return folder


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, fake_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("built") / "collages"
    return build_collages(out, n_train=24, n_test=12, seed=7, source=fake_dir)


def rows_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- IDX and loading --------------------------------------------------------------------------


def test_read_idx_plain_gzip_and_corrupt(tmp_path: Path) -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", arr)
    write_idx(tmp_path / "a", arr, compress=False)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), arr)
    # Big-endian int32 data is returned in native order.
    ints = np.array([1, -2, 70000], dtype=">i4")
    (tmp_path / "i").write_bytes(struct.pack(">BBBBI", 0, 0, 0x0C, 1, 3) + ints.tobytes())
    assert read_idx(tmp_path / "i").tolist() == [1, -2, 70000]

    raw = (tmp_path / "a").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-1])
    with pytest.raises(SparsemmError, match="header promises 24 data bytes"):
        read_idx(tmp_path / "short")
    (tmp_path / "magic").write_bytes(b"\x01" + raw[1:])
    with pytest.raises(SparsemmError, match="bad magic"):
        read_idx(tmp_path / "magic")
    (tmp_path / "gz").write_bytes(gzip.compress(raw)[:-10])
    with pytest.raises(SparsemmError, match="damaged gzip"):
        read_idx(tmp_path / "gz")
    with pytest.raises(SparsemmError, match="file not found"):
        read_idx(tmp_path / "missing")


def test_load_from_folder(fake_dir: Path, tmp_path: Path) -> None:
    data = load_fashion_mnist("test", root=fake_dir)
    images, labels = fake_splits()["test"]
    assert data.split == "test" and data.images.shape == (20, 28, 28)
    np.testing.assert_array_equal(data.images, images)
    np.testing.assert_array_equal(data.labels, labels)
    assert data.labels.dtype == np.int64
    with pytest.raises(SparsemmError, match="does not hold the Fashion-MNIST train files"):
        load_fashion_mnist("train", root=tmp_path)
    with pytest.raises(SparsemmError, match="unknown Fashion-MNIST split 'val'"):
        load_fashion_mnist("val", root=fake_dir)
    # Labels outside 0..9 and mismatched lengths are user errors.
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images, compress=False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.full(20, 10, np.uint8), compress=False)
    with pytest.raises(SparsemmError, match=r"labels must lie in 0\.\.9"):
        load_fashion_mnist("test", root=tmp_path)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels[:5], compress=False)
    with pytest.raises(SparsemmError, match="expected 20 labels"):
        load_fashion_mnist("test", root=tmp_path)


def test_find_prefers_env_folder(
    fake_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fashion, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.delenv(fashion.ENV_DIR, raising=False)
    assert find_fashion_mnist(cache_dir=tmp_path / "empty-cache") is None
    assert find_fashion_mnist(cache_dir=fake_dir) == fake_dir
    monkeypatch.setenv(fashion.ENV_DIR, str(fake_dir))
    assert find_fashion_mnist(cache_dir=tmp_path / "empty-cache") == fake_dir
    monkeypatch.delenv(fashion.ENV_DIR)
    with pytest.raises(SparsemmError, match="install the Debian package dataset-fashion-mnist"):
        load_fashion_mnist("test", download=False, cache_dir=tmp_path / "empty-cache")


# -- download ---------------------------------------------------------------------------------


def _md5s(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.glob("*.gz")}


def test_download_with_fake_fetch(
    fake_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def fetch(url: str, dest: Path) -> None:
        calls.append(url)
        name = url.rsplit("/", 1)[1]
        if url.startswith("https://broken.example/"):
            dest.write_bytes(b"not the file")  # wrong MD5: must be rejected
        elif url.startswith("https://down.example/"):
            raise OSError("connection refused")
        else:
            shutil.copy(fake_dir / name, dest)

    cache = tmp_path / "cache"
    mirrors = ("https://broken.example/", "https://down.example/", "https://good.example/")
    got = download_fashion_mnist(
        cache, splits=["test"], mirrors=mirrors, checksums=_md5s(fake_dir), fetch=fetch
    )
    assert got == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{s}.gz" for s in FILES["test"])
    assert len(calls) == 6 and calls[2] == "https://good.example/t10k-images-idx3-ubyte.gz"
    np.testing.assert_array_equal(
        read_idx(cache / "t10k-labels-idx1-ubyte.gz"), fake_splits()["test"][1]
    )
    # Verified files in the cache are not fetched again.
    download_fashion_mnist(cache, ["test"], mirrors, checksums=_md5s(fake_dir), fetch=fetch)
    assert len(calls) == 6

    # Every mirror failing: a clear error, and no partial file left behind.
    with pytest.raises(SparsemmError, match=r"could not download .*train-images.*MD5.*refused"):
        download_fashion_mnist(
            cache, ["train"], mirrors[:2], checksums=_md5s(fake_dir), fetch=fetch
        )
    assert not any(p.name.startswith("train") or p.name.startswith(".") for p in cache.iterdir())

    # The full path: nothing installed -> download (official MD5 table patched for the fake).
    monkeypatch.setattr(fashion, "DEBIAN_DIR", tmp_path / "no-debian")
    monkeypatch.delenv(fashion.ENV_DIR, raising=False)
    monkeypatch.setattr(fashion, "MIRRORS", ("https://good.example/",))
    monkeypatch.setattr(fashion, "OFFICIAL_MD5", _md5s(fake_dir))
    data = load_fashion_mnist("train", cache_dir=tmp_path / "cache2", fetch=fetch)
    assert data.images.shape == (40, 28, 28) and data.source == str(tmp_path / "cache2")


def test_download_through_urllib_from_file_url(fake_dir: Path, tmp_path: Path) -> None:
    # The default urllib transfer, served from a local folder (no network here).
    cache = download_fashion_mnist(
        tmp_path / "cache", ["test"], mirrors=[fake_dir.as_uri()], checksums=_md5s(fake_dir)
    )
    assert load_fashion_mnist("test", root=cache).images.shape == (20, 28, 28)
    with pytest.raises(SparsemmError, match="could not download"):
        download_fashion_mnist(tmp_path / "c2", ["test"], mirrors=[(tmp_path / "nope").as_uri()])


# -- captions and layouts ---------------------------------------------------------------------


def test_words_and_phrases() -> None:
    assert [number_word(n) for n in (1, 2, 9, 20, 21)] == ["one", "two", "nine", "twenty", "21"]
    assert count_phrase(9, 1) == "an ankle boot"
    assert count_phrase(1, 1) == "a pair of trousers"
    assert count_phrase(1, 3) == "three pairs of trousers"
    assert count_phrase(CLASSES[3], 2) == "two dresses"
    assert [c.name for c in CLASSES][:2] == ["T-shirt/top", "Trouser"]


_COUNT_WORDS = {number_word(n): n for n in range(2, 21)} | {"a": 1, "an": 1}


def parse_counts(caption: str) -> dict[str, int]:
    """Class label -> count for every "<count> <noun>" phrase in a caption (each once)."""
    found: dict[str, int] = {}
    for c in CLASSES:
        for noun in (c.singular, c.plural):
            pattern = rf"(?<![\w-])({'|'.join(_COUNT_WORDS)}) {re.escape(noun)}(?![\w-])"
            for match in re.finditer(pattern, caption):
                assert c.label not in found, f"{c.label} named twice in {caption!r}"
                found[c.label] = _COUNT_WORDS[match.group(1)]
    return found


def test_captions_name_every_class_with_its_count() -> None:
    rng = np.random.default_rng(0)
    for counts in ({7: 1}, {3: 2, 9: 1}, {0: 1, 6: 2, 8: 1, 1: 3}):
        caps = collage_captions(counts, rng, n=5)
        assert len(set(caps)) == 5
        for cap in caps:
            assert parse_counts(cap) == {LABELS[c]: n for c, n in counts.items()}, cap
    with pytest.raises(SparsemmError, match="captions per image"):
        collage_captions({1: 1}, rng, n=99)


def test_layouts_give_hard_and_easy_exclusion_pairs() -> None:
    rng = np.random.default_rng(1)
    has = np.zeros((3000, 10), dtype=bool)
    for i in range(len(has)):
        grid = (2, 3)[i % 2]
        layout = sample_layout(rng, grid)
        objects = [c for c in layout if c is not None]
        assert len(layout) == grid * grid and grid <= len(objects) <= grid * grid
        assert 1 <= len(set(objects)) <= 4
        has[i, objects] = True
    both = has.T.astype(int) @ has.astype(int)
    p_b_given_a = both / has.sum(0)[:, None]
    idx = {lab: i for i, lab in enumerate(LABELS)}
    outfit = {(idx[a], idx[b]) for a, b in OUTFIT_PAIRS} | {
        (idx[b], idx[a]) for a, b in OUTFIT_PAIRS
    }
    for a, b in itertools.permutations(range(10), 2):
        # "a but not b" has relevant images and hard negatives (images with both).
        assert both[a, b] > 0 and has[:, a].sum() - both[a, b] > 0
    outfit_p = np.mean([p_b_given_a[a, b] for a, b in outfit])
    other_p = np.mean(
        [p_b_given_a[a, b] for a, b in itertools.permutations(range(10), 2) if (a, b) not in outfit]
    )
    assert outfit_p > 0.25 > other_p


# -- building collages ------------------------------------------------------------------------


def _best_match(cell: np.ndarray, candidates: np.ndarray) -> int:
    """Index of the candidate 28x28 image most correlated with a (downscaled) cell."""
    x = cell.astype(np.float64).ravel()
    x -= x.mean()
    c = candidates.reshape(len(candidates), -1).astype(np.float64)
    c -= c.mean(axis=1, keepdims=True)
    scores = c @ x / (np.linalg.norm(c, axis=1) * np.linalg.norm(x) + 1e-12)
    return int(np.argmax(scores))


def test_collages_match_their_cells_and_splits(built: Path) -> None:
    rows = rows_of(built)
    splits = fake_splits()
    assert [r["split"] for r in rows] == ["train"] * 24 + ["test"] * 12
    assert len({r["id"] for r in rows}) == 36
    # Candidates from both splits: a cell must match its recorded image of its own split.
    pool = np.concatenate([splits["train"][0], splits["test"][0]])
    offset = {"train": 0, "test": SIZES["train"]}
    for row in rows:
        grid, cells, sources = row["grid"], row["cells"], row["sources"]
        assert grid in (2, 3) and len(cells) == len(sources) == grid * grid
        present = [c for c in cells if c is not None]
        assert grid <= len(present)
        assert row["labels"] == [lab for lab in LABELS if lab in present]
        assert row["counts"] == {lab: present.count(lab) for lab in row["labels"]}
        labels = splits[row["split"]][1]
        for lab, src in zip(cells, sources, strict=True):
            assert (lab is None) == (src is None)
            if src is not None:
                assert LABELS[labels[src]] == lab

        img = Image.open(built.parent / row["image"])
        assert img.mode == "RGB" and img.size == (224, 224)
        grey = np.asarray(img.convert("L"))
        size = 224 // grid
        off = (224 - grid * size) // 2
        for i, src in enumerate(sources):
            r, c = divmod(i, grid)
            crop = grey[
                off + r * size : off + (r + 1) * size, off + c * size : off + (c + 1) * size
            ]
            if src is None:
                assert (crop == 255).all()  # empty cells are blank (white)
                continue
            small = np.asarray(Image.fromarray(crop).resize((28, 28), Image.Resampling.BILINEAR))
            # Collages are inverted (dark on white); compare against inverted sources.
            assert _best_match(small, 255 - pool) == offset[row["split"]] + src


def test_captions_of_built_items(built: Path) -> None:
    for row in rows_of(built):
        assert len(row["captions"]) == 5 == len(set(row["captions"]))
        for cap in row["captions"]:
            assert parse_counts(cap) == row["counts"], cap
    info = json.loads((built.parent / "collages.json").read_text())
    assert info["format"] == "sparsemm.fashion_collages" and info["seed"] == 7
    assert info["counts"] == {"train": 24, "test": 12}


def test_read_back_through_jsonl_reader(built: Path) -> None:
    rows = rows_of(built)
    items = read_captions_jsonl(built)
    assert [it["id"] for it in items] == [r["id"] for r in rows]
    for it, row in zip(items, rows, strict=True):
        # Relative image paths resolve against the folder of items.jsonl.
        assert it["image"] == str((built.parent / row["image"]).resolve())
        assert Path(it["image"]).is_file()
        assert it["captions"] == row["captions"] and it["labels"] == row["labels"]
        assert it["split"] == row["split"]
    assert len(read_items(built, split="test")) == 12


def test_deterministic_and_prefix_stable(fake_dir: Path, built: Path, tmp_path: Path) -> None:
    again = build_collages(tmp_path / "again", n_train=24, n_test=12, seed=7, source=fake_dir)
    assert again.read_bytes() == built.read_bytes()
    for row in rows_of(built):
        assert (again.parent / row["image"]).read_bytes() == (
            built.parent / row["image"]
        ).read_bytes()
    # Each split has its own stream: fewer train collages leave the test ones unchanged.
    fewer = rows_of(build_collages(tmp_path / "fewer", 5, 12, seed=7, source=fake_dir))
    full = rows_of(built)
    assert fewer[:5] == full[:5] and fewer[5:] == full[24:]
    other = rows_of(build_collages(tmp_path / "other", 24, 12, seed=8, source=fake_dir))
    assert [r["cells"] for r in other] != [r["cells"] for r in full]


def test_loaded_splits_as_source_and_options(tmp_path: Path, fake_dir: Path) -> None:
    src = {s: load_fashion_mnist(s, root=fake_dir) for s in ("train", "test")}
    path = build_collages(
        tmp_path / "c",
        0,
        4,
        grid_sizes=[1],
        seed=0,
        source=src,
        captions_per_image=3,
        image_size=64,
    )
    rows = rows_of(path)
    assert [r["split"] for r in rows] == ["test"] * 4
    assert all(len(r["labels"]) == 1 and len(r["captions"]) == 3 for r in rows)
    assert Image.open(path.parent / rows[0]["image"]).size == (64, 64)
    assert not (path.parent / "images" / "train").exists()


def test_overwrite_and_atomicity(
    tmp_path: Path, fake_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    first = build_collages(out, 3, 2, seed=1, source=fake_dir).read_bytes()
    # A previous collage folder is replaced ...
    build_collages(out, 4, 2, seed=2, source=fake_dir)
    assert len(rows_of(out / "items.jsonl")) == 6
    assert first != (out / "items.jsonl").read_bytes()
    # ... a crash mid-build leaves it untouched and no temp folder behind ...
    good = (out / "items.jsonl").read_bytes()
    calls = {"n": 0}
    real = fashion.render_collage

    def flaky(*args: Any, **kwargs: Any) -> Image.Image:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(fashion, "render_collage", flaky)
    with pytest.raises(RuntimeError, match="disk full"):
        build_collages(out, 5, 5, seed=3, source=fake_dir)
    monkeypatch.undo()
    assert (out / "items.jsonl").read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # ... and any other non-empty folder is refused.
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(SparsemmError, match="not a collage folder"):
        build_collages(other, 2, 2, source=fake_dir)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_train": 0, "n_test": 0}, "at least one collage"),
        ({"n_train": -1, "n_test": 2}, "at least one collage"),
        ({"grid_sizes": [0]}, r"grid sizes must lie in 1\.\.8"),
        ({"grid_sizes": []}, "grid sizes"),
        ({"captions_per_image": 0}, "captions per image"),
        ({"image_size": 10}, "too small"),
    ],
)
def test_bad_arguments(tmp_path: Path, fake_dir: Path, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"n_train": 2, "n_test": 2, "source": fake_dir, **kwargs}
    with pytest.raises(SparsemmError, match=match):
        build_collages(tmp_path / "x", **args)
    assert not (tmp_path / "x").exists()


def test_mapping_source_needs_the_split(tmp_path: Path, fake_dir: Path) -> None:
    train_only = {"train": load_fashion_mnist("train", fake_dir)}
    with pytest.raises(SparsemmError, match="no 'test' split"):
        build_collages(tmp_path / "y", 1, 1, source=train_only)


# -- the real Debian data -----------------------------------------------------------------------

_DEBIAN = fashion.DEBIAN_DIR


@pytest.mark.skipif(
    not all((_DEBIAN / f"{stem}.gz").is_file() for s in FILES.values() for stem in s),
    reason="real Fashion-MNIST absent: apt-get install dataset-fashion-mnist "
    "(files under /usr/share/datasets/fashion-mnist)",
)
def test_real_debian_data(tmp_path: Path) -> None:
    test = load_fashion_mnist("test", root=_DEBIAN)
    assert test.images.shape == (10000, 28, 28) and test.images.dtype == np.uint8
    assert np.bincount(test.labels).tolist() == [1000] * 10
    path = build_collages(tmp_path / "real", 0, 20, seed=0, source={"test": test})
    rows = rows_of(path)
    for row in rows:
        assert [LABELS[test.labels[s]] for s in row["sources"] if s is not None] == [
            c for c in row["cells"] if c is not None
        ]
    assert len(read_captions_jsonl(path)) == 20


def test_cli_collages(fake_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sparsemm.cli.main import main

    out = tmp_path / "coll"
    argv = ["collages", "-o", str(out), "--train", "6", "--test", "2", "--source", str(fake_dir)]
    assert main([*argv, "--no-progress"]) == 0
    assert "6 train + 2 test collages" in capsys.readouterr().out
    rows = rows_of(out / "items.jsonl")
    assert [r["split"] for r in rows].count("test") == 2
    assert main(["collages", "-o", str(out), "--source", str(tmp_path / "missing")]) == 2
