"""One search request, assembled once for every front end (CLI, web API, Python).

:func:`build_request` turns what a person typed (the query text, extra include / exclude
terms, a "more like this" target, the page size, a minimum match score) into a checked
:class:`QueryRequest`: the text parsed once into a :class:`~sparsemm.query.parse.Query`, the
limits applied, the scorer's name left to the collection's model when none is given.
:meth:`sparsemm.query.searcher.Searcher.answer` runs it. This module imports no torch, so
the CLI can refuse bad input before anything heavy loads.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparsemm.errors import SparsemmError
from sparsemm.query.parse import Query, parse_query
from sparsemm.text import tokenize

# The served scorer of SR, the photo concept model and CLIP (a model names its own:
# CodeModel.default_strategy); written here so `--help` names it without loading a model.
DEFAULT_STRATEGY = "match"
MAX_TERMS = 16  # per include / exclude list; longer exclusion lists stop excluding reliably
MAX_K = 100  # results per page over HTTP (the CLI and the Python API allow more)
MAX_OFFSET = 10_000  # deep paging costs a full sort; nobody pages 100 screens of images
# What counts as a match when the scores are probabilities and nobody said otherwise: more
# likely than not (the page's item count).
MATCH_THRESHOLD = 0.5
ENGINES = ("strategy", "index")


@dataclass(frozen=True)
class QueryRequest:
    """A checked search: ``query`` parsed, ``k`` >= 1, ``offset`` >= 0.

    ``like``: an item id, an image path or a decoded image whose code is the include side
    (``query`` then holds only exclusions). ``strategy`` None: the model's default.
    ``engine`` "index": the inverted index's hard filter (strategy ``filter``).
    ``min_score``: keep hits whose match probability reaches it. ``count``: also count the
    collection's items at ``min_score`` (or :data:`MATCH_THRESHOLD`) or more.
    """

    query: Query
    k: int = 10
    offset: int = 0
    strategy: str | None = None
    like: Any = None
    min_score: float | None = None
    engine: str = "strategy"
    count: bool = False

    def __post_init__(self) -> None:
        check_page(self.k, self.offset)

    @property
    def heavy_terms(self) -> int:
        """How many terms the query holds (a server gives many-term queries fewer lanes)."""
        return len(self.query.include) + len(self.query.exclude)


# what a shown percent forgives of float noise (0.29 computed as 0.28999999999 is 29%); a
# hit shown at a percent reaches that percent as a --min-score (reaches)
SHOWN_SLACK = 1e-9


def percent(p: float) -> str:
    """A match probability as it is shown and ranked: whole percent, rounded down ("92%";
    "<1%" below 1%)."""
    n = math.floor(100.0 * (p + SHOWN_SLACK))
    return "<1%" if n < 1 else f"{n}%"


def reaches(p: float, min_score: float) -> bool:
    """Whether a match probability shown by :func:`percent` reaches ``min_score``."""
    return p + SHOWN_SLACK >= min_score


def evidence_text(term: str, side: str, kind: str, value: float) -> str:
    """One query term's evidence on an item as the CLI and the page write it: ``dog 93%``,
    ``cat 0% (left out)`` for an excluded term (the chance the item shows a cat, which was
    left out; never "not cat"), two decimals for a code similarity (no probability for the
    word), ``like it 48%`` for a "more like this" picture."""
    if kind == "code similarity":
        shown = f"{value:.2f}"
    else:
        shown = "0%" if value <= 0 else percent(value)
    name = "like it" if term.startswith("like: ") else term
    return f"{name} {shown}{' (left out)' if side == 'exclude' else ''}"


def min_score_refusal(strategy: str, default: str) -> str:
    """Why a minimum score cannot apply to ``strategy``'s scores (not probabilities)."""
    if strategy == default:  # "use the default" would be no help
        return (
            "a minimum score keeps matches by probability, and this collection's model gives "
            f"none (its default scorer, {strategy}, ranks by similarity; an SR model needs "
            "word detectors: `sparsemm train detectors MODEL COLLECTION`); search without "
            "--min-score"
        )
    return (
        f"a minimum score keeps matches by probability; the {strategy} scorer's scores are "
        "not probabilities (use the default scorer)"
    )


def parse_probability(value: float | str, name: str = "min_score") -> float:
    """A minimum match score: 0.6 or "60%" (SparsemmError, one line, otherwise)."""
    text = str(value).strip()
    try:
        p = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise SparsemmError(f"{name}: not a probability: {value!r} (use 0.6 or 60%)") from None
    if not 0.0 < p <= 1.0:
        hint = f"; did you mean {text}%?" if not text.endswith("%") and 1.0 < p <= 100.0 else ""
        raise SparsemmError(f"{name}: a probability in (0, 1] (or 1%-100%), got {value!r}{hint}")
    return p


def _terms_of(value: Any, side: str) -> Query | None:
    if not isinstance(value, str):
        raise SparsemmError(f"{side} terms must be text, got {type(value).__name__}")
    _check_text(value, f"the {side} term")
    return parse_query(value) if value.strip() else None


def _check_text(value: str, what: str) -> None:
    """SparsemmError when ``value`` holds bytes that are not UTF-8 (a terminal in another
    encoding: the command line hands them over as lone surrogates; a URL's query string
    decoded with U+FFFD in their place), which the parser would otherwise drop, searching
    for other words than were typed."""
    at = value.find("\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        at = exc.start
    if at < 0:
        return
    shown = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    raise SparsemmError(
        f"{what} '{shown}' holds bytes that are not UTF-8 text (character {at + 1}); "
        "type it again in UTF-8 (check the terminal's encoding)"
    )


def build_query(q: str = "", include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Query:
    """One :class:`Query` from typed text plus include / exclude term lists.

    ``q`` is parsed with the full grammar; each list value too ("cat, ball" gives two
    terms; "dog -cat" in ``include`` adds both sides), except that an ``exclude`` value may
    not itself exclude something. Blank values are skipped; duplicates are dropped, first
    occurrence wins. Raises SparsemmError for malformed input or too many terms.
    """
    if not isinstance(q, str):
        raise SparsemmError(f"q must be text, got {type(q).__name__}")
    _check_text(q, "the query")
    if not include and not exclude:
        query = parse_query(q)  # the parser's own message for an empty query
    else:
        for values, side in ((include, "include"), (exclude, "exclude")):
            if isinstance(values, str):
                raise SparsemmError(f"{side} must be a list of terms, not one string")
        inc: list[str] = []
        exc: list[str] = []
        if q.strip():
            base = parse_query(q)
            inc += base.include
            exc += base.exclude
        for value in include:
            part = _terms_of(value, "include")
            if part is not None:
                inc += part.include
                exc += part.exclude
        for value in exclude:
            if isinstance(value, str) and value.strip() and not any(c.isalnum() for c in value):
                raise SparsemmError(f"empty excluded term {value!r}: give a word such as 'cat'")
            part = _terms_of(value, "exclude")
            if part is None:
                continue
            if part.exclude:
                raise SparsemmError(
                    f"the exclude value {value!r} excludes something itself; list the terms to "
                    "leave out, e.g. 'cat, ball'"
                )
            exc += part.include
        if not inc and not exc:
            raise SparsemmError("type what to search for, e.g. 'dog' (and what not to: 'cat')")
        query = Query(tuple(dict.fromkeys(inc)), tuple(dict.fromkeys(exc)))
    terms = [*query.include, *query.exclude]
    if terms and not any(tokenize(t) for t in terms):
        shown = ", ".join(repr(t) for t in terms[:4])
        symbols = not any(c.isalnum() for t in terms for c in t)
        kind = "no words, only symbols or emoji" if symbols else "only common words"
        raise SparsemmError(
            f"the query holds {kind} ({shown}), which name nothing to find; "
            "say what to search for, e.g. 'dog but not cat'"
        )
    n_inc, n_exc = len(query.include), len(query.exclude)
    if n_inc > MAX_TERMS or n_exc > MAX_TERMS:
        raise SparsemmError(
            f"a query may hold at most {MAX_TERMS} include and {MAX_TERMS} exclude terms (got "
            f"{n_inc} and {n_exc}); split it into several searches"
        )
    return query


def like_exclusions(q: str = "", include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Query:
    """The exclusions of a "more like this" query: ``q`` and the lists may only leave
    things out ("but not cat"); nothing at all is fine. SparsemmError for an include term."""
    if not q.strip() and not any(v.strip() for v in [*include, *exclude] if isinstance(v, str)):
        return Query.empty()
    query = build_query(q, include, exclude)
    if query.include:
        raise SparsemmError(
            f"a 'more like this' search only takes terms to leave out (got "
            f"{', '.join(query.include)!r} to find); write them as 'but not X'"
        )
    return query


def check_page(k: Any, offset: Any, k_name: str = "k", offset_name: str = "offset") -> None:
    """SparsemmError unless ``k`` is a whole number (a numpy one too) of at least 1 and
    ``offset`` one of 0 or more (the Python API's ``k="3"`` or ``k=2.5`` too, not a
    TypeError deep inside)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise SparsemmError(f"{k_name} must be a whole number of at least 1, got {k!r}")
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
        raise SparsemmError(f"{offset_name} must be a whole number of 0 or more, got {offset!r}")


def build_request(
    q: str = "",
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    k: int = 10,
    offset: int = 0,
    strategy: str | None = None,
    like: Any = None,
    min_score: float | str | None = None,
    engine: str = "strategy",
    count: bool = False,
    names: Mapping[str, str] | None = None,
) -> QueryRequest:
    """Check and assemble one search (see the module docstring); SparsemmError, one line,
    for anything a search would refuse. ``names``: what the messages call ``k``,
    ``offset`` and ``min_score`` (the CLI: "-k", "--offset", "--min-score")."""
    name = {"k": "k", "offset": "offset", "min_score": "min_score", **(names or {})}
    check_page(k, offset, name["k"], name["offset"])
    if engine not in ENGINES:
        raise SparsemmError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    score = parse_probability(min_score, name["min_score"]) if min_score is not None else None
    if like is not None:
        if engine != "strategy":
            raise SparsemmError("a 'more like this' search ranks with a strategy (no index engine)")
        query = like_exclusions(q, include, exclude)
    else:
        query = build_query(q, include, exclude)
    if engine == "index" and (strategy or "filter") != "filter":
        raise SparsemmError("the index engine serves --strategy filter only")
    if engine == "index" and offset:
        raise SparsemmError("the index engine serves no --offset")
    return QueryRequest(query, k, offset, strategy, like, score, engine, count)
