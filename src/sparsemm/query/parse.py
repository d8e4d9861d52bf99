"""Parse typed search text into a :class:`Query` of include and exclude terms.

Accepted phrasings (case and whitespace are normalised; terms come out lower-case)::

    sports but not basketball          dog without cat          beach not umbrella
    pizza -person                      pizza -"hot dog"         car except truck
    kitchen, no person, no oven        pizza with no person     dog AND NOT cat
    cat and dog but not bird           a photo of a dog, excluding cats
    no people, beach                   dog without cat but with grass

Rules, in the order they matter:

* ``"..."`` (straight or curly double quotes) keeps its content as one term, verbatim apart
  from case, whitespace and punctuation at its two ends: no splitting, no keyword handling,
  no filler stripping. Quote a term that would otherwise be split (``"black and white"``).
* ``-term`` / ``-"a phrase"`` (a ``-`` at the start of a word) excludes exactly the next word
  or quoted phrase, search-engine style; the words after it are included again
  (``pizza -person table`` = include pizza, table; exclude person). A ``-`` inside a word
  (``t-shirt``) is part of the word.
* Exclusion keywords ``not``, ``no``, ``without``, ``except`` (``except for``),
  ``excluding``, ``exclude``, ``minus``, ``w/o`` open an exclusion scope. ``but``, ``and``,
  ``or``, ``with`` and ``yet`` right before a keyword belong to it (``but not``,
  ``with no``, ``and not``). The scope runs to the end of the query, so
  ``dog but not cat, bird`` excludes both cat and bird; a ``but`` that is not followed by a
  keyword closes it (``dog without cat but with grass`` includes grass). A scope that opens
  the query (``no people, beach``) closes at the first ``,`` / ``;`` / ``&`` / ``+``.
* Terms are split on ``,`` ``;`` ``&`` ``+`` and the word ``and``; inside an exclusion scope
  also on ``or`` and ``nor``. Everything else between those stays one phrase: ``hot dog``,
  ``dining table``, ``dog with frisbee``, ``dog or cat`` (outside an exclusion scope) are
  single terms.
* Leading filler is stripped from unquoted terms: articles (``a``, ``an``, ``the``,
  ``some``, ``any``) and "<photo|picture|image|...> of", so ``a photo of a dog`` -> ``dog``.
  Punctuation at the two ends of a word is dropped (``dog.`` -> ``dog``). Plurals are kept as
  typed (``cats`` stays ``cats``): matching them to a vocabulary is the searcher's job.
* ``exclude=`` values (the CLI's ``--exclude``) are added to the excluded terms; a value may
  hold several comma-separated terms. Duplicates are dropped, first occurrence wins.
* Control characters count as spaces and invisible format characters (zero-width spaces,
  bidirectional overrides) are dropped, so a query of only such characters is empty and no
  term carries them into an error message or a terminal.

Malformed input raises :class:`~sparsemm.errors.SparsemmError`: an empty query, a query with
nothing to include, a term both included and excluded, a ``-`` or keyword with no term after
it, an unbalanced quote, or more than ``MAX_QUERY_CHARS`` characters.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparsemm.errors import SparsemmError

MAX_QUERY_CHARS = 512

# Words that open an exclusion scope.
NEGATIONS = frozenset({"not", "no", "without", "except", "excluding", "exclude", "minus", "w/o"})
# Words absorbed into a following negation: "but not", "with no", "and not".
_CONNECTORS = frozenset({"but", "and", "or", "with", "yet"})
# Separators: always "and"; inside an exclusion scope also "or" / "nor".
_SCOPE_SEPARATORS = frozenset({"or", "nor"})
# After "but" closes an exclusion scope: "but with grass", "but also grass".
_REINCLUDE = frozenset({"with", "also"})
# Unquoted words that must be quoted when a term is rendered back to text.
_SPECIAL_WORDS = NEGATIONS | _CONNECTORS | _SCOPE_SEPARATORS

_ARTICLES = frozenset({"a", "an", "the", "some", "any"})
_MEDIA = frozenset(
    {
        "photo",
        "photos",
        "picture",
        "pictures",
        "image",
        "images",
        "photograph",
        "photographs",
        "pic",
        "pics",
        "shot",
        "shots",
        "snapshot",
    }
)

_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u201e": '"', "\uff02": '"'})
_TOKEN_RE = re.compile(
    r"""
      (?P<space>\s+)
    | "(?P<phrase>[^"]*)"
    | (?P<quote>")
    | (?P<sep>[,;&+])
    | (?P<minus>[-\u2212]+)
    | (?P<word>[^\s,;&+"]+)
    """,
    re.VERBOSE,
)
_VALUE_SPLIT_RE = re.compile(r"[,;]")
_EXAMPLE = "e.g. 'dog but not cat' or 'pizza -person'"


@dataclass(frozen=True)
class Query:
    """Terms to find (``include``) and terms whose items to leave out (``exclude``).

    Terms are normalised strings (lower-case, single spaces). ``text`` renders the query
    back in the canonical ``include, include -exclude -"multi word"`` form, and
    ``parse_query(q.text) == q`` for every parsed query.
    """

    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "include", _check_terms(self.include, "include"))
        object.__setattr__(self, "exclude", _check_terms(self.exclude, "exclude"))
        if not self.include:
            raise SparsemmError("a query needs at least one include term")
        both = sorted(set(self.include) & set(self.exclude))
        if both:
            raise SparsemmError(
                f"{_is_are(both)} both included and excluded; remove it from one side"
            )

    @property
    def text(self) -> str:
        """The canonical text form, e.g. ``hot dog, cat -person -"dining table"``."""
        parts = [", ".join(_render(t) for t in self.include)]
        parts += [f"-{_render(t, single_word=True)}" for t in self.exclude]
        return " ".join(parts)

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
    text = _clean(text)
    if not text.strip():
        raise SparsemmError(f"empty query: type what to search for, {_EXAMPLE}")
    include, excluded = _Parser(_tokenize(text.translate(_QUOTES).lower())).run()
    excluded += _exclude_values(exclude)
    include = list(dict.fromkeys(include))
    excluded = list(dict.fromkeys(excluded))
    if not include:
        if excluded:
            raise SparsemmError(
                f"the query only excludes ({_listing(excluded)}): say what to search for "
                f"too, e.g. 'beach but not {excluded[0]}' or 'beach -{_render(excluded[0])}'"
            )
        raise SparsemmError(f"no search term in {text!r}: type words to search for, {_EXAMPLE}")
    both = [t for t in include if t in set(excluded)]
    if both:
        raise SparsemmError(
            f"{_is_are(both)} both included and excluded in {text!r}; remove it from one side"
        )
    return Query(tuple(include), tuple(excluded))


# --------------------------------------------------------------------------------- helpers


def _clean(text: str) -> str:
    """Control characters (Unicode Cc) -> spaces; format characters (Cf: zero-width
    spaces, bidi overrides, soft hyphens) dropped."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        cat = unicodedata.category(c)
        out.append(" " if cat == "Cc" else "" if cat == "Cf" else c)
    return "".join(out)


def _strip_edges(s: str) -> str:
    """Drop whitespace and punctuation (Unicode category P*) from both ends."""

    def junk(c: str) -> bool:
        return c.isspace() or unicodedata.category(c).startswith("P")

    start, end = 0, len(s)
    while start < end and junk(s[start]):
        start += 1
    while end > start and junk(s[end - 1]):
        end -= 1
    return s[start:end]


def _normalize(s: str) -> str:
    """Collapse whitespace and strip edge punctuation (input is already lower-case)."""
    return _strip_edges(" ".join(s.split()))


def _strip_filler(term: str) -> str:
    """Strip leading articles and "<photo|image|...> of" from an unquoted term."""
    words = term.split(" ")
    i = 0
    while i < len(words):
        if words[i] in _ARTICLES:
            i += 1
        elif words[i] in _MEDIA and i + 1 < len(words) and words[i + 1] == "of":
            i += 2
        else:
            break
    return " ".join(words[i:])


def _tokenize(text: str) -> list[tuple[str, str]]:
    """Split lower-cased text into (kind, value) tokens: sep, minus, phrase, word."""
    tokens: list[tuple[str, str]] = []
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        if kind == "space":
            continue
        if kind == "quote":
            raise SparsemmError(
                'unbalanced double quote: close the quoted phrase, e.g. pizza -"hot dog"'
            )
        if kind == "phrase":
            tokens.append(("phrase", m.group("phrase")))
        elif kind == "word":
            word = _strip_edges(m.group())
            if word:  # a word of pure punctuation ("...", "?") carries no term
                tokens.append(("word", word))
        else:
            tokens.append((str(kind), m.group()))
    return tokens


class _Parser:
    """One left-to-right pass over the tokens (see the module docstring for the rules)."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.include: list[str] = []
        self.exclude: list[str] = []
        self.words: list[str] = []  # unquoted words of the phrase being read
        self.excluding = False  # inside an exclusion-keyword scope
        self.leading = False  # that scope opened the query: it ends at the first separator
        self.pending: str | None = None  # keyword still waiting for its term
        self.minus = False  # a '-' waiting for its term
        self.connector: str | None = None

    def run(self) -> tuple[list[str], list[str]]:
        i = 0
        n = len(self.tokens)
        while i < n:
            kind, value = self.tokens[i]
            nxt = self.tokens[i + 1] if i + 1 < n else None
            i += 1
            if kind == "sep":
                self._check_minus()
                self._flush()
                if self.excluding and self.leading:
                    self._close_scope()
            elif kind == "minus":
                self._flush()
                self.minus = True
            elif kind == "phrase":
                self._flush()
                term = _normalize(value)
                if term:
                    self._emit(term, self.minus or self.excluding)
                    self.minus = False
                else:
                    self._check_minus()
            elif self.minus:  # '-' takes the next word verbatim
                self._emit(value, True)
                self.minus = False
            elif value in NEGATIONS:
                self._flush()
                if not self.excluding:
                    self.excluding = True
                    self.leading = not self.include
                self.pending = f"{self.connector} {value}" if self.connector else value
                self.connector = None
                if value == "except" and nxt == ("word", "for"):
                    i += 1
            elif (
                value in _CONNECTORS
                and nxt is not None
                and nxt[0] == "word"
                and (nxt[1] in NEGATIONS)
            ):
                self._flush()
                self.connector = value
            elif value == "but":
                self._flush()
                if self.excluding:
                    self._close_scope()
                    if nxt is not None and nxt[0] == "word" and nxt[1] in _REINCLUDE:
                        i += 1
            elif value == "and" or (self.excluding and value in _SCOPE_SEPARATORS):
                self._flush()
            else:
                self.words.append(value)
        self._flush()
        self._check_minus()
        self._check_pending()
        return self.include, self.exclude

    def _emit(self, term: str, excluded: bool) -> None:
        if excluded:
            self.exclude.append(term)
            self.pending = None
        else:
            self.include.append(term)

    def _flush(self) -> None:
        if self.words:
            term = _strip_filler(" ".join(self.words))
            self.words = []
            if term:
                self._emit(term, self.excluding)

    def _close_scope(self) -> None:
        self._check_pending()
        self.excluding = False
        self.leading = False

    def _check_minus(self) -> None:
        if self.minus:
            raise SparsemmError(
                "a '-' must be followed by the term to exclude, e.g. 'pizza -person' "
                "or 'pizza -\"hot dog\"'"
            )

    def _check_pending(self) -> None:
        if self.pending is not None:
            raise SparsemmError(
                f"'{self.pending}' is not followed by a term to exclude: "
                f"write e.g. 'dog {self.pending} cat'"
            )


def _exclude_values(values: Sequence[str] | str) -> list[str]:
    """Normalise extra excluded terms (``--exclude``); a value may list terms with commas."""
    if isinstance(values, str):
        values = [values]
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
        text = _clean(value).translate(_QUOTES).replace('"', " ").lower()
        terms = [_strip_filler(_normalize(part)) for part in _VALUE_SPLIT_RE.split(text)]
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


def _is_plain(term: str) -> bool:
    """True when ``term`` reads back as itself without quotes."""
    try:
        tokens = _tokenize(term)
    except SparsemmError:
        return False
    words = [v for _, v in tokens]
    return (
        all(kind == "word" for kind, _ in tokens)
        and " ".join(words) == term
        and not any(w in _SPECIAL_WORDS for w in words)
        and _strip_filler(term) == term
    )


def _render(term: str, single_word: bool = False) -> str:
    if _is_plain(term) and not (single_word and " " in term):
        return term
    return f'"{term}"'


def _listing(terms: Sequence[str]) -> str:
    return ", ".join(f"'{t}'" for t in terms)


def _is_are(terms: Sequence[str]) -> str:
    return f"{_listing(terms)} {'is' if len(terms) == 1 else 'are'}"
