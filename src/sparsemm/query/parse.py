"""Parse typed search text into a :class:`Query` of include and exclude terms.

Two kinds of input are understood, and may be mixed:

Label-style queries (short terms and operators)::

    sports but not basketball          dog without cat          beach not umbrella
    pizza -person                      pizza -"hot dog"         car except truck
    kitchen, no person, no oven        pizza with no person     dog AND NOT cat
    cat and dog but not bird           a photo of a dog, excluding cats

Sentences with negation, as people write them::

    A man is making pizzas in a kitchen, but there is no chair in sight.
    There is no horse in the image. A herd of cattle grazing.
    No car is present in the image, where a person skates
    A bus on a street; noticeably absent is any traffic light.
    A living room devoid of people          a beach with nobody around
    no people          photos without text          (exclusion only: ranked by absence)

Rules, in the order they matter:

* ``"..."`` (straight or curly double quotes) keeps its content as one term, verbatim apart
  from case, whitespace and punctuation at its two ends. A stray, unbalanced quote is
  ignored (captions contain them).
* ``-term`` / ``-"a phrase"`` (a ``-`` at the start of a word) excludes exactly the next word
  or quoted phrase, search-engine style; the words after it are included again. A ``-``
  inside a word (``t-shirt``) is part of the word.
* **Prefix negation cues** open an exclusion of the noun phrase that follows them: ``no``,
  ``not``, ``without``, ``except (for)``, ``other than``, ``apart from``, ``aside from``,
  ``excluding``, ``exclude``, ``minus``, ``w/o``,
  ``lacks``/``lacking``/``lack of``, ``devoid of``, ``free of``/``free from``, ``empty of``,
  ``absence of``, ``no sign/trace of``, ``isn't``/``aren't``, ``doesn't have/contain/show``,
  ``not wearing/holding/...``, and the inverted ``absent is any X`` / ``missing: X``.
  Determiners after a cue are skipped (``without any``, ``not a single``). Words that only
  set up the cue are dropped from the include (``there is no``, ``the image has no``,
  ``with no``).
* **Postfix cues** exclude the noun phrase just before them: ``X is absent``, ``missing``,
  ``nowhere to be seen``, ``not present``, ``not visible``, ``not in sight``, ``out of
  sight``.
* **Person cues** exclude ``person``: ``nobody``, ``no one``, ``unoccupied``,
  ``uninhabited``, ``deserted``, ``unpopulated``.
* The excluded noun phrase is at most three words and ends before a preposition, a verb,
  a clause word or punctuation (``no dining table in the room`` -> ``dining table``); an
  -ing or -ed word that starts a WordNet noun stays in it (``not parking meter``, ``not
  living thing``). ``anything other than cats`` excludes cats and includes nothing.
  Presence filler after it is dropped: ``in the image``, ``in sight``, ``to be seen``,
  ``in the scene``, ``is visible``, ``anywhere``, ``at all``... A list continues the
  exclusion: ``no dogs or cats``, ``dog but not cat, bird`` (a comma continues only when the
  exclusion did not open the query: ``no people, beach`` includes beach).
* The include is what remains. Split on ``,`` ``;`` ``&`` ``+``, ``and`` and sentence ends,
  the pieces are *terms* when each has at most three words (``cat and dog`` -> cat, dog),
  else the remaining text is kept whole as one *phrase*, the form a similarity scorer needs
  (``man is making pizzas in a kitchen``). Leading articles and "<photo|picture|...> of"
  are stripped; plurals are kept as typed (matching them is the searcher's job).
  Alternatives joined by ``or`` are one term, their articles dropped (``a cat or a dog``
  -> ``cat or dog``; a model reads it as the union of both); after a cue ``or`` lists
  exclusions instead (``but not cats or dogs`` excludes both).
* A request ("show me", "I'm looking for", "can you find me") is dropped from the start of
  an include term and from the start of an excluded one (``a cat but not show me dogs``
  excludes dogs); a one-word request after a cue stays (``no show dogs``).
* ``exclude=`` values (the CLI's ``--exclude``) are added to the excluded terms; a value may
  hold several comma-separated terms. Duplicates are dropped, first occurrence wins.
* Control characters count as spaces and invisible format characters are dropped.

A query may include nothing and only exclude (``no people``): a searcher then ranks items by
the absence of what is excluded. Malformed input raises :class:`~sparsemm.errors.SparsemmError`:
an empty query, a query with no term at all, a term both included and excluded, a ``-`` or
cue with no term after it, or more than ``MAX_QUERY_CHARS`` characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparsemm.errors import SparsemmError
from sparsemm.query.cues import MAX_LABEL_WORDS, MAX_TERM_WORDS
from sparsemm.query.text_parser import (
    QUOTES,
    clean_text,
    normalize_term,
    split_query,
    strip_filler,
)

MAX_QUERY_CHARS = 512
_VALUE_SPLIT_RE = re.compile(r"[,;]")
_EXAMPLE = "e.g. 'dog but not cat', 'pizza -person' or 'people, no dogs'"


@dataclass(frozen=True)
class Query:
    """Terms to find (``include``) and terms whose items to leave out (``exclude``).

    Terms are normalised strings (lower-case, single spaces). An include term is a label
    ("dog", "hot dog") or, for a sentence, the whole positive phrase. ``include`` may be
    empty when ``exclude`` is not (rank by absence). ``text`` renders the query back in the
    canonical ``include, include -exclude -"multi word"`` form, and
    ``parse_query(q.text) == q`` for every parsed query.
    """

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "include", _check_terms(self.include, "include"))
        object.__setattr__(self, "exclude", _check_terms(self.exclude, "exclude"))
        if not self.include and not self.exclude:
            raise SparsemmError("a query needs at least one term to include or exclude")
        both = sorted(set(self.include) & set(self.exclude))
        if both:
            raise SparsemmError(
                f"{_is_are(both)} both included and excluded; remove it from one side"
            )

    @classmethod
    def empty(cls) -> Query:
        """A query with no terms, which typed text never gives: the exclusions of a "more
        like this" search that leaves nothing out, or an explanation of an item's own
        concepts."""
        q = object.__new__(cls)
        object.__setattr__(q, "include", ())
        object.__setattr__(q, "exclude", ())
        return q

    @property
    def text(self) -> str:
        """The canonical text form, e.g. ``hot dog, cat -person -"dining table"``."""
        many = len(self.include) > 1
        inc = [_render(t, many=many) for t in self.include]
        plain_words = sum(len(r.split(" ")) for r in inc if not r.startswith('"'))
        if many and plain_words > MAX_LABEL_WORDS:
            inc = [f'"{t}"' for t in self.include]  # read back as terms, not one phrase
        parts = [", ".join(inc)] if inc else []
        parts += [f"-{_render(t, single_word=True)}" for t in self.exclude]
        return " ".join(parts)

    @property
    def include_text(self) -> str:
        """The include side as one text ("cat and dog"; "" when nothing is included)."""
        return " and ".join(self.include)

    def __str__(self) -> str:
        return self.text


def parse_query(text: str, exclude: Sequence[str] = ()) -> Query:
    """Parse ``text`` (see the module docstring for the grammar) plus extra excluded terms.

    Raises SparsemmError for malformed input, with a message saying how to phrase it.
    """
    if not isinstance(text, str):
        raise SparsemmError(f"a query must be text, got {type(text).__name__}")
    if len(text) > MAX_QUERY_CHARS:
        raise SparsemmError(
            f"query is {len(text)} characters long; the limit is {MAX_QUERY_CHARS}. "
            "Shorten it to the few concepts you want and don't want"
        )
    text = clean_text(text)
    if not text.strip() and not exclude:
        raise SparsemmError(f"empty query: type what to search for, {_EXAMPLE}")
    include, excluded = split_query(text)
    excluded += _exclude_values(exclude)
    include = list(dict.fromkeys(include))
    excluded = list(dict.fromkeys(excluded))
    if not include and not excluded:
        raise SparsemmError(f"no search term in {text!r}: type words to search for, {_EXAMPLE}")
    both = [t for t in include if t in set(excluded)]
    if both:
        raise SparsemmError(
            f"{_is_are(both)} both included and excluded in {text!r}; remove it from one side"
        )
    return Query(tuple(include), tuple(excluded))


def _exclude_values(values: Sequence[str] | str) -> list[str]:
    """Normalise extra excluded terms (``--exclude``); a value may list terms with commas."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)):
        raise SparsemmError(f"excluded terms must be a list of text, got {type(values).__name__}")
    out: list[str] = []
    for value in values:
        if not isinstance(value, str):
            raise SparsemmError(f"an excluded term must be text, got {type(value).__name__}")
        if len(value) > MAX_QUERY_CHARS:
            raise SparsemmError(
                f"excluded term is {len(value)} characters long; the limit is {MAX_QUERY_CHARS}"
            )
        # Quotes have no meaning here (the value is already one argument); they would
        # break the rendered text, so they become spaces.
        text = clean_text(value).translate(QUOTES).replace('"', " ").lower()
        terms = [
            normalize_term(strip_filler(normalize_term(p))) for p in _VALUE_SPLIT_RE.split(text)
        ]
        terms = [t for t in terms if t]
        if not terms:
            raise SparsemmError(f"empty excluded term {value!r}: give a word such as 'cat'")
        out += terms
    return out


def _check_terms(terms: Iterable[str], side: str) -> tuple[str, ...]:
    if isinstance(terms, str):
        raise SparsemmError(f"Query.{side} must be a sequence of terms, not one string")
    out = tuple(terms)
    for t in out:
        if not isinstance(t, str) or not t.strip() or '"' in t:
            raise SparsemmError(
                f"bad {side} term {t!r}: terms are non-empty text without double quotes"
            )
    return out


def _is_plain(term: str, many: bool = False) -> bool:
    """True when ``term`` reads back as itself without quotes (alone, or in a list)."""
    if many and len(term.split(" ")) > MAX_TERM_WORDS:
        return False
    try:
        include, exclude = split_query(term)
    except SparsemmError:
        return False
    return include == [term] and not exclude


def _render(term: str, single_word: bool = False, many: bool = False) -> str:
    if single_word:
        plain = " " not in term and _is_plain(term) and not term.startswith(("-", "\u2212"))
        return term if plain else f'"{term}"'
    return term if _is_plain(term, many) else f'"{term}"'


def _listing(terms: Sequence[str]) -> str:
    return ", ".join(f"'{t}'" for t in terms)


def _is_are(terms: Sequence[str]) -> str:
    return f"{_listing(terms)} {'is' if len(terms) == 1 else 'are'}"
