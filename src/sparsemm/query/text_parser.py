"""The one left-to-right pass that reads typed search text as include and exclude terms
(the rules are in :mod:`sparsemm.query.parse`), and the text clean-up around it."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from sparsemm.errors import SparsemmError
from sparsemm.query import cues

QUOTES = str.maketrans(
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


# A quoted part glued to the word before it (t-"shirt"): part of that word, not a phrase of
# its own (which left "t" excluded and "shirt" searched for).
_GLUED_QUOTE_RE = re.compile(r'(?<=\w-)"([^"\s]+)"')


def split_query(text: str) -> tuple[list[str], list[str]]:
    """(include terms, excluded terms) of cleaned text, before de-duplication."""
    text = _GLUED_QUOTE_RE.sub(r"\1", text.translate(QUOTES))
    return _Parser(_tokenize(text.lower())).run()


def clean_text(text: str) -> str:
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


def normalize_term(s: str) -> str:
    """Collapse whitespace and strip edge punctuation (input is already lower-case)."""
    return _strip_edges(" ".join(s.split()))


def strip_filler_words(words: list[str]) -> list[str]:
    """Strip a leading request ("show me", "I'm looking for", "there are"), articles and
    "<photo|image|...> of" from a list of words; a request is kept when nothing follows it
    ("a show dog" keeps its show: only a leading request goes)."""
    i = 0
    while True:  # "show me show me a cat": each request goes; "find a show dog" keeps show
        n = next((len(r) for r in cues.REQUESTS if tuple(words[i : i + len(r)]) == r), 0)
        if not n or len(words) <= i + n or (i and n < 2 and words[i] != "please"):
            break  # "show me" alone is not a request for "me" (see is_request)
        i += n
    while i < len(words):
        if words[i] in cues.ARTICLES:
            i += 1
        elif words[i] in cues.MEDIA and i + 1 < len(words) and words[i + 1] == "of":
            i += 2
        else:
            break
    return words[i:]


def is_request(words: list[str]) -> bool:
    """Whether ``words`` are only a request ("show me", "i'm looking for", "please")."""
    return tuple(words) in cues.REQUEST_SET


def strip_filler(term: str) -> str:
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
    """One left-to-right pass over the tokens (the rules: :mod:`sparsemm.query.parse`)."""

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
                term = normalize_term(value)
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
                or nxt in cues.PERSON_WORDS
                or nxt in ("there", "there's", "no", "not")
                or nxt in cues.CONNECTORS
                or self._word(i - 1) in cues.CONNECTORS  # "lakes and - boats"
            )
        ):
            # "a kitchen - no chair in sight", "dog - but not cat": a pause, not a minus
            self._flush(", ")
            return self._remove(i, i + 1)
        self._flush(" ")
        kind = self._kind(i + 1)
        if kind == "word":
            self.exclude.append(self.tokens[i + 1][1])
            self.removed.update((i, i + 1))
            return i + 2
        if kind == "phrase":
            term = normalize_term(self.tokens[i + 1][1])
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
        if word == "not" and nxt in cues.DOUBLE_NEG:
            end = i + 2 + (self._word(i + 2) in ("of", "from"))
            return self._remove(i, end)
        if word == "no" and (
            nxt in cues.NO_IDIOMS or (nxt == "more" and self._word(i + 2) == "than")
        ):
            self._add(word, i)  # "no fewer than", "no longer": not an exclusion
            return i + 1
        if word == "but" and self.words and all(w in cues.EVERYTHING for w in self.words):
            # "anything but cats": everything except cats
            for _ in range(len(self.words)):
                self.words.pop()
                self.removed.add(self.widx.pop())
            nps, j = self._np_list(self._past_request(i + 1, i + 1), leading=True)
            if nps:
                self.exclude += nps
                return self._remove(i, self._skip_filler(j))
        # A connector right before a cue belongs to it ("but not", "and no", "with no").
        if word in cues.CONNECTORS and self._prefix_cue(i + 1) is not None:
            self._add(word, i)
            return i + 1
        cue = self._prefix_cue(i)
        if cue is not None:
            return self._exclude_after(i, cue)
        if word in cues.PERSON_ADJECTIVES:
            self.exclude.append(cues.PERSON)  # "a deserted street": the street stays whole
            self.silent.add(i)
            return i + 1
        if word in cues.PERSON_WORDS or (word == "no" and self._word(i + 1) == "one"):
            self._drop_setup()
            self.exclude.append(cues.PERSON)
            return self._remove(i, self._skip_filler(i + (2 if word == "no" else 1)))
        post = self._postfix_cue(i)
        if post is not None:
            np = self._take_trailing_np()
            if np:
                self.exclude.append(np)
                return self._remove(i, self._skip_filler(post))
        if word in cues.SPLIT_WORDS:
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
        for cue in cues.CUES_BY_FIRST.get(w, ()):
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
        if w in cues.AUX_NEG or (w in ("does", "do", "did") and self._word(i + 1) == "not"):
            j = i + (1 if w in cues.AUX_NEG else 2)
            return j + 1 if self._word(j) in cues.HAVE_VERBS else None
        if w == "not":
            nxt = self._word(i + 1)
            if self._past_request(i + 1, i + 1) > i + 1:
                return i + 1  # "but not looking for dogs": a request, then the exclusion
            if nxt in cues.NOT_PRESENT and not self._np_start(i + 1, allow_stop=False):
                return None  # "not present", "not visible": postfix
            if nxt in cues.HAVE_VERBS:
                return i + 2  # "not wearing a hat"
            if nxt in cues.NOT_FOLLOWERS or (
                nxt is not None and _verb_like(nxt) and not _compound_noun(nxt, self._word(i + 2))
            ):
                return None  # "not on the couch", "not looking at": not an exclusion
            return i + 1
        if w in cues.NEGATIONS:
            if w == "no" and self._word(i + 1) == "one":
                return None  # "no one": a person cue
            return i + 1
        return None

    def _postfix_cue(self, i: int) -> int | None:
        """Index after a postfix cue at token i ("is absent", "not visible"), or None."""
        w = self._word(i)
        if w in cues.POSTFIX:
            # "the cat is missing" / "missing." / "absent from the scene"; not "a boy
            # missing his teeth", "gone fishing", "nowhere near the cat".
            if self._ends_clause(i + 1) or self._word(i + 1) == "from":
                return self._skip_from(i + 1)
            return None
        if w == "not" and self._word(i + 1) in cues.NOT_PRESENT:
            if self._word(i + 1) in ("in", "to") and not self._anchored_filler(i + 1):
                return None  # "not in the car": a place, not absence
            return i + 2
        if w == "out" and self._word(i + 1) == "of":
            j = i + 2 + (self._word(i + 2) in ("the", "this"))
            if self._word(j) in cues.OUT_OF:
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
        while self._word(j) in cues.FILLER:
            if self._word(j) in cues.FILLER_ANCHOR:
                return True
            j += 1
        return False

    def _np_start(self, i: int, allow_stop: bool = False) -> bool:
        """True when token i can start a noun phrase (after optional determiners)."""
        while self._word(i) in cues.DETERMINERS:
            i += 1
        if self._kind(i) == "phrase":
            return True
        w = self._word(i)
        return w is not None and (allow_stop or w not in cues.NP_STOP) and w not in cues.FILLER

    def _exclude_after(self, i: int, start: int) -> int:
        """Handle the prefix cue at tokens i..start-1: exclude the noun phrase list after it."""
        cue_words = [v for _, v in self.tokens[i:start]]
        setup = self._drop_setup()
        leading = not self.pieces and not self.words
        label = " ".join([*([setup] if setup in cues.CONNECTORS else []), *cue_words])
        j = start
        if self._kind(j) == "end" and self.tokens[j][1] == ":":
            j += 1
        nps, j = self._np_list(self._past_request(i + 1, j), leading)
        if nps and self.words and all(w in cues.EVERYTHING for w in self.words):
            for _ in range(len(self.words)):  # "anything other than cats": only the exclusion
                self.words.pop()
                self.removed.add(self.widx.pop())
        if not nps and cue_words[0] in cues.SOFT_CUES:
            return self._remove(i, j)  # "..., isn't it?": no object, nothing to exclude
        if not nps:
            raise SparsemmError(
                f"'{label}' is not followed by a term to exclude: write e.g. 'dog {label} cat'"
            )
        self.exclude += nps
        return self._remove(i, self._skip_filler(j))

    def _request_len(self, i: int) -> int:
        """How many tokens the request starting at token i takes ("show me": 2), or 0."""
        for r in cues.REQUESTS:
            if all(self._word(i + k) == w for k, w in enumerate(r)):
                return len(r)
        return 0

    def _past_request(self, first: int, start: int) -> int:
        """Where an excluded noun phrase starts when a request follows the negation ("but
        not show me dogs": dogs, although "not show" reads as a cue, "not I want cats"): the
        index after the requests that begin at a token from ``first`` on and end at or after
        ``start`` (the cue's end), as long as a noun phrase follows them; else ``start``. A
        one-word request other than "please" counts only as the cue's own verb: "no show
        dogs" excludes show dogs."""
        for p in range(first, start + 1):
            q = p
            while (n := self._request_len(q)) and self._np_start(q + n):
                if n < 2 and self._word(q) != "please" and (q >= start or q > p):
                    break
                q += n
            if q > p and q >= start:
                return q
        return start

    def _drop_setup(self) -> str | None:
        """Drop the words that only set up a cue from the end of the current piece; return
        the word right before the cue (for messages)."""
        last = self.words[-1] if self.words else None
        while self.words and self.words[-1] in cues.CUE_SETUP:
            self.words.pop()
            self.removed.add(self.widx.pop())
        return last

    # -- noun phrases --------------------------------------------------------------------
    def _np(self, i: int) -> tuple[str | None, int]:
        """The noun phrase starting at token i (determiners skipped) and the index after."""
        while self._word(i) in cues.DETERMINERS:
            i += 1
        if self._kind(i) == "phrase":
            term = normalize_term(self.tokens[i][1])
            return (term or None), i + 1
        words: list[str] = []
        while len(words) < cues.MAX_NP_WORDS:
            w = self._word(i)
            if w is None or w in cues.NP_STOP or w in cues.PERSON_WORDS:
                break
            if words and (
                w in cues.DETERMINERS or (_verb_like(w) and not _compound_noun(words[-1], w))
            ):
                break
            if w in cues.NEGATIONS:
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
            if w in cues.LIST_WORDS or comma:
                j += 1
                if comma and self._word(j) in cues.LIST_WORDS:
                    j += 1  # "forks, knives, or spoons"
                if self._word(j) in ("no", "not", "without"):
                    j += 1
                np, k = self._np(j)
                verb_first = np is not None and np.split(" ")[0] in cues.PARTICIPLES
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
        if w in cues.LIST_WORDS or w in cues.CONNECTIVES or w in cues.SPLIT_WORDS:
            return True
        if self._prefix_cue(i) is not None or w in cues.PERSON_WORDS:
            return True
        return self._skip_filler(i) > i

    def _skip_filler(self, i: int) -> int:
        """Index after presence filler starting at token i ("in the image", "to be seen")."""
        j = i
        anchor = False
        while self._word(j) in cues.FILLER:
            anchor |= self._word(j) in cues.FILLER_ANCHOR
            j += 1
        if j == i:
            return i
        kind = self._kind(j)
        boundary = kind in (None, "sep", "end", "minus") or self._word(j) in (
            cues.CONNECTIVES | cues.SPLIT_WORDS | cues.LIST_WORDS
        )
        return j if anchor or boundary else i

    def _take_trailing_np(self) -> str | None:
        """Remove and return the noun phrase at the end of the current piece (before a
        postfix cue: "a chair is missing" -> chair)."""
        words = self.words
        k = len(words)
        while k and words[k - 1] in cues.LINKING_VERBS:
            k -= 1
        start = k
        while (
            start > 0
            and k - start < cues.MAX_NP_WORDS
            and words[start - 1] not in cues.NP_STOP
            and words[start - 1] not in cues.DETERMINERS
            and words[start - 1] not in cues.CONNECTIVES
        ):
            start -= 1
        if start == k:
            return None
        np = " ".join(words[start:k])
        while start and words[start - 1] in cues.DETERMINERS:
            start -= 1
        del words[start:]
        self.removed.update(self.widx[start:])
        del self.widx[start:]
        while words and words[-1] in cues.CONNECTIVES:
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
            while words and words[0] in cues.CONNECTIVES:
                words.pop(0)
            while words and words[-1] in cues.CONNECTIVES:
                words.pop()
            if is_request(words):  # "show me no dogs", "show me: a cat"
                if len(self.pieces) > 1 or self.exclude:
                    continue
                if len(words) > 1 or words[0] == "please":  # a lone "show" is a word
                    request = " ".join(words)
                    raise SparsemmError(
                        f"{request!r} asks for nothing: type what to look for after it, "
                        "e.g. 'show me a dog' or 'a beach, no people'"
                    )
            words = _alternatives(strip_filler_words(words))
            if words and all(w in cues.MEDIA for w in words) and len(self.pieces) == 1:
                continue  # "photos without text": nothing to include
            if words:
                pieces.append(_Piece(words, sep=p.sep))
        if not pieces:
            return []
        plain = [p for p in pieces if not p.quoted]
        if all(_term_words(p.words) <= cues.MAX_TERM_WORDS for p in plain) and (
            sum(_term_words(p.words) for p in plain) <= cues.MAX_LABEL_WORDS
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
            elif kind == "phrase" and normalize_term(value):
                items.append(normalize_term(value))
            elif kind in ("sep", "end") and items and items[-1] not in (",", None):
                items.append(",")

        def near_cut(j: int, step: int) -> bool:
            j += step
            while 0 <= j < len(items) and items[j] == ",":
                j += step
            return not 0 <= j < len(items) or items[j] is None

        words: list[str] = []
        for j, w in enumerate(items):
            if w is None or (w in cues.CONNECTIVES and (near_cut(j, 1) or near_cut(j, -1))):
                if words and words[-1] != ",":
                    words.append(",")
                continue
            if w == "," and (not words or words[-1] == ","):
                continue
            words.append(w)
        while words and words[-1] in (",", *cues.CONNECTIVES):
            words.pop()
        while words and (words[0] == "," or words[0] in cues.LEADING_CONNECTIVES):
            words.pop(0)
        words = strip_filler_words(words)
        return normalize_term(" ".join(words).replace(" ,", ","))


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
    if word in cues.NP_NOT_VERB:
        return False
    return (len(word) > 4 and word.endswith("ing")) or (len(word) > 4 and word.endswith("ed"))
