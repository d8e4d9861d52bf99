"""Dimension names and their label precision@k, on a fixture whose answers are worked out by
hand."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sparsemm.query.naming import template_terms, top_share_names
from sparsemm.text import CaptionIndex

# 8 items; every caption shares the template "a grid of photos"; dim 0 = dogs, dim 1 = cats,
# dim 2 = nothing active.
CAPTIONS = [
    ["a grid of photos with a dog"],
    ["a grid of photos with two dogs"],
    ["a grid of photos with a dog and a ball"],
    ["a grid of photos with a cat"],
    ["a grid of photos with a cat and a ball"],
    ["a grid of photos with cats"],
    ["a grid of photos with a hot dog"],
    ["a grid of photos with a ball"],
]
LABELS = [["dog"], ["dog"], ["dog", "ball"], ["cat"], ["cat", "ball"], ["cat"], [], ["ball"]]
CODES = sp.csr_matrix(
    np.array(
        [
            [0.9, 0.0, 0.0],
            [0.8, 0.0, 0.0],
            [0.7, 0.1, 0.0],
            [0.0, 0.9, 0.0],
            [0.1, 0.8, 0.0],
            [0.0, 0.7, 0.0],
            [0.6, 0.0, 0.0],  # a hot dog item, high on the dog dim: a naming trap
            [0.0, 0.0, 0.0],
        ],
        np.float32,
    )
)
TERMS = ["dog", "cat", "ball", "grid", "photo", "hot dog"]


def test_template_words_never_name_a_dimension() -> None:
    idx = CaptionIndex(CAPTIONS, LABELS)
    assert template_terms(idx, TERMS, 0.4) == {"grid", "photo"}
    names = top_share_names(CODES, idx, TERMS, k=3, min_df=1)
    assert names[0][0] == "dog" and names[1][0] == "cat" and names[2] == []
    assert not {"grid", "photo"} & {w for n in names for w in n}
