"""What a new user met in the first hour with a folder of photos (docs/reliability.md, "The
first hour"): evidence that reads as what it is, readable concept names, ..."""

from __future__ import annotations

from sparsemm.models.concepts import dimension_names
from sparsemm.query.hits import TermEvidence
from sparsemm.query.request import evidence_text


def test_an_excluded_term_reads_as_the_chance_the_item_shows_it() -> None:
    """ "not dogs 0.00" read as "no chance of no dog"; the value is P(dog | item)."""
    assert TermEvidence("dogs", "exclude", "classifier", 0.0).text == "dogs 0% (left out)"
    assert TermEvidence("cat", "exclude", "classifier", 0.891).text == "cat 89% (left out)"
    assert TermEvidence("dog", "include", "detector", 0.934).text == "dog 93%"
    assert TermEvidence("cat", "exclude", "detector", 0.004).text == "cat <1% (left out)"
    # no probability for the word: a code similarity keeps its own scale
    assert evidence_text("zebra", "include", "code similarity", 0.4219) == "zebra 0.42"
    # a "more like this" picture's similarity
    assert evidence_text("like: image x.jpg", "include", "picture similarity", 0.48) == (
        "like it 48%"
    )


def test_imagenets_two_cranes_have_readable_names() -> None:
    names = dimension_names(
        ["crane", "crane", "maillot", "maillot, tank suit", "tabby, tabby cat"],
        ["n02012849", "n03126707", "n03710637", "n03710721", "n02123045"],
    )
    assert names == ["crane (bird)", "crane (machine)", "maillot (tights)",
                     "maillot (tank suit)", "tabby"]  # fmt: skip
    assert not any("class" in n for n in names)
