"""Measuring dimension names (label precision@k) and the namings measured against the served
one, on fixtures whose answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from fakes import NAMING_CAPTIONS, NAMING_CODES, NAMING_LABELS, NAMING_TERMS
from sparsemm.text import CaptionIndex
from sparsemm_experiments.naming import concept_names, dimension_labels, label_precision

CAPTIONS, LABELS, TERMS = NAMING_CAPTIONS, NAMING_LABELS, NAMING_TERMS
CODES = sp.csr_matrix(NAMING_CODES)


def test_the_mutual_information_naming_skips_template_words() -> None:
    names = concept_names(CODES, CaptionIndex(CAPTIONS, LABELS), TERMS, min_df=1)
    assert names[0][0] == "dog" and names[1][0] == "cat" and names[2] == []
    assert not {"grid", "photo"} & {w for n in names for w in n}


def test_label_precision_by_hand() -> None:
    """dim 0's top 3 items are 0, 1, 2 (all mention 'dog'); top 5 adds 6 (a hot dog:
    captions say 'hot dog', whose tokens hold 'dog', so it counts) and 4 (cat, ball: no).
    dim 1's top 3 are 3, 4, 5 (all cats), top 5 adds 2 (dog, no). dim 2 is unused."""
    idx = CaptionIndex(CAPTIONS, LABELS)
    names = [["dog"], ["cat"], ["ball"]]
    assert label_precision(CODES, idx, names, k=3) == (1.0, 1.0)
    prec, cov = label_precision(CODES, idx, names, k=5)
    assert np.isclose(prec, (4 / 5 + 3 / 4) / 2) and cov == 1.0  # dim 1 has 4 active items
    # an unnamed used dim scores 0 and lowers coverage
    prec, cov = label_precision(CODES, idx, [["ball"], [], []], k=3)
    assert np.isclose(prec, (1 / 3 + 0.0) / 2) and cov == 0.5


def test_dimension_labels_lift() -> None:
    codes = sp.csr_matrix(np.array([[1, 0], [1, 0], [0, 1], [0, 1], [0, 1]], np.float32))
    caps = [["a dog"], ["dog park"], ["a cat"], ["cat sofa"], ["cat"]]
    labels = dimension_labels(codes, caps, top=2, min_df=1)
    assert labels[0][0] == "dog" and labels[1][0] == "cat"
