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
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparsemm.errors import SparsemmError

MAX_QUERY_CHARS = 512
MAX_NP_WORDS = 3  # an excluded noun phrase: "dining table", "baseball glove", "hot dog"
MAX_TERM_WORDS = 3  # include pieces up to this long are terms; longer text is one phrase
MAX_LABEL_WORDS = 5  # ...and only while all pieces together stay this short

# Single-word prefix cues: the noun phrase after them is excluded.
NEGATIONS = frozenset(
    {"not", "no", "without", "except", "excluding", "exclude", "minus", "w/o", "sans", "neither"}
)
# Multi-word prefix cues (token tuples), longest first when matched.
_PREFIX_CUES: tuple[tuple[str, ...], ...] = tuple(
    sorted(
        (
            ("except", "for"),
            ("other", "than"),
            ("apart", "from"),
            ("aside", "from"),
            ("no", "sign", "of"),
            ("no", "signs", "of"),
            ("no", "trace", "of"),
            ("no", "evidence", "of"),
            ("not", "a", "trace", "of"),
            ("not", "a", "hint", "of"),
            ("no", "hint", "of"),
            ("not", "a", "sign", "of"),
            ("devoid", "of"),
            ("free", "of"),
            ("free", "from"),
            ("empty", "of"),
            ("absence", "of"),
            ("lack", "of"),
            ("lacks",),
            ("lack",),
            ("lacking",),
            ("isn't",),
            ("aren't",),
            ("wasn't",),
            ("weren't",),
            ("none", "of", "the"),
            ("none", "of"),
        ),
        key=len,
        reverse=True,
    )
)
# The cues by first word (same order): a token is tried only against cues it can start.
_CUES_BY_FIRST: dict[str, tuple[tuple[str, ...], ...]] = {
    w: tuple(c for c in _PREFIX_CUES if c[0] == w)
    for w in dict.fromkeys(c[0] for c in _PREFIX_CUES)
}
# Sentence cues that may end without an object ("..., isn't it"): no error then.
_SOFT_CUES = frozenset({"isn't", "aren't", "wasn't", "weren't", "lacking", "lacks", "lack"})
# "doesn't have X", "does not contain X", "not wearing X": the verb after the cue is skipped.
_AUX_NEG = frozenset({"doesn't", "don't", "didn't", "cannot", "can't"})
_HAVE_VERBS = frozenset(
    {
        "have", "has", "contain", "contains", "show", "shows", "include", "includes",
        "feature", "features", "hold", "holds", "depict", "depicts", "display", "displays",
        "wear", "carry", "see", "find", "want", "need", "like",
        "wearing", "holding", "having", "carrying", "showing", "containing", "including",
        "featuring", "using", "depicting",
    }
)  # fmt: skip
# Postfix cues: "X is absent", "X is missing", "X nowhere to be seen", "X is not present".
_POSTFIX = frozenset({"absent", "missing", "nowhere", "gone", "lacking"})
_NOT_PRESENT = frozenset(
    {
        "present", "visible", "shown", "pictured", "seen", "included", "there", "here",
        "around", "anywhere", "nearby", "in", "to", "depicted", "found", "featured",
    }
)  # fmt: skip
_OUT_OF = frozenset({"sight", "view", "frame", "picture", "image", "shot", "photo"})
# "not" before these is not an exclusion: "not only", "not without" (double negation)...
_DOUBLE_NEG = frozenset({"only", "without", "free", "devoid", "lacking", "empty", "missing"})
# ... nor "no" before these ("no fewer than two cats", "no longer a cat").
_NO_IDIOMS = frozenset({"fewer", "less", "longer", "matter", "doubt", "way"})
# "anything but X" = everything except X.
_EVERYTHING = frozenset({"anything", "everything", "everybody", "everyone", "all"})
# After "not", these mean the sentence goes on, not that an object is excluded
# ("the dog is not on the couch", "not too big"): "not" stays an ordinary word.
_NOT_FOLLOWERS = frozenset(
    {"on", "at", "near", "under", "over", "by", "inside", "outside", "from", "into", "onto",
     "behind", "above", "below", "next", "around", "for", "to", "all", "just", "too", "so",
     "quite", "merely", "exactly", "really", "very", "always", "even", "yet", "every",
     "allowed", "looking", "facing", "moving", "working"}
)  # fmt: skip
# A list item starting with one of these is a new clause ("no shirt, wearing shorts").
_PARTICIPLES = frozenset(
    {"wearing", "holding", "carrying", "sitting", "standing", "walking", "eating", "playing",
     "looking", "riding", "lying", "laying", "running", "flying", "using", "watching",
     "waiting", "talking", "smiling", "posing", "reading", "working", "cooking", "drinking"}
)  # fmt: skip
# Words meaning "no person".
PERSON = "person"
_PERSON_ADJECTIVES = frozenset({"unoccupied", "uninhabited", "deserted", "unpopulated"})
_PERSON_WORDS = frozenset({"nobody", "noone", "no-one"}) | _PERSON_ADJECTIVES
# Skipped between a cue and its noun phrase.
_DETERMINERS = frozenset(
    {"a", "an", "the", "any", "some", "single", "one", "more", "other", "such", "even",
     "its", "his", "her", "their", "my", "your", "our"}
)  # fmt: skip
# Words that end an excluded noun phrase (prepositions, verbs, clause words, cues, filler).
_NP_STOP = frozenset(
    {
        "is", "are", "was", "were", "be", "been", "being", "am", "'s", "can", "could", "may",
        "might", "will", "would", "should", "has", "have", "had", "do", "does", "did",
        "in", "on", "at", "near", "by", "with", "from", "into", "onto", "inside", "outside",
        "under", "over", "above", "below", "behind", "beside", "besides", "next", "of", "to",
        "for", "around", "anywhere", "nearby", "here", "there", "visible", "present", "seen",
        "shown", "whatsoever", "either", "and", "or", "nor", "but", "yet", "while", "where",
        "which", "that", "who", "whose", "whereas", "although", "though", "so", "as", "than",
        "then", "because", "when", "if", "it", "its", "this", "these", "those", "they",
        "he", "she", "we", "you", "i", "absent", "missing", "nowhere", "gone", "lacking",
        "all", "anymore", "too", "also", "just", "only", "really",
        "out", "off", "up", "down", "against", "among", "along", "across", "through",
        "there's", "isn't", "aren't", "doesn't", "don't", "wasn't", "weren't", "nobody",
    }
)  # fmt: skip
_NP_NOT_VERB = frozenset(
    {"building", "buildings", "ceiling", "clothing", "painting", "paintings", "bedding",
     "railing", "awning", "icing", "frosting", "topping", "toppings", "stuffing", "pudding",
     "seed", "seeds", "bed", "beds", "sled", "sleds", "shed", "bread", "steed",
     "thing", "things", "something", "anything", "nothing", "everything", "king", "kings",
     "ring", "rings", "wing", "wings", "string", "strings", "swing", "swings", "spring",
     "earring", "earrings", "duckling", "ducklings", "sibling", "siblings"}
)  # fmt: skip
# Presence filler after an excluded phrase ("in the image", "to be seen", "is visible").
_FILLER = frozenset(
    {
        "is", "are", "was", "were", "be", "been", "being", "can", "could", "seen", "visible",
        "present", "shown", "found", "pictured", "depicted", "included", "featured", "to",
        "in", "within", "on", "the", "this", "that", "image", "images", "picture", "pictures",
        "photo", "photos", "photograph", "pic", "scene", "frame", "shot", "view", "sight",
        "anywhere", "at", "all", "whatsoever", "around", "nearby", "here", "there", "either",
        "background", "foreground", "appear", "appears", "seem", "seems", "of", "it",
        "anymore", "evident", "apparent", "out", "nowhere", "really", "whatever", "any", "more",
        "spotted", "detected", "immediately", "clearly", "obviously", "them",
    }
)  # fmt: skip
# A filler run not followed by a clause boundary must hold one of these to count as filler
# ("no chair in the kitchen" keeps "in the kitchen"; "no chair in the image" drops it).
_FILLER_ANCHOR = frozenset(
    {
        "image", "images", "picture", "pictures", "photo", "photos", "photograph", "pic",
        "scene", "frame", "shot", "view", "sight", "seen", "visible", "present", "shown",
        "found", "pictured", "depicted", "anywhere", "whatsoever", "around", "nearby",
        "here", "there", "evident", "apparent", "spotted", "detected", "all",
    }
)  # fmt: skip
# Words that only set up a prefix cue: dropped from the end of the include before it
# ("there is no X", "the image has no X", "a kitchen with no X").
_CUE_SETUP = frozenset(
    {
        "there", "there's", "is", "are", "was", "were", "has", "have", "had", "with", "shows",
        "show", "showing", "contains", "contain", "containing", "includes", "include",
        "including", "features", "featuring", "this", "that", "the", "image",
        "picture", "photo", "photograph", "pic", "scene", "frame", "shot", "view", "i", "we",
        "you", "see", "sees", "also", "and", "but", "yet", "while", "where",
        "whereas", "though", "although", "or", "nor", "so", "in", "noticeably", "notably",
        "conspicuously", "completely", "entirely", "totally", "clearly", "visibly",
        "obviously", "absolutely", "curiously", "strikingly", "utterly", "wholly", "almost",
        "virtually", "seems", "appears", "to", "be", "does", "do", "did",
    }
)  # fmt: skip
# Dropped from the two ends of an include piece ("where a person skates", "cat and").
_CONNECTIVES = frozenset(
    {"and", "but", "yet", "while", "where", "whereas", "though", "although", "so", "with",
     "as", "or", "nor", "also", "plus", "then", "which", "that"}
)  # fmt: skip
_LEADING_CONNECTIVES = _CONNECTIVES - {"that", "which"}
# Words that separate include terms ("cat and dog"; "but" ends a label-style exclusion).
_SPLIT_WORDS = frozenset({"and", "but"})
_LIST_WORDS = frozenset({"or", "nor", "and"})
# Words that, right before a cue, are part of how it is said in label queries.
_CONNECTORS = frozenset({"but", "and", "or", "with", "yet"})

_ARTICLES = frozenset({"a", "an", "the", "some", "any"})
_MEDIA = frozenset(
    {
        "photo", "photos", "picture", "pictures", "image", "images", "photograph",
        "photographs", "pic", "pics", "shot", "shots", "snapshot",
    }
)  # fmt: skip

_QUOTES = str.maketrans(
    {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\uff02": '"', "\u2019": "'", "\u2018": "'"}
)
_TOKEN_RE = re.compile(
    r"""
      (?P<space>\s+)
    | "(?P<phrase>[^"]*)"
    | (?P<quote>")
    | (?P<sep>[,;&+])
    | (?P<minus>[-\u2212]+\s?)
    | (?P<word>[^\s,;&+"]+)
    """,
    re.VERBOSE,
)
_SENTENCE_END = re.compile(r"[.!?:]+$")
_DASH_MINUS = re.compile(r"(?<=\s)[\u2013\u2014](?=\w)")
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
    text = _clean(text)
    if not text.strip() and not exclude:
        raise SparsemmError(f"empty query: type what to search for, {_EXAMPLE}")
    include, excluded = _parse(text)
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


# A quoted part glued to the word before it (t-"shirt"): part of that word, not a phrase of
# its own (which left "t" excluded and "shirt" searched for).
_GLUED_QUOTE_RE = re.compile(r'(?<=\w-)"([^"\s]+)"')


def _parse(text: str) -> tuple[list[str], list[str]]:
    """(include terms, excluded terms) of cleaned text, before de-duplication."""
    text = _GLUED_QUOTE_RE.sub(r"\1", text.translate(_QUOTES))
    return _Parser(_tokenize(text.lower())).run()


# --------------------------------------------------------------------------------- helpers


def _clean(text: str) -> str:
    """Control characters (Unicode Cc) and lone surrogates (Cs: bytes that were not valid
    UTF-8) -> spaces; format characters (Cf: zero-width spaces, bidi overrides, soft
    hyphens) dropped; en and em dashes -> commas (a pause, not a minus)."""
    # a dash glued to a word is a minus ("pizza \u2013person"), a spaced one a pause
    text = _DASH_MINUS.sub("-", text.replace("\u2010", "-"))
    text = text.replace("\u2013", ",").replace("\u2014", ",")
    if text.isprintable():
        return text
    out = []
    for c in text:
        cat = unicodedata.category(c)
        out.append(" " if cat in ("Cc", "Cs") else "" if cat == "Cf" else c)
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


def strip_filler_words(words: list[str]) -> list[str]:
    """Strip leading articles and "<photo|image|...> of" from a list of words."""
    i = 0
    while i < len(words):
        if words[i] in _ARTICLES:
            i += 1
        elif words[i] in _MEDIA and i + 1 < len(words) and words[i + 1] == "of":
            i += 2
        else:
            break
    return words[i:]


def _strip_filler(term: str) -> str:
    """Strip leading articles and "<photo|image|...> of" from an unquoted term."""
    return " ".join(strip_filler_words(term.split(" ")))


def _tokenize(text: str) -> list[tuple[str, str]]:
    """Split lower-cased text into (kind, value) tokens: sep, end, minus, phrase, word.

    ``end`` marks sentence punctuation (``.`` ``!`` ``?`` ``:``) at the end of a word. An
    unbalanced double quote is dropped.
    """
    tokens: list[tuple[str, str]] = []
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        if kind in ("space", "quote"):
            continue
        if kind == "phrase":
            tokens.append(("phrase", m.group("phrase")))
        elif kind == "word":
            raw = m.group()
            word = _strip_edges(raw)
            if word:  # a word of pure punctuation ("...", "?") carries no term
                tokens.append(("word", word))
            end = _SENTENCE_END.search(raw.rstrip(")]}'"))
            if end and (word or tokens):
                tokens.append(("end", end.group()[-1]))
        else:
            tokens.append((str(kind), m.group()))
    return tokens


@dataclass
class _Piece:
    """A run of include words (or one quoted phrase) and what separated it from the last."""

    words: list[str]
    quoted: bool = False
    sep: str = ", "


class _Parser:
    """One left-to-right pass over the tokens (see the module docstring for the rules)."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.pieces: list[_Piece] = []
        self.exclude: list[str] = []
        self.words: list[str] = []  # include words of the piece being read
        self.widx: list[int] = []  # their token indices
        self.removed: set[int] = set()  # tokens that belong to an exclusion
        self.silent: set[int] = set()  # dropped without cutting the sentence
        self.sep = ", "  # separator before the piece being read

    # -- token access --------------------------------------------------------------------
    def _word(self, i: int) -> str | None:
        if 0 <= i < len(self.tokens) and self.tokens[i][0] == "word":
            return self.tokens[i][1]
        return None

    def _kind(self, i: int) -> str | None:
        return self.tokens[i][0] if 0 <= i < len(self.tokens) else None

    # -- main loop -----------------------------------------------------------------------
    def run(self) -> tuple[list[str], list[str]]:
        i, n = 0, len(self.tokens)
        while i < n:
            kind, value = self.tokens[i]
            if kind in ("sep", "end"):
                self._flush(", " if kind == "sep" else ". ")
                i += 1
            elif kind == "minus":
                i = self._minus(i)
            elif kind == "phrase":
                self._flush(" ")
                term = _normalize(value)
                if term:
                    self.pieces.append(_Piece([term], quoted=True, sep=self.sep))
                    self.sep = " "
                i += 1
            else:
                i = self._word_at(i)
        self._flush(", ")
        return self._includes(), self.exclude

    def _minus(self, i: int) -> int:
        nxt = self._word(i + 1)
        spaced = self.tokens[i][1][-1:].isspace()  # "x - no chair", not "x -no"
        if (
            nxt is not None
            and spaced
            and (
                self._prefix_cue(i + 1) is not None
                or nxt in _PERSON_WORDS
                or nxt in ("there", "there's", "no", "not")
            )
        ):
            self._flush(", ")  # "a kitchen - no chair in sight": a dash, not a minus
            return self._remove(i, i + 1)
        self._flush(" ")
        kind = self._kind(i + 1)
        if kind == "word":
            self.exclude.append(self.tokens[i + 1][1])
            self.removed.update((i, i + 1))
            return i + 2
        if kind == "phrase":
            term = _normalize(self.tokens[i + 1][1])
            if term:
                self.exclude.append(term)
                self.removed.update((i, i + 1))
                return i + 2
        raise SparsemmError(
            "a '-' must be followed by the term to exclude, e.g. 'pizza -person' "
            "or 'pizza -\"hot dog\"'"
        )

    def _word_at(self, i: int) -> int:
        word = self.tokens[i][1]
        # "not only X but also Y" includes both; "not without X", "not free of X" are
        # double negations (X is there).
        nxt = self._word(i + 1)
        if word == "not" and nxt in _DOUBLE_NEG:
            end = i + 2 + (self._word(i + 2) in ("of", "from"))
            return self._remove(i, end)
        if word == "no" and (nxt in _NO_IDIOMS or (nxt == "more" and self._word(i + 2) == "than")):
            self._add(word, i)  # "no fewer than", "no longer": not an exclusion
            return i + 1
        if word == "but" and self.words and all(w in _EVERYTHING for w in self.words):
            # "anything but cats": everything except cats
            for _ in range(len(self.words)):
                self.words.pop()
                self.removed.add(self.widx.pop())
            nps, j = self._np_list(i + 1, leading=True)
            if nps:
                self.exclude += nps
                return self._remove(i, self._skip_filler(j))
        # A connector right before a cue belongs to it ("but not", "and no", "with no").
        if word in _CONNECTORS and self._prefix_cue(i + 1) is not None:
            self._add(word, i)
            return i + 1
        cue = self._prefix_cue(i)
        if cue is not None:
            return self._exclude_after(i, cue)
        if word in _PERSON_ADJECTIVES:
            self.exclude.append(PERSON)  # "a deserted street": the street stays whole
            self.silent.add(i)
            return i + 1
        if word in _PERSON_WORDS or (word == "no" and self._word(i + 1) == "one"):
            self._drop_setup()
            self.exclude.append(PERSON)
            return self._remove(i, self._skip_filler(i + (2 if word == "no" else 1)))
        post = self._postfix_cue(i)
        if post is not None:
            np = self._take_trailing_np()
            if np:
                self.exclude.append(np)
                return self._remove(i, self._skip_filler(post))
        if word in _SPLIT_WORDS:
            self._flush(" and " if word == "and" else ", ")
            if word == "but" and self._word(i + 1) in ("with", "also"):
                return i + 2
            return i + 1
        self._add(word, i)
        return i + 1

    def _add(self, word: str, i: int) -> None:
        self.words.append(word)
        self.widx.append(i)

    def _remove(self, start: int, end: int) -> int:
        self.removed.update(range(start, end))
        return end

    # -- cues ----------------------------------------------------------------------------
    def _prefix_cue(self, i: int) -> int | None:
        """Index after a prefix cue starting at token i (its verb skipped), or None."""
        w = self._word(i)
        if w is None:
            return None
        for cue in _CUES_BY_FIRST.get(w, ()):
            if all(self._word(i + j) == c for j, c in enumerate(cue)):
                end = i + len(cue)
                if cue[0] in ("lacks", "lack", "lacking") and not self._np_start(end):
                    return None  # "chairs are lacking": a postfix cue
                return end
        if w in ("absent", "missing"):
            nxt = self._word(i + 1)
            if nxt in ("is", "are", "was", "were"):
                return i + 2  # "absent is any chair"
            if self._kind(i + 1) == "end" and self.tokens[i + 1][1] == ":":
                return i + 2  # "missing: chairs"
            return None
        if w in _AUX_NEG or (w in ("does", "do", "did") and self._word(i + 1) == "not"):
            j = i + (1 if w in _AUX_NEG else 2)
            return j + 1 if self._word(j) in _HAVE_VERBS else None
        if w == "not":
            nxt = self._word(i + 1)
            if nxt in _NOT_PRESENT and not self._np_start(i + 1, allow_stop=False):
                return None  # "not present", "not visible": postfix
            if nxt in _HAVE_VERBS:
                return i + 2  # "not wearing a hat"
            if nxt in _NOT_FOLLOWERS or (
                nxt is not None and _verb_like(nxt) and not _compound_noun(nxt, self._word(i + 2))
            ):
                return None  # "not on the couch", "not looking at": not an exclusion
            return i + 1
        if w in NEGATIONS:
            if w == "no" and self._word(i + 1) == "one":
                return None  # "no one": a person cue
            return i + 1
        return None

    def _postfix_cue(self, i: int) -> int | None:
        """Index after a postfix cue at token i ("is absent", "not visible"), or None."""
        w = self._word(i)
        if w in _POSTFIX:
            # "the cat is missing" / "missing." / "absent from the scene"; not "a boy
            # missing his teeth", "gone fishing", "nowhere near the cat".
            if self._ends_clause(i + 1) or self._word(i + 1) == "from":
                return self._skip_from(i + 1)
            return None
        if w == "not" and self._word(i + 1) in _NOT_PRESENT:
            if self._word(i + 1) in ("in", "to") and not self._anchored_filler(i + 1):
                return None  # "not in the car": a place, not absence
            return i + 2
        if w == "out" and self._word(i + 1) == "of":
            j = i + 2 + (self._word(i + 2) in ("the", "this"))
            if self._word(j) in _OUT_OF:
                return j + 1  # "out of sight", "out of the picture"
        return None

    def _skip_from(self, i: int) -> int:
        """After "absent from the scene", the index past the filler (else i)."""
        if self._word(i) == "from":
            j = self._skip_filler(i + 1)
            return j if j > i + 1 else i + 1
        return i

    def _anchored_filler(self, i: int) -> bool:
        """True when filler starting at token i names the picture ("in sight", "in the
        image"), not a place ("in the car")."""
        j = i
        while self._word(j) in _FILLER:
            if self._word(j) in _FILLER_ANCHOR:
                return True
            j += 1
        return False

    def _np_start(self, i: int, allow_stop: bool = False) -> bool:
        """True when token i can start a noun phrase (after optional determiners)."""
        while self._word(i) in _DETERMINERS:
            i += 1
        if self._kind(i) == "phrase":
            return True
        w = self._word(i)
        return w is not None and (allow_stop or w not in _NP_STOP) and w not in _FILLER

    def _exclude_after(self, i: int, start: int) -> int:
        """Handle the prefix cue at tokens i..start-1: exclude the noun phrase list after it."""
        cue_words = [v for _, v in self.tokens[i:start]]
        setup = self._drop_setup()
        leading = not self.pieces and not self.words
        label = " ".join([*([setup] if setup in _CONNECTORS else []), *cue_words])
        j = start
        if self._kind(j) == "end" and self.tokens[j][1] == ":":
            j += 1
        nps, j = self._np_list(j, leading)
        if nps and self.words and all(w in _EVERYTHING for w in self.words):
            for _ in range(len(self.words)):  # "anything other than cats": only the exclusion
                self.words.pop()
                self.removed.add(self.widx.pop())
        if not nps and cue_words[0] in _SOFT_CUES:
            return self._remove(i, j)  # "..., isn't it?": no object, nothing to exclude
        if not nps:
            raise SparsemmError(
                f"'{label}' is not followed by a term to exclude: write e.g. 'dog {label} cat'"
            )
        self.exclude += nps
        return self._remove(i, self._skip_filler(j))

    def _drop_setup(self) -> str | None:
        """Drop the words that only set up a cue from the end of the current piece; return
        the word right before the cue (for messages)."""
        last = self.words[-1] if self.words else None
        while self.words and self.words[-1] in _CUE_SETUP:
            self.words.pop()
            self.removed.add(self.widx.pop())
        return last

    # -- noun phrases --------------------------------------------------------------------
    def _np(self, i: int) -> tuple[str | None, int]:
        """The noun phrase starting at token i (determiners skipped) and the index after."""
        while self._word(i) in _DETERMINERS:
            i += 1
        if self._kind(i) == "phrase":
            term = _normalize(self.tokens[i][1])
            return (term or None), i + 1
        words: list[str] = []
        while len(words) < MAX_NP_WORDS:
            w = self._word(i)
            if w is None or w in _NP_STOP or w in _PERSON_WORDS:
                break
            if words and (
                w in _DETERMINERS or (_verb_like(w) and not _compound_noun(words[-1], w))
            ):
                break
            if w in NEGATIONS:
                break
            words.append(w)
            i += 1
        return (" ".join(words) or None), i

    def _np_list(self, i: int, leading: bool) -> tuple[list[str], int]:
        """A cue's noun phrases: the first, then more joined by or/nor/and/',' (a comma only
        when the cue did not open the query) when each ends a clause."""
        first, i = self._np(i)
        if first is None:
            return [], i
        nps = [first]
        while True:
            j = i
            kind, w = self._kind(j), self._word(j)
            comma = kind == "sep" and self.tokens[j][1] == "," and not leading
            if w in _LIST_WORDS or comma:
                j += 1
                if comma and self._word(j) in _LIST_WORDS:
                    j += 1  # "forks, knives, or spoons"
                if self._word(j) in ("no", "not", "without"):
                    j += 1
                np, k = self._np(j)
                verb_first = np is not None and np.split(" ")[0] in _PARTICIPLES
                if np is not None and not verb_first and (w == "nor" or self._ends_clause(k)):
                    nps.append(np)
                    i = k
                    continue
            return nps, i

    def _ends_clause(self, i: int) -> bool:
        """True when token i ends a clause: end of text, punctuation, a clause word, a cue,
        or presence filler that does."""
        kind = self._kind(i)
        if kind in (None, "sep", "end", "minus"):
            return True
        w = self._word(i)
        if w in _LIST_WORDS or w in _CONNECTIVES or w in _SPLIT_WORDS:
            return True
        if self._prefix_cue(i) is not None or w in _PERSON_WORDS:
            return True
        return self._skip_filler(i) > i

    def _skip_filler(self, i: int) -> int:
        """Index after presence filler starting at token i ("in the image", "to be seen")."""
        j = i
        anchor = False
        while self._word(j) in _FILLER:
            anchor |= self._word(j) in _FILLER_ANCHOR
            j += 1
        if j == i:
            return i
        kind = self._kind(j)
        boundary = kind in (None, "sep", "end", "minus") or self._word(j) in (
            _CONNECTIVES | _SPLIT_WORDS | _LIST_WORDS
        )
        return j if anchor or boundary else i

    def _take_trailing_np(self) -> str | None:
        """Remove and return the noun phrase at the end of the current piece (before a
        postfix cue: "a chair is missing" -> chair)."""
        words = self.words
        k = len(words)
        while k and words[k - 1] in (
            "is",
            "are",
            "was",
            "were",
            "be",
            "seems",
            "seem",
            "appears",
            "appear",
            "remains",
            "remain",
            "being",
        ):
            k -= 1  # fmt: skip
        start = k
        while (
            start > 0
            and k - start < MAX_NP_WORDS
            and words[start - 1] not in _NP_STOP
            and words[start - 1] not in _DETERMINERS
            and words[start - 1] not in _CONNECTIVES
        ):
            start -= 1
        if start == k:
            return None
        np = " ".join(words[start:k])
        while start and words[start - 1] in _DETERMINERS:
            start -= 1
        del words[start:]
        self.removed.update(self.widx[start:])
        del self.widx[start:]
        while words and words[-1] in _CONNECTIVES:
            words.pop()
            self.removed.add(self.widx.pop())
        return np

    # -- include -------------------------------------------------------------------------
    def _flush(self, sep: str) -> None:
        if self.words:
            self.pieces.append(_Piece(self.words, sep=self.sep))
            self.words = []
            self.widx = []
            self.sep = sep
        elif sep == ". " or not self.pieces:
            self.sep = sep if self.pieces else ", "

    def _includes(self) -> list[str]:
        """Include terms (label style) or one phrase (sentence style)."""
        pieces: list[_Piece] = []
        for p in self.pieces:
            if p.quoted:
                pieces.append(p)
                continue
            words = list(p.words)
            while words and words[0] in _CONNECTIVES:
                words.pop(0)
            while words and words[-1] in _CONNECTIVES:
                words.pop()
            words = _alternatives(strip_filler_words(words))
            if words and all(w in _MEDIA for w in words) and len(self.pieces) == 1:
                continue  # "photos without text": nothing to include
            if words:
                pieces.append(_Piece(words, sep=p.sep))
        if not pieces:
            return []
        plain = [p for p in pieces if not p.quoted]
        if all(_term_words(p.words) <= MAX_TERM_WORDS for p in plain) and (
            sum(_term_words(p.words) for p in plain) <= MAX_LABEL_WORDS
        ):
            return [" ".join(p.words) for p in pieces]
        return [self._phrase()]

    def _phrase(self) -> str:
        """The include of a sentence: its text with every exclusion (cue, object, filler,
        set-up words) cut out, and the connectives next to a cut dropped."""
        items: list[str | None] = []  # words; "," for punctuation; None for a cut
        for idx, (kind, value) in enumerate(self.tokens):
            if idx in self.silent:
                continue
            if idx in self.removed:
                if not items or items[-1] is not None:
                    items.append(None)
            elif kind == "word":
                items.append(value)
            elif kind == "phrase" and _normalize(value):
                items.append(_normalize(value))
            elif kind in ("sep", "end") and items and items[-1] not in (",", None):
                items.append(",")

        def near_cut(j: int, step: int) -> bool:
            j += step
            while 0 <= j < len(items) and items[j] == ",":
                j += step
            return not 0 <= j < len(items) or items[j] is None

        words: list[str] = []
        for j, w in enumerate(items):
            if w is None or (w in _CONNECTIVES and (near_cut(j, 1) or near_cut(j, -1))):
                if words and words[-1] != ",":
                    words.append(",")
                continue
            if w == "," and (not words or words[-1] == ","):
                continue
            words.append(w)
        while words and words[-1] in (",", *_CONNECTIVES):
            words.pop()
        while words and (words[0] == "," or words[0] in _LEADING_CONNECTIVES):
            words.pop(0)
        words = strip_filler_words(words)
        return _normalize(" ".join(words).replace(" ,", ","))


def _alternatives(words: list[str]) -> list[str]:
    """An include piece of alternatives ("a cat or a dog", "either cats or dogs") as
    ``cat or dog``: each alternative without its article; other pieces unchanged."""
    if "or" not in words[1:-1]:
        return words
    alts: list[list[str]] = [[]]
    for w in words[1:] if words[0] == "either" else words:
        if w == "or":
            alts.append([])
        else:
            alts[-1].append(w)
    alts = [strip_filler_words(a) for a in alts]
    if any(not a for a in alts):
        return words
    return [w for i, a in enumerate(alts) for w in ([] if i == 0 else ["or"]) + a]


def _term_words(words: list[str]) -> int:
    """How many words a term counts as: its longest alternative ("cat or dog": 1)."""
    count, longest = 0, 0
    for w in words:
        count = 0 if w == "or" else count + 1
        longest = max(longest, count)
    return longest


def _compound_noun(first: str, second: str | None) -> bool:
    """Whether "first second" is a WordNet noun ("parking meter", "living thing", "dining
    table"): then a participle-looking first word starts a noun phrase, not a clause."""
    if second is None:
        return False
    from sparsemm.concepts.wordnet import wordnet

    return wordnet().known(f"{first} {second}")


def _verb_like(word: str) -> bool:
    """A participle that ends a noun phrase ("no person standing", "no cars parked")."""
    if word in _NP_NOT_VERB:
        return False
    return (len(word) > 4 and word.endswith("ing")) or (len(word) > 4 and word.endswith("ed"))


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
        text = _clean(value).translate(_QUOTES).replace('"', " ").lower()
        terms = [_normalize(_strip_filler(_normalize(p))) for p in _VALUE_SPLIT_RE.split(text)]
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
        include, exclude = _parse(term)
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
