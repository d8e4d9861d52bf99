"""SPINE's sparse word vectors: words with sparse codes, saved and loaded as a checksummed
folder. The SPINE model that makes them is :mod:`sparsemm.models.spine`, its training
:mod:`sparsemm.train.spine` (Subramanian, Pruthi, Jhamtani, Berg-Kirkpatrick, Hovy (2018),
"SPINE: SParse Interpretable Neural Embeddings", AAAI).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.io import (
    check_digests,
    check_finite,
    load_csr,
    read_json,
    record_digests,
    save_csr,
    write_json,
)
from sparsemm.words.vectors import read_words, write_words

SPARSE_WORD_VECTORS_FORMAT = "sparsemm.sparse_word_vectors"
FORMAT_VERSION = 1


_FILES = ("words.txt", "vectors.npz")  # checksummed in the manifest


class SparseWordVectors:
    """Words with sparse codes: ``matrix`` is a float32 CSR ``(n_words, hidden)``.

    Saved as a folder ``words.txt`` + ``vectors.npz`` (scipy CSR, loaded without pickle) +
    ``manifest.json``.
    """

    def __init__(self, words: Sequence[str], matrix: sp.spmatrix | sp.sparray) -> None:
        csr = sp.csr_matrix(matrix, dtype=np.float32)
        if len(words) != csr.shape[0]:
            raise SparsemmError(f"{len(words)} words but {csr.shape[0]} rows in the matrix")
        self.words: list[str] = list(words)
        self.matrix: sp.csr_matrix = csr
        self.index: dict[str, int] = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise SparsemmError("duplicate words in the sparse vocabulary; words must be unique")

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __repr__(self) -> str:
        return f"SparseWordVectors(n={len(self)}, dim={self.dim}, nnz={self.matrix.nnz})"

    def row(self, word: str) -> np.ndarray:
        """The dense ``(hidden,)`` code of ``word``; SparsemmError when unknown."""
        i = self.index.get(word)
        if i is None:
            raise SparsemmError(f"word {word!r} is not in the SPINE vocabulary")
        return np.asarray(self.matrix[i].toarray()).ravel()

    def save(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if not np.isfinite(self.matrix.data).all():
            raise SparsemmError(f"refusing to save NaN or inf sparse word vectors to {out}")
        write_words(out / "words.txt", self.words)
        save_csr(out / "vectors.npz", self.matrix)
        write_json(
            out / "manifest.json",
            {
                "format": SPARSE_WORD_VECTORS_FORMAT,
                "version": FORMAT_VERSION,
                "n_words": len(self),
                "dim": self.dim,
                "nnz": int(self.matrix.nnz),
                "sha256": record_digests(out, list(_FILES)),
            },
        )
        return out

    @classmethod
    def load(cls, in_dir: str | Path) -> SparseWordVectors:
        """Load a folder written by ``save``; a ``sparsemm spine train`` run folder works too
        (its codes are in ``vectors/``)."""
        d = Path(in_dir)
        if not (d / "manifest.json").is_file() and (d / "vectors" / "manifest.json").is_file():
            d = d / "vectors"
        manifest = read_json(d / "manifest.json")
        if manifest.get("format") != SPARSE_WORD_VECTORS_FORMAT:
            raise SparsemmError(
                f"{d} is not a saved sparse word-vector folder (format {manifest.get('format')!r})"
            )
        if int(manifest.get("version", 0)) > FORMAT_VERSION:
            raise SparsemmError(f"{d} was written by a newer sparsemm; upgrade sparsemm")
        remedy = "re-create it with `sparsemm spine train`"
        check_digests(d, manifest.get("sha256"), list(_FILES), remedy)
        matrix = load_csr(d / "vectors.npz")
        check_finite(matrix.data, d / "vectors.npz", remedy)
        return cls(read_words(d / "words.txt", expected=matrix.shape[0]), matrix)
