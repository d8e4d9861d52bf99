"""The one Markdown-table helper of the reports."""

from __future__ import annotations

import pytest

from sparsemm_experiments.eval.tables import md_table


def test_md_table_lines_by_hand() -> None:
    got = md_table(["method", "AP@10", "n"], [("hybrid", "0.688", 3), ("filter", "-", 10)], "lrr")
    assert got == [
        "| method | AP@10 | n |",
        "|---|---:|---:|",
        "| hybrid | 0.688 | 3 |",
        "| filter | - | 10 |",
    ]
    assert md_table(["a", "b"], []) == ["| a | b |", "|---|---|"]


def test_md_table_refuses_ragged_rows_and_bad_alignment() -> None:
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        md_table(["a", "b", "c"], [(1, 2)])
    with pytest.raises(ValueError, match="align"):
        md_table(["a", "b"], [], "l")
    with pytest.raises(ValueError, match="align"):
        md_table(["a", "b"], [], "lc")
