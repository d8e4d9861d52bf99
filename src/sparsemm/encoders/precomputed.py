"""Embeddings computed elsewhere: a ``.npy`` ``(n, d)`` table looked up by id.

``encode_text(keys)`` / ``encode_image(keys)`` return the rows of the given ids, so any
encoder that can write a matrix plus an id list (one id per row) plugs into sparsemm.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.encoders.base import ImageInput, l2_normalize, register_encoder
from sparsemm.errors import SparsemmError
from sparsemm.io import load_npy
from sparsemm.linalg import check_embeddings

_MODALITIES = ("text", "image")


def read_ids(path: str | Path) -> list[str]:
    """Ids from a ``.json`` list or a text file with one id per line (blank lines skipped)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise SparsemmError(f"id file not found: {path}")
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise SparsemmError(f"{path} is not valid JSON ({exc})") from exc
        if not isinstance(data, list):
            raise SparsemmError(f"{path} must hold a JSON list of ids, one per embedding row")
        return [str(x) for x in data]
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


def find_ids_file(npy: Path) -> Path | None:
    """The id file beside ``X.npy``: ``X.ids.txt``, ``X.ids.json``, ``X.txt`` or ``X.json``."""
    for name in (f"{npy.stem}.ids.txt", f"{npy.stem}.ids.json", f"{npy.stem}.txt"):
        if (npy.parent / name).is_file():
            return npy.parent / name
    candidate = npy.parent / f"{npy.stem}.json"
    return candidate if candidate.is_file() else None


class PrecomputedEncoder:
    """Row lookup in a precomputed ``(n, d)`` table (ids parallel to the rows).

    ``embeddings`` is an array or a ``.npy`` path; ``ids`` a list, a ``.txt`` (one per line)
    or ``.json`` list file, or ``None`` to use the id file beside the ``.npy`` (see
    :func:`find_ids_file`). ``modalities`` limits which of ``encode_text``/``encode_image``
    are served (both by default; keys are ids either way).
    """

    modalities: tuple[str, ...]
    keys_are_ids = True  # encode_items passes item ids, not image paths, as image keys

    def __init__(
        self,
        embeddings: np.ndarray | str | Path,
        ids: Sequence[str] | str | Path | None = None,
        modalities: Sequence[str] = _MODALITIES,
        name: str = "precomputed",
    ) -> None:
        source = None
        if isinstance(embeddings, str | Path):
            source = Path(embeddings).expanduser()
            arr = load_npy(source)
        else:
            arr = np.asarray(embeddings)
        what = f"precomputed embeddings{f' {source}' if source else ''}"
        self.embeddings_ = check_embeddings(arr, None, what)
        if ids is None:
            ids_file = find_ids_file(source) if source is not None else None
            if ids_file is None:
                raise SparsemmError(
                    f"{what}: no ids given; pass ids or write one id per row to "
                    f"{source.with_suffix('.ids.txt') if source else 'an ids .txt file'}"
                )
            ids = ids_file
        self.ids_ = read_ids(ids) if isinstance(ids, str | Path) else [str(i) for i in ids]
        if len(self.ids_) != len(self.embeddings_):
            raise SparsemmError(
                f"{what}: {len(self.ids_)} ids for {len(self.embeddings_)} rows; they must match"
            )
        self.index_ = {key: row for row, key in enumerate(self.ids_)}
        if len(self.index_) != len(self.ids_):
            dup = sorted(k for k, c in Counter(self.ids_).items() if c > 1)[:5]
            raise SparsemmError(f"{what}: duplicate ids {dup}; ids must be unique")
        bad = [m for m in modalities if m not in _MODALITIES]
        if bad or not modalities:
            raise SparsemmError(f"modalities must be a subset of {_MODALITIES}, got {bad}")
        self.modalities = tuple(modalities)
        self.name = name
        self.model_id = str(source) if source else "array"
        self.dim = int(self.embeddings_.shape[1])

    def lookup(self, keys: Sequence[Any], normalize: bool = True) -> np.ndarray:
        """Rows for ``keys`` -> float32 ``(len(keys), dim)`` (unknown id -> SparsemmError)."""
        keys = [str(k) for k in keys]
        missing = [k for k in keys if k not in self.index_]
        if missing:
            shown = ", ".join(repr(k) for k in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise SparsemmError(
                f"{len(missing)} id(s) not in the precomputed table ({self.model_id}): "
                f"{shown}{more}; add their rows or drop those items"
            )
        rows = np.asarray([self.index_[k] for k in keys], dtype=np.int64)
        out = np.asarray(self.embeddings_[rows], dtype=np.float32).reshape(len(keys), self.dim)
        return l2_normalize(out) if normalize else out

    def _check(self, modality: str) -> None:
        if modality not in self.modalities:
            raise SparsemmError(
                f"this precomputed encoder serves {'/'.join(self.modalities)} only, not {modality}"
            )

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        """Rows for the ids in ``texts`` -> float32 ``(len(texts), dim)``."""
        self._check("text")
        return self.lookup(texts, normalize=normalize)

    def encode_image(
        self,
        images: Sequence[ImageInput],
        batch_size: int = 32,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        """Rows for the ids in ``images`` -> float32 ``(len(images), dim)``."""
        self._check("image")
        return self.lookup(images, normalize=normalize)


@register_encoder("precomputed")
def _make_precomputed(
    model: str | Path | None = None,
    embeddings: np.ndarray | str | Path | None = None,
    ids: Sequence[str] | str | Path | None = None,
    modalities: Sequence[str] = _MODALITIES,
) -> PrecomputedEncoder:
    """Registry factory: ``model`` is an alias of ``embeddings`` (the ``.npy`` path)."""
    table = embeddings if embeddings is not None else model
    if table is None:
        raise SparsemmError(
            "the precomputed encoder needs an embeddings .npy file (e.g. --model emb.npy with "
            "emb.ids.txt beside it)"
        )
    return PrecomputedEncoder(table, ids, modalities=modalities)
