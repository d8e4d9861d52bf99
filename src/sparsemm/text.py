"""Text helpers shared by every layer: caption tokens, singular content tokens and caption
mention lookup.

Tokenisation rule (:func:`tokenize`; one definition used everywhere in sparsemm):

1. lower-case the text;
2. split on every character that is not a letter (whitespace, digits, punctuation,
   apostrophes, underscores), so "don't" -> "don", "t" and "tennis-racket" -> "tennis",
   "racket";
3. drop the words in ``STOP_WORDS`` (below).

``term_tokens`` is the tokenizer of query terms, caption mentions and detector vocabularies
(:func:`tokenize`, then a crude English singular), so "dogs", "Dog." and "dog" are one
term. :class:`CaptionIndex` answers "does some caption of item i mention t?".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from sparsemm.errors import SparsemmError

# Runs of letters (any script): \w minus digits and underscore.
_WORD_RE = re.compile(r"[^\W\d_]+")

# English function words: articles, pronouns, auxiliaries and modal verbs, prepositions,
# conjunctions, common adverbs/determiners, plus the fragments that splitting on apostrophes
# leaves behind ("it's" -> "s", "don't" -> "don" + "t", "we'll" -> "ll", ...). Content words
# that matter for image captions (colours, numbers written as words, "top", "front", "side")
# are deliberately kept.
STOP_WORDS: frozenset[str] = frozenset(
    """
    a an the
    i me my myself mine we us our ours ourselves you your yours yourself yourselves
    he him his himself she her hers herself it its itself they them their theirs themselves
    this that these those who whom whose which what whatever whoever
    am is are was were be been being have has had having do does did doing done
    will would shall should can could may might must ought
    and or but nor if then else than because as so though although while whereas unless
    until whether
    of at by for with without within about against between into through during before after
    above below to from up down in out on off over under again further upon onto via per
    toward towards among amongst across along around behind beside besides beyond near
    here there when where why how
    all any both each few more most other some such no not only own same too very just
    also even ever yet still already quite rather
    s t d ll m o re ve y
    don didn doesn isn aren wasn weren hasn haven hadn won wouldn shouldn couldn mustn
    needn shan mightn ain
    """.split()
)


def tokenize(text: str, stop_words: frozenset[str] = STOP_WORDS) -> list[str]:
    """Lower-cased letter runs of ``text`` minus ``stop_words`` (see module docstring)."""
    return [w for w in _WORD_RE.findall(text.lower()) if w not in stop_words]


def is_token(word: str, stop_words: frozenset[str] = STOP_WORDS) -> bool:
    """True when ``tokenize`` can produce ``word`` (lower-case letters only, not a stop word)."""
    return tokenize(word, stop_words) == [word]


TERM_TEMPLATE = "a photo of a {}"  # how a label-like query term is embedded (docs/negation.md)
TEMPLATE_MAX_WORDS = 3  # longer terms are phrases, embedded as written (parse.MAX_TERM_WORDS)


def term_text(term: str, template: str = TERM_TEMPLATE) -> str:
    """The text embedded for a query term: the template around a label-like term ("a photo
    of a dog"); a longer phrase (a sentence's include) as written."""
    return term if len(term.split()) > TEMPLATE_MAX_WORDS else template.format(term)


def singular(token: str) -> str:
    """Crude English singular: dogs -> dog, glasses -> glass, buses -> bus, skies -> sky."""
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 4 and token.endswith(("sses", "shes", "ches", "xes", "uses")):
        return token[:-2]
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


def plural(word: str) -> str:
    """The plural of a word or phrase, on its last word ("old man" -> "old men")."""
    head, _, w = " ".join(word.lower().split()).rpartition(" ")
    irregular = {"person": "people", "man": "men", "woman": "women", "child": "children"}
    if w in irregular:
        w = irregular[w]
    elif w in irregular.values():
        pass
    elif w.endswith("y") and not w.endswith(("ay", "ey", "oy", "uy")):
        w = w[:-1] + "ies"
    elif not w.endswith("s"):
        w += "s"
    return f"{head} {w}" if head else w


def term_tokens(text: str) -> list[str]:
    """Content tokens of ``text`` (:func:`tokenize`) in singular form."""
    return [singular(t) for t in tokenize(text)]


def _contains(tokens: Sequence[str], phrase: Sequence[str]) -> bool:
    n = len(phrase)
    return any(list(tokens[i : i + n]) == list(phrase) for i in range(len(tokens) - n + 1))


class CaptionIndex:
    """Token lookup over items' captions for "does some caption of item i mention t?".

    A caption mentions a term when its singular content tokens (:func:`term_tokens`) contain
    the term's tokens as a contiguous phrase ("dining table" needs "dining table"). A
    multi-word term matched by fewer than ``min_positives`` items, or by fewer than
    ``head_ratio`` times the items its last word (the head noun) matches - a rare
    specification of a common head, "dining table" vs "table" - also matches its head noun.
    A term without content tokens matches nothing. With ``labels`` (item i's object labels,
    or tags), an item labelled with the term (same singular tokens) mentions it too.
    """

    def __init__(
        self, captions: Sequence[Sequence[str]], labels: Sequence[Sequence[str]] | None = None
    ) -> None:
        self.n_items = len(captions)
        if labels is not None and len(labels) != self.n_items:
            raise SparsemmError(
                f"reference labels have {len(labels)} rows for {self.n_items} items"
            )
        self._labels: dict[tuple[str, ...], np.ndarray] = {}
        for i, labs in enumerate(labels or []):
            for lab in labs:
                key = tuple(term_tokens(str(lab)))
                self._labels.setdefault(key, np.zeros(self.n_items, dtype=bool))[i] = True
        self._tokens = [[term_tokens(c) for c in caps] for caps in captions]
        self._postings: dict[str, set[int]] = {}
        for i, caps in enumerate(self._tokens):
            for toks in caps:
                for tok in toks:
                    self._postings.setdefault(tok, set()).add(i)

    def _match(self, phrase: Sequence[str]) -> np.ndarray:
        hit = np.zeros(self.n_items, dtype=bool)
        cand = set.intersection(*(self._postings.get(t, set()) for t in phrase))
        for i in cand:
            if len(phrase) == 1 or any(_contains(t, phrase) for t in self._tokens[i]):
                hit[i] = True
        return hit

    def labelled(self, term: str) -> np.ndarray:
        """(n_items,) bool: item i carries a label equal to ``term`` (singular forms)."""
        hit = self._labels.get(tuple(term_tokens(term)))
        return np.zeros(self.n_items, dtype=bool) if hit is None else hit

    def mentions(self, term: str, min_positives: int = 5, head_ratio: float = 0.1) -> np.ndarray:
        """(n_items,) bool: some caption of item i mentions ``term``, or i is labelled so."""
        phrase = term_tokens(term)
        if not phrase:
            return np.zeros(self.n_items, dtype=bool)
        hit = self._match(phrase)
        if len(phrase) > 1:
            head = self._match(phrase[-1:])
            if hit.sum() < max(min_positives, head_ratio * head.sum()):
                hit = hit | head
        return hit | self.labelled(term) if self._labels else hit


def caption_mentions(
    captions: Sequence[Sequence[str]], term: str, min_positives: int = 5, head_ratio: float = 0.1
) -> np.ndarray:
    """(n_items,) bool: some caption of item i mentions ``term`` (rules: :class:`CaptionIndex`)."""
    return CaptionIndex(captions).mentions(term, min_positives, head_ratio)
