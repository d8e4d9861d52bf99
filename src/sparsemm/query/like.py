"""'More like this, but not X': a picture's code as the include side of a query.

A like-target is an item of the collection (its stored code) or an image (embedded and
coded as an item is). :func:`like_term` pins its code under a pseudo include term
("like: LABEL") while a search runs, so it is ranked by the same scorer and index path as
a text query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.sources import text_name
from sparsemm.errors import SparsemmError
from sparsemm.query.hits import Hit
from sparsemm.query.request import MATCH_THRESHOLD
from sparsemm.query.strategies.match import LIKE_PREFIX

if TYPE_CHECKING:
    from sparsemm.query.handle import IndexedCollection


def image_code(h: IndexedCollection, image: Any) -> np.ndarray:
    """(d,) item code of a query image (a path or PIL image): embedded with the
    collection's image encoder, then coded as :meth:`CodeModel.encode_items` codes an
    item (SR: the image side; VDR: spatial features; ImageNet concepts: the classifier
    head)."""
    try:
        code = h.model.encode_query_images([image], h.image_encoder)
    except SparsemmError:
        raise
    except Exception as exc:  # a corrupt or unreadable image file
        raise SparsemmError(f"could not read the query image: {exc}") from exc
    return np.asarray(sp.csr_matrix(code).toarray()[0], dtype=np.float32)


def like_code(h: IndexedCollection, like: Any) -> tuple[str, np.ndarray]:
    """(label, (d,) code) of a "more like this" target: an item id of the collection
    (its stored code from the index) or an image file."""
    if isinstance(like, str) and not Path(like).is_file():
        row = h.row_of(like)
        code = np.asarray(h.item_code(row).toarray()[0], dtype=np.float32)
        return f"item {h.collection.ids[row]}", code
    if isinstance(like, str | Path) and not Path(like).is_file():
        raise SparsemmError(f"query image not found: {like}")
    name = text_name(Path(like).name) if isinstance(like, str | Path) else "uploaded image"
    return f"image {name}", image_code(h, like)


@contextlib.contextmanager
def like_term(h: IndexedCollection, like: Any) -> Iterator[str]:
    """A pseudo include term ("like: LABEL") whose query code is ``like``'s code (see
    :func:`like_code`) while the block runs; removed afterwards, so a typed query never
    meets it. Not thread-safe: the web service holds its lock around it."""
    label, code = like_code(h, like)
    if not np.any(code):
        raise SparsemmError(f"the {label} has an empty code: nothing to search like it")
    term = f"{LIKE_PREFIX}{label}"
    h.text_context  # noqa: B018 (built, so the code is pinned where searches read it)
    ctxs = h.built_contexts()
    for ctx in ctxs:
        ctx.pin_query_code(term, code)
    try:
        yield term
    finally:  # the full context may have been built meanwhile: clear it too
        for late in (*h.built_contexts(), *ctxs):
            late.pin_query_code(term, None)


def without_excluded_self(hits: list[Hit], own: int) -> list[Hit]:
    """The hits of "more like item X, but not B" without X (collection row ``own``)
    when X likely carries an excluded term (its own code matches itself best, so it
    came first regardless)."""
    return [
        h
        for h in hits
        if not (
            h.row == own
            and any(e.side == "exclude" and e.value >= MATCH_THRESHOLD for e in h.evidence)
        )
    ]
