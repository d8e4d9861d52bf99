"""The WordNet 3.0 noun hierarchy, read from the small file shipped in the package.

``data/wordnet-nouns.json.gz`` is derived once from Debian's ``wordnet-base`` by
``scripts/derive_wordnet.py`` (WordNet's licence is beside it, ``data/WORDNET-LICENSE``): every
noun synset with its lemmas, their sense numbers and its hypernyms (instance hypernyms
included, and which synsets are instances: "Day" the writer Clarence Day, "Paris"), plus the
noun exception list for irregular plurals, the one-word verbs, adjectives and adverbs
that are not nouns (:meth:`WordNet.english`), and the nouns more often used as adjectives
(:meth:`WordNet.modifier`). Users need nothing else.

A synset is addressed by its index in the file (an ``int``); :meth:`WordNet.wnid` gives the
ImageNet-style id (``n02084071`` for dog.n.01). Lookups go through WordNet's own noun
morphology (``dogs`` -> ``dog``, ``mice`` -> ``mouse``, ``buses`` -> ``bus``, ``hot dogs``
-> ``hot dog``) and list a word's senses most frequent first.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import unicodedata
from importlib import resources
from typing import Any

from sparsemm.errors import SparsemmError

DATA_FILE = "wordnet-nouns.json.gz"
FORMAT = "sparsemm.wordnet-nouns"
# Is-a edges sparsemm adds to WordNet 3.0, where everyday usage and WordNet disagree:
# WordNet files buses and trains under "public transport", a conveyance, not a vehicle, and
# a mug (ImageNet's "coffee mug") beside the cup under "drinking vessel", where people (and
# COCO's "cup" category) call a mug a cup; ImageNet's "hen" and "cock" are WordNet's
# adult female and male bird of any kind, where its photos (and people) mean chickens.
EXTRA_PARENTS = {
    "n04019101": ("n04524313",),  # public transport -> vehicle
    "n03797390": ("n03147509",),  # mug -> cup
    "n01514859": ("n01791625",),  # hen -> chicken (Gallus gallus), so domestic fowl
    "n01514668": ("n01791625",),  # cock -> chicken
}

# WordNet's noun detachment rules (morphy): suffix -> replacement, tried in this order
_NOUN_RULES = (
    ("ses", "s"),
    ("xes", "x"),
    ("zes", "z"),
    ("ches", "ch"),
    ("shes", "sh"),
    ("men", "man"),
    ("ies", "y"),
    ("s", ""),
)
# WordNet's verb and adjective detachment rules (morphy), for :meth:`WordNet.english`
_OTHER_RULES = (
    ("s", ""),
    ("ies", "y"),
    ("es", "e"),
    ("es", ""),
    ("ed", "e"),
    ("ed", ""),
    ("ing", "e"),
    ("ing", ""),
    ("er", ""),
    ("est", ""),
    ("er", "e"),
    ("est", "e"),
    ("ier", "y"),
    ("iest", "y"),
)
# lexicographer files of nouns (lex_filenum 03-28)
LEXNAMES = {
    3: "Tops",
    4: "act",
    5: "animal",
    6: "artifact",
    7: "attribute",
    8: "body",
    9: "cognition",
    10: "communication",
    11: "event",
    12: "feeling",
    13: "food",
    14: "group",
    15: "location",
    16: "motive",
    17: "object",
    18: "person",
    19: "phenomenon",
    20: "plant",
    21: "possession",
    22: "process",
    23: "quantity",
    24: "relation",
    25: "shape",
    26: "state",
    27: "substance",
    28: "time",
}


def normalise(text: str) -> str:
    """A lemma key: lower case, words joined by single spaces (``Hot_Dog`` -> ``hot dog``),
    accents dropped as WordNet spells its words (``café`` -> ``cafe``); hyphens are kept
    (WordNet has ``t-shirt``)."""
    text = unicodedata.normalize("NFKD", str(text))
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(re.sub(r"[_\s]+", " ", text).strip().lower().split())


class WordNet:
    """Noun synsets, their lemmas and the is-a hierarchy (see the module docstring)."""

    def __init__(self, data: dict[str, Any]) -> None:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SparsemmError("the packaged WordNet file is damaged; reinstall sparsemm")
        self.offsets: list[int] = list(data["offsets"])
        self.lexfiles: list[int] = list(data["lexfiles"])
        self._lemmas: list[str] = list(data["lemmas"])  # "dog|domestic_dog|Canis_familiaris"
        self.parents: list[list[int]] = data["parents"]
        self.exceptions: dict[str, str] = {
            normalise(k): normalise(v) for k, v in data["exceptions"].items()
        }
        n = len(self.offsets)
        if not (len(self.lexfiles) == len(self._lemmas) == len(self.parents) == n):
            raise SparsemmError("the packaged WordNet file is damaged; reinstall sparsemm")
        self._senses: dict[str, list[int]] = data["senses"]
        self._instances = frozenset(int(i) for i in data["instances"])
        self._other_words = frozenset(str(w) for w in data["other_words"])
        self._modifiers = frozenset(str(w) for w in data.get("modifiers", ()))
        self._children: list[tuple[int, ...]] | None = None
        self._by_wnid: dict[str, int] | None = None
        for child, extra in EXTRA_PARENTS.items():
            c = self.by_wnid(child)
            ps = [p for p in (self.by_wnid(w) for w in extra) if p is not None]
            if c is not None:
                self.parents[c] = list(dict.fromkeys([*self.parents[c], *ps]))

    def __len__(self) -> int:
        return len(self.offsets)

    # -- names ---------------------------------------------------------------------------
    def wnid(self, i: int) -> str:
        """ImageNet-style id of synset ``i`` (``n`` + 8-digit offset)."""
        return f"n{self.offsets[i]:08d}"

    def by_wnid(self, wnid: str) -> int | None:
        if self._by_wnid is None:
            self._by_wnid = {f"n{off:08d}": i for i, off in enumerate(self.offsets)}
        return self._by_wnid.get(str(wnid))

    def lemmas(self, i: int) -> tuple[str, ...]:
        """The synset's lemmas, spaces for underscores (``hot dog``, ``Canis familiaris``)."""
        return tuple(self._lemmas[i].replace("_", " ").split("|"))

    def name(self, i: int) -> str:
        """The synset's first lemma (``dog``, ``hot dog``)."""
        return self.lemmas(i)[0]

    @property
    def children(self) -> list[tuple[int, ...]]:
        """Direct hyponyms (and instances) of every synset, built on first use."""
        if self._children is None:
            kids: list[list[int]] = [[] for _ in range(len(self.offsets))]
            for i, ps in enumerate(self.parents):
                for p in ps:
                    kids[p].append(i)
            self._children = [tuple(c) for c in kids]
        return self._children

    def lexname(self, i: int) -> str:
        return LEXNAMES.get(self.lexfiles[i], "?")

    # -- lookup --------------------------------------------------------------------------
    def base_forms(self, text: str) -> list[str]:
        """Lemma keys ``text`` may stand for: itself, its exception-list base form, and its
        morphology detachments (on the last word of a phrase), those in WordNet first."""
        key = normalise(text)
        if not key:
            return []
        head, _, last = key.rpartition(" ")
        prefix = f"{head} " if head else ""
        forms = [key]
        if key in self.exceptions:
            forms.append(self.exceptions[key])
        if last in self.exceptions:
            forms.append(prefix + self.exceptions[last])
        for suffix, repl in _NOUN_RULES:
            if last.endswith(suffix) and len(last) > len(suffix):
                forms.append(prefix + last[: -len(suffix)] + repl)
        if last.endswith("ful") and len(last) > 3:  # "boxesful"-style compounds are rare
            forms.append(prefix + last[:-3])
        return [f for f in dict.fromkeys(forms) if f in self._senses] or []

    def lookup(self, text: str) -> tuple[int, ...]:
        """Noun synsets of ``text``, most frequent sense first (empty when WordNet has no
        such noun). The exact word's senses come before those of a base form."""
        out: list[int] = []
        for form in self.base_forms(text):
            out += [i for i in self._senses[form] if i not in out]
        return tuple(out)

    def known(self, text: str) -> bool:
        return bool(self.base_forms(text))

    def instance(self, i: int) -> bool:
        """True when synset ``i`` is a named instance (a person, place or work: "Day" as
        Clarence Day), not a kind of thing."""
        return i in self._instances

    def english(self, word: str) -> bool:
        """Whether ``word`` is an English word WordNet knows in any part of speech (a noun,
        or a verb, adjective or adverb, also inflected: "running", "sunnier", "indoors")."""
        key = normalise(word)
        if self.known(key) or key in self._other_words:
            return True
        for suffix, repl in _OTHER_RULES:
            if key.endswith(suffix) and len(key) > len(suffix) + 1:
                stem = key[: -len(suffix)] + repl
                if stem in self._other_words or self.known(stem):
                    return True
                if not repl and stem[-1] == stem[-2] and stem[:-1] in self._other_words:
                    return True  # "running" -> run, "bigger" -> big
        return False

    def modifier(self, word: str) -> bool:
        """Whether ``word`` is a noun used more often as an adjective (by WordNet's
        sense-tagged counts): "nice" (not the city), "good", "lovely", "young"."""
        return normalise(word) in self._modifiers

    # -- hierarchy ------------------------------------------------------------------------
    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one WordNet per process
    def ancestors(self, i: int) -> frozenset[int]:
        """Every hypernym of ``i`` up to ``entity`` (not ``i`` itself)."""
        out: set[int] = set()
        for p in self.parents[i]:
            out.add(p)
            out |= self.ancestors(p)
        return frozenset(out)

    def descendants(self, i: int) -> frozenset[int]:
        """Every hyponym (and instance) below ``i`` (not ``i`` itself)."""
        out: set[int] = set()
        todo = list(self.children[i])
        while todo:
            c = todo.pop()
            if c not in out:
                out.add(c)
                todo.extend(self.children[c])
        return frozenset(out)

    def is_a(self, i: int, ancestor: int) -> bool:
        """True when ``i`` is ``ancestor`` or below it."""
        return i == ancestor or ancestor in self.ancestors(i)

    def distance(self, i: int, ancestor: int) -> int | None:
        """Hypernym steps from ``i`` up to ``ancestor`` (0 for itself; None when it is not
        an ancestor)."""
        frontier, seen, steps = {i}, {i}, 0
        while frontier:
            if ancestor in frontier:
                return steps
            frontier = {p for f in frontier for p in self.parents[f]} - seen
            seen |= frontier
            steps += 1
        return None

    def depth(self, i: int) -> int:
        """Length of the shortest hypernym path from ``i`` to the root."""
        steps, frontier = 0, {i}
        while frontier and not any(not self.parents[f] for f in frontier):
            frontier = {p for f in frontier for p in self.parents[f]}
            steps += 1
        return steps


@functools.lru_cache(maxsize=1)
def wordnet() -> WordNet:
    """The packaged WordNet noun hierarchy (read once per process, about 0.2 s)."""
    try:
        raw = resources.files("sparsemm.concepts").joinpath("data", DATA_FILE).read_bytes()
        return WordNet(json.loads(gzip.decompress(raw)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SparsemmError(
            f"the packaged WordNet file ({DATA_FILE}) cannot be read ({exc}); reinstall sparsemm"
        ) from exc
