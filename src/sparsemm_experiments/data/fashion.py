"""Fashion-MNIST and the offline demo collection built from it: captioned multi-object collages.

Fashion-MNIST (Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747) holds 70,000 grey-scale 28x28
product photos (60,000 train, 10,000 test) in 10 classes, stored as gzipped IDX files. They
are looked for, in order, in ``$SPARSEMM_FASHION_MNIST``, the Debian package
``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``) and the cache folder
(:func:`default_cache_dir`); failing that they are downloaded from the official mirrors into
the cache and checked against the published MD5 sums. IDX is parsed with numpy only (no
pickle anywhere).

:func:`build_collages` turns single-object images into a *multi-label* retrieval collection,
so exclusion queries ("a bag but not a coat") have images to be right or wrong about:

- each collage is a ``g x g`` grid (``g`` drawn from ``grid_sizes``) with between ``g`` and
  ``g*g`` objects; the remaining cells stay empty, so object counts vary (2-4 objects on a
  2x2 grid, 3-9 on a 3x3 grid);
- an object set uses 1-4 distinct classes; classes after the first are drawn with weights
  that favour "outfit" pairs (:data:`OUTFIT_PAIRS`, e.g. dress + sandal, coat + ankle boot),
  so some label pairs co-occur often (hard "A but not B" queries, many images with both)
  and others rarely (easy ones); every pair still occurs;
- labels are the classes present (caption nouns such as ``"t-shirt"``, ``"ankle boot"``, in
  class order); captions come from varied templates and name every class with its count in
  words ("two dresses next to an ankle boot");
- train collages only use Fashion-MNIST train images and test collages only test images;
- images are dark-on-white RGB PNGs (inverted like catalogue shots), ``image_size`` pixels
  square, cells bilinearly upscaled from 28 px.

Output folder::

    collages.json   build settings, class table, counts (format "sparsemm.fashion_collages")
    items.jsonl     {"id", "image", "captions", "labels", "split", "grid", "cells",
                     "counts", "sources"}; "image" is relative to this folder, which is how
                     :func:`sparsemm.data.sources.read_captions_jsonl` resolves it
    images/{train,test}/<id>.png

Everything is built in a temporary sibling folder and renamed into place. The result is a
function of the seed and the arguments only; each split draws from its own random stream, so
the first ``n`` train collages do not change when ``n_test`` (or ``n_train``) changes.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, replace_dir, write_json, write_jsonl

logger = logging.getLogger(__name__)

# -- classes and caption nouns --------------------------------------------------------------


@dataclass(frozen=True)
class FashionClass:
    """One Fashion-MNIST class and the words captions use for it."""

    index: int  # the IDX label value
    name: str  # the official class name
    label: str  # the item label: a lowercase caption noun
    singular: str  # noun phrase for one object ("pair of trousers")
    plural: str  # noun phrase for several ("pairs of trousers")
    article: str  # "a" or "an" before ``singular``


CLASSES: tuple[FashionClass, ...] = (
    FashionClass(0, "T-shirt/top", "t-shirt", "t-shirt", "t-shirts", "a"),
    FashionClass(1, "Trouser", "trousers", "pair of trousers", "pairs of trousers", "a"),
    FashionClass(2, "Pullover", "pullover", "pullover", "pullovers", "a"),
    FashionClass(3, "Dress", "dress", "dress", "dresses", "a"),
    FashionClass(4, "Coat", "coat", "coat", "coats", "a"),
    FashionClass(5, "Sandal", "sandal", "sandal", "sandals", "a"),
    FashionClass(6, "Shirt", "shirt", "shirt", "shirts", "a"),
    FashionClass(7, "Sneaker", "sneaker", "sneaker", "sneakers", "a"),
    FashionClass(8, "Bag", "bag", "bag", "bags", "a"),
    FashionClass(9, "Ankle boot", "ankle boot", "ankle boot", "ankle boots", "an"),
)
CLASS_NAMES: tuple[str, ...] = tuple(c.name for c in CLASSES)
LABELS: tuple[str, ...] = tuple(c.label for c in CLASSES)
N_CLASSES = len(CLASSES)

_NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()


def number_word(n: int) -> str:
    """``n`` in words up to twenty ("two"), digits above."""
    if n < 0:
        raise ValueError(f"a count cannot be negative, got {n}")
    return _NUMBER_WORDS[n] if n < len(_NUMBER_WORDS) else str(n)


def count_phrase(cls: FashionClass | int, n: int) -> str:
    """The phrase for ``n`` >= 1 objects of ``cls``: "an ankle boot", "two pairs of trousers"."""
    c = CLASSES[cls] if isinstance(cls, int) else cls
    if n < 1:
        raise ValueError(f"a count phrase needs n >= 1, got {n}")
    return f"{c.article} {c.singular}" if n == 1 else f"{number_word(n)} {c.plural}"


# -- IDX files ------------------------------------------------------------------------------

# IDX type byte -> element dtype (big-endian on disk).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (gzipped or not, told apart by its first bytes) into a native array.

    IDX: two zero bytes, a type byte, a rank byte, ``rank`` big-endian uint32 dimensions,
    then the data in C order. Raises SparsemmError on a short, long or malformed file.
    """
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise SparsemmError(
                f"{path} is a damaged gzip file ({exc}); delete it and download it again"
            ) from exc
    bad = f"{path} is not a valid IDX file"
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise SparsemmError(f"{bad} (bad magic number); delete it and download it again")
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    rank = raw[3]
    header = 4 + 4 * rank
    if rank == 0 or len(raw) < header:
        raise SparsemmError(f"{bad} (truncated header); delete it and download it again")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=rank, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise SparsemmError(
            f"{bad}: the header promises {expected} data bytes for shape {shape}, the file "
            f"has {len(raw) - header}; delete it and download it again"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


# -- locating / downloading -----------------------------------------------------------------

SPLITS = ("train", "test")
# split -> (images file, labels file), without the ".gz" the official files carry.
FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# MD5 of the official .gz files, as published in the Fashion-MNIST README. (Debian's
# repacked .gz files differ byte-wise; local files are checked by their IDX headers instead.)
OFFICIAL_MD5: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
MIRRORS: tuple[str, ...] = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
)
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
ENV_DIR = "SPARSEMM_FASHION_MNIST"

Fetch = Callable[[str, Path], None]


def default_cache_dir() -> Path:
    """``$SPARSEMM_CACHE/fashion-mnist``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``)
    ``/sparsemm/fashion-mnist``."""
    if os.environ.get("SPARSEMM_CACHE"):
        return Path(os.environ["SPARSEMM_CACHE"]).expanduser() / "fashion-mnist"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "sparsemm" / "fashion-mnist"


def _idx_file(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def _has_files(folder: Path, splits: Sequence[str] = SPLITS) -> bool:
    return all(_idx_file(folder, stem) is not None for s in splits for stem in FILES[s])


def find_fashion_mnist(
    cache_dir: str | Path | None = None, splits: Sequence[str] = SPLITS
) -> Path | None:
    """The first folder holding the IDX files of ``splits``: ``$SPARSEMM_FASHION_MNIST``,
    the Debian package folder, then the cache folder; None when none has them."""
    candidates = []
    if os.environ.get(ENV_DIR):
        candidates.append(Path(os.environ[ENV_DIR]).expanduser())
    candidates += [DEBIAN_DIR, Path(cache_dir).expanduser() if cache_dir else default_cache_dir()]
    return next((c for c in candidates if c.is_dir() and _has_files(c, splits)), None)


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _urllib_fetch(url: str, dest: Path) -> None:
    """Stream ``url`` into ``dest`` (written atomically)."""
    with urllib.request.urlopen(url, timeout=60) as resp, atomic_open(dest, "wb") as fh:
        shutil.copyfileobj(resp, fh, length=1 << 20)


def _file_ok(path: Path, expected: str | None) -> str | None:
    """None when ``path`` has the ``expected`` MD5 (or, without one, parses as IDX), else
    the reason it does not."""
    if expected is not None:
        got = _md5(path)
        return None if got == expected else f"MD5 {got} != expected {expected}"
    try:
        read_idx(path)
    except SparsemmError as exc:
        return str(exc)
    return None


def download_fashion_mnist(
    cache_dir: str | Path | None = None,
    splits: Sequence[str] = SPLITS,
    mirrors: Sequence[str] | None = None,
    checksums: Mapping[str, str] | None = None,
    fetch: Fetch | None = None,
) -> Path:
    """Download the gzipped IDX files of ``splits`` into ``cache_dir`` and return it.

    Files already there and passing their check are kept. Each file is tried on every mirror
    in turn (default :data:`MIRRORS`); a download must match its MD5 in ``checksums``
    (default :data:`OFFICIAL_MD5`; a file without one must parse as IDX) before it is renamed
    into place. ``fetch(url, dest)`` is the transfer (default: urllib), replaceable for
    tests or proxies.
    """
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fetch = fetch or _urllib_fetch
    mirrors = MIRRORS if mirrors is None else mirrors
    checksums = OFFICIAL_MD5 if checksums is None else checksums
    for split in splits:
        if split not in FILES:
            raise SparsemmError(f"unknown Fashion-MNIST split {split!r}; use train or test")
        for stem in FILES[split]:
            name = f"{stem}.gz"
            target = folder / name
            md5 = checksums.get(name)
            if target.is_file() and _file_ok(target, md5) is None:
                continue
            errors = []
            for mirror in mirrors:
                url = mirror.rstrip("/") + "/" + name
                tmp = folder / f".{name}.part"
                try:
                    logger.info("downloading %s", url)
                    fetch(url, tmp)
                    problem = _file_ok(tmp, md5) if tmp.is_file() else "nothing written"
                    if problem is None:
                        os.replace(tmp, target)
                        break
                    errors.append(f"{url}: {problem}")
                except (OSError, ValueError) as exc:  # URLError/HTTPError are OSErrors
                    errors.append(f"{url}: {exc}")
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
            else:
                raise SparsemmError(
                    f"could not download Fashion-MNIST file {name} ("
                    + "; ".join(errors)
                    + f"). Install the Debian package dataset-fashion-mnist, or put the "
                    f"official .gz files into {folder} (or a folder named by ${ENV_DIR})"
                )
    return folder


@dataclass(frozen=True)
class FashionSplit:
    """One Fashion-MNIST split in memory."""

    split: str
    images: np.ndarray  # (n, 28, 28) uint8, light garment on a black background
    labels: np.ndarray  # (n,) int64 class index in [0, 10)
    source: str  # folder the files came from


def load_fashion_mnist(
    split: str = "train",
    root: str | Path | None = None,
    download: bool = True,
    cache_dir: str | Path | None = None,
    fetch: Fetch | None = None,
) -> FashionSplit:
    """Load one split. ``root``: a folder with the IDX files (``.gz`` or plain); without it
    the files are found by :func:`find_fashion_mnist` or, if ``download``, downloaded."""
    if split not in FILES:
        raise SparsemmError(f"unknown Fashion-MNIST split {split!r}; use train or test")
    if root is not None:
        folder = Path(root).expanduser()
        if not folder.is_dir() or not _has_files(folder, [split]):
            raise SparsemmError(
                f"{folder} does not hold the Fashion-MNIST {split} files "
                f"({', '.join(f'{s}[.gz]' for s in FILES[split])})"
            )
    else:
        found = find_fashion_mnist(cache_dir, [split])
        if found is None:
            if not download:
                raise SparsemmError(
                    "Fashion-MNIST not found: install the Debian package dataset-fashion-mnist, "
                    f"set ${ENV_DIR} to a folder with the IDX files, or allow the download"
                )
            found = download_fashion_mnist(cache_dir, [split], fetch=fetch)
        folder = found
    img_path, lab_path = (_idx_file(folder, stem) for stem in FILES[split])
    assert img_path is not None and lab_path is not None  # checked by _has_files
    images, labels = read_idx(img_path), read_idx(lab_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise SparsemmError(
            f"{img_path}: expected (n, height, width) uint8 images, got {images.dtype} "
            f"{images.shape}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise SparsemmError(
            f"{lab_path}: expected {len(images)} labels (one per image), got shape {labels.shape}"
        )
    labels = labels.astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= N_CLASSES):
        raise SparsemmError(f"{lab_path}: labels must lie in 0..{N_CLASSES - 1}")
    logger.info("Fashion-MNIST %s: %d images from %s", split, len(images), folder)
    return FashionSplit(split=split, images=images, labels=labels, source=str(folder))


# -- collages -------------------------------------------------------------------------------

# Class pairs that make an outfit or a typical shop shelf; they co-occur more often (weight
# OUTFIT_WEIGHT vs 1 for any other pair) so the benchmark has hard exclusion pairs.
OUTFIT_PAIRS: tuple[tuple[str, str], ...] = (
    ("t-shirt", "trousers"),
    ("t-shirt", "sneaker"),
    ("trousers", "sneaker"),
    ("pullover", "trousers"),
    ("shirt", "trousers"),
    ("dress", "sandal"),
    ("dress", "bag"),
    ("coat", "ankle boot"),
    ("coat", "bag"),
    ("pullover", "ankle boot"),
)
OUTFIT_WEIGHT = 4.0
# P(number of distinct classes = 1, 2, 3, 4), truncated to the object count and renormalised.
N_CLASSES_PROBS = (0.1, 0.35, 0.35, 0.2)

# (template, minimum number of distinct classes). {list}: all count phrases joined
# ("a bag, a coat and two shirts"); {first}/{rest}: the first phrase / the others joined;
# {total}/{items}: the object count in words and "item"/"items".
CAPTION_TEMPLATES: tuple[tuple[str, int], ...] = (
    ("{list}", 1),
    ("a collage of {list}", 1),
    ("a grid of product photos showing {list}", 1),
    ("{list} on a white background", 1),
    ("a picture of {list}", 1),
    ("{total} fashion {items}: {list}", 1),
    ("{list} arranged in a grid", 1),
    ("catalogue photos of {list}", 1),
    ("{first} next to {rest}", 2),
    ("{first} beside {rest}", 2),
    ("{first} together with {rest}", 2),
)
MAX_CAPTIONS = sum(1 for _, k in CAPTION_TEMPLATES if k == 1)

FORMAT = "sparsemm.fashion_collages"
VERSION = 1


def _affinity() -> np.ndarray:
    w = np.ones((N_CLASSES, N_CLASSES))
    idx = {c.label: c.index for c in CLASSES}
    for a, b in OUTFIT_PAIRS:
        w[idx[a], idx[b]] = w[idx[b], idx[a]] = OUTFIT_WEIGHT
    return w


_AFFINITY = _affinity()


def _join(parts: Sequence[str]) -> str:
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def collage_captions(counts: Mapping[int, int], rng: np.random.Generator, n: int = 5) -> list[str]:
    """``n`` distinct captions naming every class in ``counts`` (class index -> count >= 1)
    with its count, each from a different template, phrases in a fresh random order."""
    if not counts or any(v < 1 for v in counts.values()):
        raise SparsemmError("a collage caption needs at least one class with count >= 1")
    eligible = [t for t, k in CAPTION_TEMPLATES if len(counts) >= k]
    if not 1 <= n <= len(eligible):
        raise SparsemmError(f"captions per image must lie in 1..{MAX_CAPTIONS}, got {n}")
    total = sum(counts.values())
    classes = sorted(counts)
    captions = []
    for t in rng.choice(len(eligible), size=n, replace=False):
        order = rng.permutation(len(classes))
        parts = [count_phrase(classes[i], counts[classes[i]]) for i in order]
        captions.append(
            eligible[int(t)].format(
                list=_join(parts),
                first=parts[0],
                rest=_join(parts[1:]) if len(parts) > 1 else "",
                total=number_word(total),
                items="item" if total == 1 else "items",
            )
        )
    return captions


def sample_layout(
    rng: np.random.Generator, grid: int, available: Sequence[int] = tuple(range(N_CLASSES))
) -> list[int | None]:
    """Class index per cell (row-major; None = empty) for a ``grid x grid`` collage.

    Object count k ~ U{grid, ..., grid^2}; distinct classes m from :data:`N_CLASSES_PROBS`
    (m <= k, m <= len(available)); the first class uniform over ``available``, each further
    one with probability proportional to its summed affinity to the classes already chosen;
    the k objects split over the m classes as a uniform random composition (each >= 1);
    objects placed in k random cells.
    """
    cells = grid * grid
    k = int(rng.integers(grid, cells + 1))
    m_max = min(k, len(available), len(N_CLASSES_PROBS))
    probs = np.asarray(N_CLASSES_PROBS[:m_max])
    m = int(rng.choice(m_max, p=probs / probs.sum())) + 1
    pool = list(available)
    chosen = [pool.pop(int(rng.integers(len(pool))))]
    while len(chosen) < m:
        w = _AFFINITY[np.ix_(chosen, pool)].sum(axis=0)
        chosen.append(pool.pop(int(rng.choice(len(pool), p=w / w.sum()))))
    # Uniform composition of k into m positive parts: m - 1 distinct cut points in 1..k-1.
    cuts = np.sort(rng.choice(np.arange(1, k), size=m - 1, replace=False)) if m > 1 else ()
    sizes = np.diff(np.concatenate([[0], np.asarray(cuts, dtype=int), [k]]))
    objects = [c for c, s in zip(chosen, sizes, strict=True) for _ in range(int(s))]
    layout: list[int | None] = [None] * cells
    for pos, c in zip(rng.permutation(cells)[:k], objects, strict=True):
        layout[int(pos)] = c
    return layout


def render_collage(
    images: Sequence[np.ndarray | None], grid: int, image_size: int = 224, invert: bool = True
) -> Image.Image:
    """An RGB ``image_size`` square: cell i (row-major) shows ``images[i]`` (a 2-D uint8
    array, bilinearly resized to the cell less a small margin) or stays blank.

    ``invert`` turns Fashion-MNIST's light-on-black into dark-on-white catalogue shots.
    """
    if len(images) != grid * grid:
        raise ValueError(f"{grid}x{grid} grid needs {grid * grid} cells, got {len(images)}")
    cell = image_size // grid
    if cell < 8:
        raise SparsemmError(f"image_size {image_size} is too small for a {grid}x{grid} grid")
    margin = max(1, cell // 16)
    offset = (image_size - grid * cell) // 2
    canvas = Image.new("L", (image_size, image_size), 255 if invert else 0)
    for i, img in enumerate(images):
        if img is None:
            continue
        tile = Image.fromarray(np.ascontiguousarray(255 - img if invert else img, dtype=np.uint8))
        tile = tile.resize((cell - 2 * margin,) * 2, Image.Resampling.BILINEAR)
        r, c = divmod(i, grid)
        canvas.paste(tile, (offset + c * cell + margin, offset + r * cell + margin))
    return canvas.convert("RGB")


class _ClassPools:
    """Draws image indices of a class without replacement, reshuffling when a class runs out."""

    def __init__(self, labels: np.ndarray, rng: np.random.Generator) -> None:
        self.rng = rng
        self.members = [np.flatnonzero(labels == c) for c in range(N_CLASSES)]
        self.queues: list[list[int]] = [[] for _ in range(N_CLASSES)]

    @property
    def available(self) -> list[int]:
        return [c for c in range(N_CLASSES) if len(self.members[c])]

    def draw(self, c: int) -> int:
        if not self.queues[c]:
            self.queues[c] = [int(i) for i in self.rng.permutation(self.members[c])[::-1]]
        return self.queues[c].pop()


def _split_items(
    data: FashionSplit,
    n: int,
    grid_sizes: Sequence[int],
    seed: int,
    captions_per_image: int,
    image_size: int,
    invert: bool,
    out: Path,
    progress: bool,
) -> list[dict[str, Any]]:
    # One stream per split (seed, split code): train collages do not depend on n_test.
    rng = np.random.default_rng([seed, SPLITS.index(data.split)])
    pools = _ClassPools(data.labels, rng)
    available = pools.available
    if not available:
        raise SparsemmError(f"the Fashion-MNIST {data.split} split has no images")
    folder = out / "images" / data.split
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in tqdm(range(n), desc=f"collages {data.split}", disable=not progress, leave=False):
        grid = int(grid_sizes[int(rng.integers(len(grid_sizes)))])
        layout = sample_layout(rng, grid, available)
        sources = [None if c is None else pools.draw(c) for c in layout]
        counts: dict[int, int] = {}
        for c in layout:
            if c is not None:
                counts[c] = counts.get(c, 0) + 1
        item_id = f"{data.split}-{i:06d}"
        rel = f"images/{data.split}/{item_id}.png"
        pixels = [None if s is None else data.images[s] for s in sources]
        # zlib level 1: half the time of the default level for ~4% larger files.
        render_collage(pixels, grid, image_size, invert).save(
            out / rel, format="PNG", compress_level=1
        )
        rows.append(
            {
                "id": item_id,
                "image": rel,
                "captions": collage_captions(counts, rng, captions_per_image),
                "labels": [LABELS[c] for c in sorted(counts)],
                "split": data.split,
                "grid": grid,
                "cells": [None if c is None else LABELS[c] for c in layout],
                "counts": {LABELS[c]: counts[c] for c in sorted(counts)},
                "sources": sources,
            }
        )
    return rows


def _check_target(target: Path) -> None:
    if target.exists() and not (target / "collages.json").is_file():
        if not target.is_dir() or any(target.iterdir()):
            raise SparsemmError(
                f"{target} exists and is not a collage folder; choose another output path"
            )


def _swap_in(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``; an old collage folder there is replaced (see
    :func:`sparsemm.io.replace_dir`)."""
    _check_target(target)
    replace_dir(new, target)


def build_collages(
    out_dir: str | Path,
    n_train: int,
    n_test: int,
    grid_sizes: Sequence[int] = (2, 3),
    seed: int = 0,
    source: str | Path | Mapping[str, FashionSplit] | None = None,
    captions_per_image: int = 5,
    image_size: int = 224,
    invert: bool = True,
    download: bool = True,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> Path:
    """Build the collage collection into ``out_dir`` (see the module docstring); return the
    path of its ``items.jsonl``.

    ``source``: a folder with the Fashion-MNIST IDX files, already loaded splits
    (``{"train": FashionSplit, "test": FashionSplit}``), or None to find/download them.
    Train collages use train images, test collages test images. An existing collage folder
    at ``out_dir`` is replaced; any other non-empty folder there is an error.
    """
    out = Path(out_dir).expanduser()
    if n_train < 0 or n_test < 0 or n_train + n_test == 0:
        raise SparsemmError(
            f"need n_train, n_test >= 0 and at least one collage, got {n_train}, {n_test}"
        )
    grids = [int(g) for g in grid_sizes]
    if not grids or any(not 1 <= g <= 8 for g in grids):
        raise SparsemmError(f"grid sizes must lie in 1..8, got {list(grid_sizes)}")
    if not 1 <= captions_per_image <= MAX_CAPTIONS:
        raise SparsemmError(
            f"captions per image must lie in 1..{MAX_CAPTIONS}, got {captions_per_image}"
        )
    if image_size < 8 * max(grids):
        raise SparsemmError(f"image_size {image_size} is too small for a {max(grids)}-grid")
    _check_target(out)
    wanted = {"train": n_train, "test": n_test}

    splits: dict[str, FashionSplit] = {}
    for split, n in wanted.items():
        if n == 0:
            continue
        if isinstance(source, Mapping):
            if split not in source:
                raise SparsemmError(f"source has no {split!r} split (has: {', '.join(source)})")
            splits[split] = source[split]
        else:
            splits[split] = load_fashion_mnist(split, source, download, cache_dir)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        # mkdtemp makes the folder private (0o700); give the result the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        rows: list[dict[str, Any]] = []
        for split, data in splits.items():
            rows += _split_items(
                data,
                wanted[split],
                grids,
                seed,
                captions_per_image,
                image_size,
                invert,
                tmp,
                progress,
            )
        write_jsonl(tmp / "items.jsonl", rows)
        label_counts = {lab: 0 for lab in LABELS}
        for row in rows:
            for lab in row["labels"]:
                label_counts[lab] += 1
        write_json(
            tmp / "collages.json",
            {
                "format": FORMAT,
                "version": VERSION,
                "seed": seed,
                "grid_sizes": grids,
                "image_size": image_size,
                "invert": invert,
                "captions_per_image": captions_per_image,
                "counts": {s: wanted[s] for s in splits},
                "sources": {s: d.source for s, d in splits.items()},
                "classes": [{"label": c.label, "name": c.name} for c in CLASSES],
                "label_counts": label_counts,
            },
        )
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote %d collages to %s", len(rows), out)
    return out / "items.jsonl"
