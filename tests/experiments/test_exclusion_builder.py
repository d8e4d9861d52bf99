"""Exclusion benchmark builder on a toy label set, and the COCO reference counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sparsemm.errors import SparsemmError
from sparsemm_experiments.eval.exclusion import build_exclusion_queries, hard_mask, query_matrices

# item: labels                 counts: dog 5 (0,1,2,4,6), cat 3 (0,3,4), person 3 (2,5,7),
TOY = [  #                              kite 1 (7)
    ["dog", "cat"],  # 0
    ["dog"],  # 1
    ["dog", "person"],  # 2
    ["cat"],  # 3
    ["cat", "dog"],  # 4
    ["person"],  # 5
    ["dog", "dog"],  # 6 (a repeated label counts once)
    ["kite", "person"],  # 7
]
# Ordered pairs sharing an item (both = |A and B|), relevant = A without B, hard = both/|A|:
#   (cat, dog)     both 2, rel {3},          2/3 = 0.67 -> hard
#   (dog, cat)     both 2, rel {1, 2, 6},    2/5 = 0.40 -> hard
#   (dog, person)  both 1, rel {0, 1, 4, 6}, 1/5 = 0.20 -> easy
#   (person, dog)  both 1, rel {5, 7},       1/3 = 0.33 -> hard
#   (person, kite) both 1, rel {2, 5},       1/3 = 0.33 -> hard
#   (kite, person) both 1, rel {} (the only kite item has a person) -> dropped
# Every other pair shares no item -> dropped.
EXPECTED = [
    ("cat", "dog", [3], True),
    ("dog", "cat", [1, 2, 6], True),
    ("dog", "person", [0, 1, 4, 6], False),
    ("person", "dog", [5, 7], True),
    ("person", "kite", [2, 5], True),
]


def test_toy_queries() -> None:
    queries = build_exclusion_queries(TOY)
    got = [(q.a, q.b, q.relevant.tolist(), q.hard) for q in queries]
    assert got == EXPECTED
    dog_cat = queries[1]
    assert dog_cat.a_items.tolist() == [0, 1, 2, 4, 6]
    assert dog_cat.b_items.tolist() == [0, 3, 4]
    assert dog_cat.n_both == 2
    assert dog_cat.text == "dog but not cat"
    assert dog_cat.relevant.dtype == np.int64
    assert hard_mask(queries).tolist() == [True, True, False, True, True]


def test_thresholds() -> None:
    # hard_threshold 0.4: (dog, cat) 0.40 stays hard (>=), (person, *) 1/3 does not.
    hard = [(q.a, q.b) for q in build_exclusion_queries(TOY, hard_threshold=0.4) if q.hard]
    assert hard == [("cat", "dog"), ("dog", "cat")]
    # min_both 2: only the dog/cat pairs share two items.
    assert [(q.a, q.b) for q in build_exclusion_queries(TOY, min_both=2)] == [
        ("cat", "dog"),
        ("dog", "cat"),
    ]


def test_query_matrices() -> None:
    queries = build_exclusion_queries(TOY)
    rel, a, b = query_matrices(queries, len(TOY))
    assert rel.shape == (5, 8)
    assert np.flatnonzero(rel[1]).tolist() == [1, 2, 6]
    assert np.flatnonzero(a[1]).tolist() == [0, 1, 2, 4, 6]
    assert np.flatnonzero(b[1]).tolist() == [0, 3, 4]
    assert (rel == (a & ~b)).all()


def test_builder_errors() -> None:
    assert build_exclusion_queries([]) == []
    with pytest.raises(SparsemmError, match="list of label names"):
        build_exclusion_queries(["dog", "cat"])
    with pytest.raises(SparsemmError, match="not a string"):
        build_exclusion_queries("dog")
    with pytest.raises(SparsemmError, match="min_both"):
        build_exclusion_queries(TOY, min_both=0)
    with pytest.raises(SparsemmError, match="hard_threshold"):
        build_exclusion_queries(TOY, hard_threshold=1.5)


COCO = Path("/work/shared/data/coco/val2017.json")


@pytest.mark.skipif(not COCO.is_file(), reason=f"COCO labels not available at {COCO}")
def test_coco_test_split_reference_counts() -> None:
    data = json.loads(COCO.read_text())
    labels = [item["labels"] for item in data.values() if item["split"] == "test"]
    assert len(labels) == 950
    queries = build_exclusion_queries(labels)
    assert len(queries) == 1979  # docs/negation.md: 1,979 pairs, 263 hard
    assert int(hard_mask(queries).sum()) == 263
    assert all(len(q.relevant) > 0 and q.n_both >= 1 for q in queries)
