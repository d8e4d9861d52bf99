"""Dimension names and their label precision@k, on a fixture whose answers are worked out by
hand."""

from __future__ import annotations

import scipy.sparse as sp

from fakes import NAMING_CAPTIONS, NAMING_CODES, NAMING_LABELS, NAMING_TERMS
from sparsemm.query.naming import template_terms, top_share_names
from sparsemm.text import CaptionIndex

CAPTIONS, LABELS, TERMS = NAMING_CAPTIONS, NAMING_LABELS, NAMING_TERMS
CODES = sp.csr_matrix(NAMING_CODES)


def test_template_words_never_name_a_dimension() -> None:
    idx = CaptionIndex(CAPTIONS, LABELS)
    assert template_terms(idx, TERMS, 0.4) == {"grid", "photo"}
    names = top_share_names(CODES, idx, TERMS, k=3, min_df=1)
    assert names[0][0] == "dog" and names[1][0] == "cat" and names[2] == []
    assert not {"grid", "photo"} & {w for n in names for w in n}
