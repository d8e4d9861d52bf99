"""Query parsing: the phrasings people type, malformed input, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsemm.errors import SparsemmError
from sparsemm.query.parse import MAX_QUERY_CHARS, Query, parse_query

CASES = [
    # (typed text, include, exclude)
    ("sports but not basketball", ["sports"], ["basketball"]),
    ("dog without cat", ["dog"], ["cat"]),
    ("pizza -person", ["pizza"], ["person"]),
    ("kitchen, no person, no oven", ["kitchen"], ["person", "oven"]),
    ("cat and dog but not bird", ["cat", "dog"], ["bird"]),
    ("beach not umbrella", ["beach"], ["umbrella"]),
    ("a photo of a dog, excluding cats", ["dog"], ["cats"]),
    ("pizza with no person", ["pizza"], ["person"]),
    ("car except truck", ["car"], ["truck"]),
    ("car except for truck", ["car"], ["truck"]),
    ("dog NOT cat", ["dog"], ["cat"]),
    ("dog AND NOT cat", ["dog"], ["cat"]),
    ("dog, NOT cat", ["dog"], ["cat"]),
    ("NOT cat, dog", ["dog"], ["cat"]),
    ("no people, beach", ["beach"], ["people"]),
    ("no people, beach, no umbrella", ["beach"], ["people", "umbrella"]),
    ('pizza -"hot dog"', ["pizza"], ["hot dog"]),
    ("pizza -\u201chot dog\u201d", ["pizza"], ["hot dog"]),
    ('"black and white" photo -cat', ["black and white", "photo"], ["cat"]),
    ("hot dog -person", ["hot dog"], ["person"]),
    # '-' takes one word; the words after it are included again.
    ("pizza -person dining table", ["pizza", "dining table"], ["person"]),
    ("dog - cat", ["dog"], ["cat"]),
    ("dog --cat", ["dog"], ["cat"]),
    ("t-shirt -jeans", ["t-shirt"], ["jeans"]),
    # An exclusion keyword's scope runs to the end ...
    ("dog but not cat, bird", ["dog"], ["cat", "bird"]),
    ("dog but not cat or bird", ["dog"], ["cat", "bird"]),
    ("dog without cat nor bird", ["dog"], ["cat", "bird"]),
    # ... unless a plain 'but' closes it.
    ("dog without cat but with grass", ["dog", "grass"], ["cat"]),
    ("dog without cat but also grass", ["dog", "grass"], ["cat"]),
    ("dog w/o cat", ["dog"], ["cat"]),
    ("dog minus cat", ["dog"], ["cat"]),
    ("dog without any cats", ["dog"], ["cats"]),
    ("dog & cat + bird", ["dog", "cat", "bird"], []),
    ("dog; cat", ["dog", "cat"], []),
    # 'with' and 'or' outside an exclusion scope stay inside the phrase.
    ("dog with frisbee", ["dog with frisbee"], []),
    ("dog or cat", ["dog or cat"], []),
    ("  Hot   DOG  ", ["hot dog"], []),
    ("Dog. Without: Cat!", ["dog"], ["cat"]),
    ("the pictures of the beach", ["beach"], []),
    ('"a photo of a dog"', ["a photo of a dog"], []),
    ("dog -cat -cat, without cat", ["dog"], ["cat"]),
    ("dog, dog, DOG", ["dog"], []),
    ("dog -no", ["dog"], ["no"]),
    ('"not" -"but"', ["not"], ["but"]),
]


@pytest.mark.parametrize(("text", "include", "exclude"), CASES)
def test_phrasings(text: str, include: list[str], exclude: list[str]) -> None:
    q = parse_query(text)
    assert q == Query(tuple(include), tuple(exclude))
    assert parse_query(q.text) == q


def test_text_form() -> None:
    q = parse_query('Hot dog and cat but not person, "dining table"')
    assert q.text == 'hot dog, cat -person -"dining table"'
    assert str(q) == q.text
    # Words that would be read as operators are quoted.
    assert Query(("no", "a cat"), ("-x",)).text == '"no", "a cat" -"-x"'


def test_exclude_argument_merged_and_deduplicated() -> None:
    q = parse_query("dog but not cat", exclude=["Cat", "the bird, hot dog", " Bird "])
    assert q.exclude == ("cat", "bird", "hot dog")
    assert parse_query("dog", exclude="cat").exclude == ("cat",)
    assert parse_query("dog", exclude=['"hot" dog']).exclude == ("hot dog",)
    assert parse_query(q.text) == q


MALFORMED = [
    ("", "empty query"),
    ("   \t\n", "empty query"),
    ("???", "no search term"),
    ("a photo of", "no search term"),
    ("not cat", "only excludes"),
    ("-cat", "only excludes"),
    ('-"hot dog"', "only excludes"),
    ("without cat and dog", "only excludes"),
    ("dog but not", "'but not' is not followed"),
    ("dog without", "'without' is not followed"),
    ("dog without a", "'without' is not followed"),
    ("no, dog", "'no' is not followed"),
    ("dog but not but cat", "'but not' is not followed"),
    ("-", "'-' must be followed"),
    ("dog -", "'-' must be followed"),
    ("dog -, cat", "'-' must be followed"),
    ('dog -""', "'-' must be followed"),
    ('dog -"cat', "unbalanced double quote"),
    ("dog but not dog", "both included and excluded"),
    ("dog, cat -dog -cat", "'dog', 'cat' are both included"),
    ("x" * (MAX_QUERY_CHARS + 1), "limit is 512"),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED)
def test_malformed(text: str, message: str) -> None:
    with pytest.raises(SparsemmError, match=message):
        parse_query(text)


def test_malformed_exclude_argument() -> None:
    with pytest.raises(SparsemmError, match="both included and excluded"):
        parse_query("dog", exclude=["Dog"])
    with pytest.raises(SparsemmError, match="empty excluded term"):
        parse_query("dog", exclude=[" , "])
    with pytest.raises(SparsemmError, match="must be text"):
        parse_query("dog", exclude=[3])  # type: ignore[list-item]
    with pytest.raises(SparsemmError, match="must be text"):
        parse_query(None)  # type: ignore[arg-type]
    with pytest.raises(SparsemmError, match="only excludes"):
        parse_query(" . ", exclude=["cat"])


def test_query_validates_direct_construction() -> None:
    with pytest.raises(SparsemmError, match="at least one include"):
        Query((), ("cat",))
    with pytest.raises(SparsemmError, match="both included and excluded"):
        Query(("cat",), ("cat",))
    with pytest.raises(SparsemmError, match="bad include term"):
        Query(("",))
    with pytest.raises(SparsemmError, match="not one string"):
        Query("dog")  # type: ignore[arg-type]
    assert Query(["dog"], ["cat"]).include == ("dog",)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ properties

_PIECES = st.sampled_from(
    [
        "dog", "Cat", "hot dog", "a", "the", "photo of", "but", "not", "no", "without",
        "except", "for", "and", "or", "nor", "with", "w/o", ",", ";", "&", "+", "-", "--",
        '"', '"hot dog"', '""', "t-shirt", "?", ".", "  ", "\u201c", "\u2212", "İ", "ß",
        "also", "any", "minus", "excluding",
    ]
)  # fmt: skip
_GRAMMARISH = st.lists(_PIECES, max_size=14).map(" ".join)


def _parse_or_none(text: str, exclude: list[str] | None = None) -> Query | None:
    try:
        return parse_query(text, exclude or ())
    except SparsemmError:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=600) | _GRAMMARISH, st.lists(st.text(max_size=20), max_size=3))
def test_only_sparsemm_errors_and_round_trip(text: str, exclude: list[str]) -> None:
    q = _parse_or_none(text, exclude)  # any other exception fails the test
    if q is not None:
        assert q.include
        assert not set(q.include) & set(q.exclude)
        assert parse_query(q.text) == q


@settings(max_examples=300, deadline=None)
@given(_GRAMMARISH)
def test_round_trip_on_operator_soup(text: str) -> None:
    q = _parse_or_none(text)
    if q is not None:
        again = parse_query(q.text)
        assert again == q
        assert again.text == q.text
