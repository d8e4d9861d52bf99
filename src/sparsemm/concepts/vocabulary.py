"""What a query term means to a model: its detectable units, grounded in WordNet.

Every model knows a fixed set of *units*: things it can tell are in a picture (the 1000
ImageNet classes and a face detector's "person" for the photo model, the caption words that
have detectors for SR, the vocabulary concepts of CLIP). :class:`ConceptVocabulary` places
each unit at a WordNet noun synset and reads a query term as the units that cover it:

1. the term's noun senses, most frequent first, keeping those that are physical things
   (below ``physical entity``); everyday words WordNet reads otherwise are mapped first
   (:data:`OVERRIDES`: "people" is a group noun there, the plural of "person" here);
2. the first sense that has units at it or below it is the reading: "vehicle" covers
   car, bus, minivan, canoe, ...; "dog" every breed (``how`` = "exact" when one unit sits at
   the sense itself and nothing else, else "narrower");
3. units a scene *implies* count too, with a weight below 1 (``implied``: a lakeside
   implies water), for words no unit names ("sky", "water", "grass");
4. a sense with nothing at or below it is read as a stand-in hypernym (:data:`STAND_INS`:
   person, dog) within ``max_broader`` steps when it has one ("woman" as "person": the model
   cannot tell women from men), and the reading says so (``how`` = "broader", with a
   ``note``); other words are not widened ("kitchen" is not searched as "area");
5. a phrase ("a cup of coffee", "a boat on a lake") is read noun by noun (longest WordNet
   nouns first, filler words such as "group", "photo" and "kind" left out): all its nouns
   must be present; a noun with no units is left out with a note when another one is read;
6. a term with no reading is refused (:class:`UnknownTerm`) with the closest concepts the
   model knows (by the model's text similarity when it has one, else by spelling).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

from sparsemm.concepts.wordnet import WordNet, normalise, wordnet
from sparsemm.errors import SparsemmError

PHYSICAL_ENTITY = "n00001930"
SENSES_FILE = "senses.json"
# Everyday words WordNet files under another sense: the word -> the word to read instead.
OVERRIDES: dict[str, str] = {
    "kitten": "cat",
    "kittens": "cat",
    "kitty": "cat",
    "people": "person",
    "persons": "person",
    "folks": "person",
    "human": "person",
    "humans": "person",
    "human being": "person",
    "somebody": "person",
    "someone": "person",
    "anybody": "person",
    "anyone": "person",
    "nobody": "person",
    "kids": "child",
    "guy": "man",
    "guys": "man",
    "motorbike": "motorcycle",
    "motorbikes": "motorcycle",
    "electronics": "electronic device",  # the devices, not the branch of physics
}
# Readings WordNet offers that a photo search should not take: (word, wnid of the sense).
# "galaxy" is also a rare name of the plant galax; a "plant" in a photo is rarely a factory.
# Blocking a word's sense blocks it for the word as typed; its base form ("plants" ->
# "plant") is looked up with its own entry.
BLOCKED: frozenset[tuple[str, str]] = frozenset(
    {
        ("galaxy", "n12251278"),
        ("plant", "n03956922"),
        ("plants", "n03956922"),
        ("food", "n00021265"),  # food as nutrient holds every drink; photos mean solid food
        ("foods", "n00021265"),
    }
)
# The hypernyms a narrower word may be searched as when the model has nothing narrower
# (step 4 of the module docstring): a woman as a person, a puppy as a dog. Others are
# refused: "kitchen" is not usefully searched as "area", nor "trees" as "vascular plant".
STAND_INS = ("n00007846", "n02084071")  # person.n.01, dog.n.01
# Words of a phrase that frame it rather than name a thing in the picture.
# words for people a typo may have meant, though the model widens them to "person"
EVERYDAY_PEOPLE = frozenset(
    "man men woman women child children boy boys girl girls baby babies kid kids".split()
)
FILLER = frozenset(
    "photo photos photograph picture pictures image images shot snapshot view close-up "
    "closeup scene kind kinds type sort group groups bunch lot lots couple pair number "
    "something thing things stuff one ones some any front side top bottom middle center "
    "centre background foreground part piece set".split()
)
STOP = frozenset(
    "a an the of on in at with and or to for from by near over under into onto its their "
    "his her my our your this that these those there is are was were be being some".split()
)
# Words that only say something is shown ("I can see a dog", "a picture showing a cat"):
# a phrase of things named around them is read as those things.
PRESENCE = frozenset(
    "i we you it can could see seen visible shows show showing shown contains containing "
    "has have having here".split()
)


class UnknownTerm(SparsemmError):
    """A query term the model has no concept for (``suggestions``: what it does know)."""

    def __init__(self, term: str, message: str, suggestions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.term = term
        self.suggestions = list(suggestions)


@dataclass(frozen=True)
class Concept:
    """One noun of a term, read as the units that cover it."""

    term: str  # the word(s) as typed ("trees")
    label: str  # what they were read as ("tree", "person")
    units: tuple[tuple[int, float], ...]  # (unit, weight <= 1): weight < 1 for implied units
    how: str  # "exact" | "narrower" | "implied" | "broader" | "name"
    synset: int | None = None
    note: str = ""


@dataclass(frozen=True)
class Reading:
    """A query term read as concepts that must all be present."""

    term: str
    concepts: tuple[Concept, ...]
    ignored: tuple[str, ...] = ()  # nouns of the phrase that name nothing the model knows

    @property
    def notes(self) -> list[str]:
        out = [c.note for c in self.concepts if c.note]
        if self.ignored:
            what = ", ".join(repr(w) for w in self.ignored)
            out.append(f"{what} in {self.term!r} left out: nothing this model can see")
        return out


@dataclass
class _Index:
    under: dict[int, dict[int, float]] = field(default_factory=dict)  # synset -> {unit: w}


class ConceptVocabulary:
    """A model's units placed in WordNet (see the module docstring).

    ``names``: one display name per unit; ``synsets``: its WordNet synset (index in
    :func:`~sparsemm.concepts.wordnet.wordnet`), a tuple of synsets (a face detector's unit
    is both "person" and "face") or None; ``implied``: synset -> [(unit,
    weight)] of units that imply it; ``similar``: (term, k) -> up to k unit names closest
    in meaning (the model's text encoder), for refusals.
    """

    def __init__(
        self,
        names: Sequence[str],
        synsets: Sequence[int | tuple[int, ...] | None],
        implied: Mapping[int, Sequence[tuple[int, float]]] | None = None,
        max_broader: int = 6,
        similar: Callable[[str, int], list[str]] | None = None,
        wn: WordNet | None = None,
    ) -> None:
        if len(names) != len(synsets):
            raise SparsemmError("give one synset (or None) per unit name")
        self.wn = wn if wn is not None else wordnet()
        self.names = [str(n) for n in names]
        self.synsets: list[tuple[int, ...]] = [
            () if s is None else (s,) if isinstance(s, int) else tuple(s) for s in synsets
        ]
        self.max_broader = int(max_broader)
        self.similar = similar
        pe = self.wn.by_wnid(PHYSICAL_ENTITY)
        self._physical = pe
        idx = _Index()
        for u, ss in enumerate(self.synsets):
            for s in ss:
                for a in {s} | self.wn.ancestors(s):
                    idx.under.setdefault(a, {})[u] = 1.0
        for s, pairs in (implied or {}).items():
            for a in {s} | self.wn.ancestors(s):
                slot = idx.under.setdefault(a, {})
                for u, w in pairs:
                    if not 0.0 < float(w) <= 1.0:
                        raise SparsemmError(f"implied weight {w} of unit {u} is not in (0, 1]")
                    slot[int(u)] = max(slot.get(int(u), 0.0), float(w))
        self._under = idx.under
        self._stand_ins = {i for i in (self.wn.by_wnid(w) for w in STAND_INS) if i is not None}
        self._implied_keys = {int(s) for s in (implied or {})}
        self._by_name: dict[str, list[int]] = {}
        for u, n in enumerate(self.names):
            self._by_name.setdefault(normalise(n), []).append(u)

    def __len__(self) -> int:
        return len(self.names)

    # -- coverage ------------------------------------------------------------------------
    def covering(self, synset: int) -> dict[int, float]:
        """{unit: weight} of the units at or below ``synset`` (weight 1) and of those that
        imply it or something below it (their implied weight)."""
        return dict(self._under.get(synset, {}))

    def _at(self, synset: int) -> list[int]:
        """Units placed exactly at ``synset``."""
        return [
            u
            for u, w in self._under.get(synset, {}).items()
            if w >= 1.0 and synset in self.synsets[u]
        ]

    def physical(self, synset: int) -> bool:
        return self._physical is not None and (
            synset == self._physical or self._physical in self.wn.ancestors(synset)
        )

    def _senses(self, word: str) -> list[int]:
        key = normalise(word)
        key = OVERRIDES.get(key, key)
        return [
            s
            for s in self.wn.lookup(key)
            if self.physical(s) and (key, self.wn.wnid(s)) not in BLOCKED
        ]

    # -- reading ---------------------------------------------------------------------------
    def read_noun(self, word: str) -> Concept | None:
        """The reading of one noun (or WordNet compound), or None when it has none."""
        key = normalise(word)
        if not key:
            return None
        senses = self._senses(key)
        # a sense that has a unit made for this very word comes first ("cutlery": the
        # eating utensils a detector was fitted for, before the cutting tools)
        named = [
            s
            for s in senses
            if any(normalise(self.names[u]) in (key, OVERRIDES.get(key, key)) for u in self._at(s))
        ]
        for s in [*named, *(x for x in senses if x not in named)]:
            units = self.covering(s)
            if not units:
                continue
            direct = [u for u, w in units.items() if w >= 1.0]
            how = "implied" if not direct else "narrower"
            if len(units) == 1 and direct and s in self.synsets[direct[0]]:
                how = "exact"
            label = self.wn.name(s)
            note = ""
            if how == "implied":
                shown = ", ".join(self.names[u] for u, _ in sorted(units.items(), key=_by_w)[:3])
                note = f"{word!r} is judged from what implies it ({shown}, ...)"
            return Concept(word, label, _sorted(units), how, s, note)
        by_name = self._by_name.get(key) or self._by_name.get(OVERRIDES.get(key, key))
        if by_name:  # a unit whose word WordNet does not know
            return Concept(word, self.names[by_name[0]], tuple((u, 1.0) for u in by_name), "name")
        for s in senses[:1]:  # a stand-in hypernym of the main sense (a woman -> person)
            for p in sorted(self._stand_ins):
                steps = self.wn.distance(s, p)
                if steps is None or not 0 < steps <= self.max_broader or not self.covering(p):
                    continue
                label = self.wn.name(p)
                note = (
                    f"{word!r} is searched as {label!r}: this model cannot tell "
                    f"{_plural(word)} from other {_plural(label)}"
                )
                return Concept(word, label, _sorted(self.covering(p)), "broader", p, note)
        return None

    def read(self, term: str) -> Reading:
        """The reading of a query term; :class:`UnknownTerm` when it names nothing the
        model can see."""
        text = normalise(term)
        whole = self.read_noun(text) if text else None
        if whole is not None:
            return Reading(term, (whole,))
        words = [w for w in re.findall(r"[a-z0-9][a-z0-9'\-]*", text) if w not in STOP]
        concepts: list[Concept] = []
        ignored: list[str] = []
        i = 0
        while i < len(words):
            for n in (3, 2, 1):
                chunk = " ".join(words[i : i + n])
                if len(words[i : i + n]) < n:
                    continue
                if n == 1 and chunk in FILLER:
                    i += 1
                    break
                if n > 1 and not self.wn.known(chunk):
                    continue
                c = self.read_noun(chunk)
                if c is not None:
                    concepts.append(c)
                    i += n
                    break
                if n == 1:
                    if self.wn.known(chunk) or chunk in OVERRIDES:
                        ignored.append(chunk)
                    elif not chunk.isdigit():
                        ignored.append(chunk)
                    i += 1
                    break
            else:  # pragma: no cover - the n == 1 case always breaks
                i += 1
        if not concepts:
            raise UnknownTerm(term, self.refusal(term), self.suggest(term))
        seen: set[tuple[tuple[int, float], ...]] = set()
        unique = []
        for c in concepts:  # "dog and dogs" is one concept
            if c.units not in seen:
                seen.add(c.units)
                unique.append(c)
        return Reading(term, tuple(unique), tuple(ignored))

    def read_names(self, term: str) -> Reading | None:
        """``term`` read as the things it names when it says nothing else ("there is a dog",
        "a photo with a couch and a chair"): every word is a stop, filler or presence word
        or part of a noun with a reading. None when some word is not (a description such as
        "a man making pizza" is not a list of things)."""
        tokens = re.findall(r"[a-z0-9][a-z0-9'\-]*", normalise(term))
        # runs of content words: a multi-word name never spans a dropped word ("a couch
        # and a chair" is not the pair "couch chair")
        runs: list[list[str]] = [[]]
        for w in tokens:
            if w in STOP or w in PRESENCE or w in FILLER:
                runs.append([])
            else:
                runs[-1].append(w)
        concepts: list[Concept] = []
        for words in runs:
            i = 0
            while i < len(words):
                for n in (3, 2, 1):
                    if i + n > len(words):
                        continue
                    chunk = " ".join(words[i : i + n])
                    if not self._names_a_thing(chunk):
                        continue
                    c = self.read_noun(chunk)
                    if c is not None and c.how != "broader":
                        concepts.append(c)
                        i += n
                        break
                else:
                    return None
        if not concepts:
            return None
        unique = {c.units: c for c in concepts}
        return Reading(term, tuple(unique.values()))

    def _names_a_thing(self, chunk: str) -> bool:
        """Whether a word is mainly a thing: its most frequent noun sense is physical ("dog",
        "glass"), not an act ("making") or a time; or it names a unit WordNet lacks that
        still has a place in the hierarchy ("sports ball", not a caption bigram such as
        "men standing")."""
        key = normalise(chunk)
        key = OVERRIDES.get(key, key)
        senses = [s for s in self.wn.lookup(key) if (key, self.wn.wnid(s)) not in BLOCKED]
        if not senses:  # a unit WordNet lacks, placed in the hierarchy ("sports ball")
            return any(self.synsets[u] for u in self._by_name.get(key, ()))
        return self.physical(senses[0])

    def refusal(self, term: str) -> str:
        if not self._senses_any(term):
            typo = self.spelling(term)
            if typo:  # a misspelt word: say what it probably is
                return f"{term!r} is not a noun WordNet knows; did you mean {' or '.join(typo)}?"
        near = self.suggest(term)
        known = (
            "WordNet has no such noun"
            if not self._senses_any(term)
            else ("this model has nothing that shows it")
        )
        hint = f"; closest concepts it knows: {', '.join(near)}" if near else ""
        return f"{term!r} is not something this model can see ({known}){hint}"

    def spelling(self, term: str, k: int = 3) -> list[str]:
        """Up to ``k`` nouns one or two edits (a letter left out, added, changed or two
        swapped) from a one-word ``term`` that the model reads as themselves: what a typo
        ("dgo") probably meant. Closer words first, then words with more senses."""
        word = normalise(term)
        if not re.fullmatch(r"[a-z]{3,20}", word):
            return []
        near1 = _edits(word)
        found: dict[str, int] = {}
        for dist, cands in ((1, near1), (2, {e2 for e in near1 for e2 in _edits(e)})):
            for c in sorted(cands):
                if c != word and c not in found and self.wn.known(c):
                    found[c] = dist
            if found:
                break
        readable = []
        for c in sorted(found, key=lambda c: (found[c], -len(self.wn.lookup(c)), c)):
            try:
                concept = self.read_noun(c)
            except SparsemmError:
                continue
            # words the model reads as themselves, and everyday words for people: not the
            # many roles and names WordNet files under "person"
            if concept is not None and (concept.how != "broader" or c in EVERYDAY_PEOPLE):
                readable.append(c)
            if len(readable) == k:
                break
        return readable

    def _senses_any(self, term: str) -> bool:
        words = [w for w in re.findall(r"[a-z0-9][a-z0-9'\-]*", normalise(term)) if w]
        return any(self.wn.known(w) for w in words) or self.wn.known(normalise(term))

    def suggest(self, term: str, k: int = 3) -> list[str]:
        """Up to ``k`` names closest to ``term``: what a misspelt word probably meant, else
        unit names by the model's text similarity when it has one, else by spelling."""
        if not self._senses_any(term):
            typo = self.spelling(term, k)
            if typo:
                return typo
        if self.similar is not None:
            try:
                return list(dict.fromkeys(self.similar(term, k)))[:k]
            except SparsemmError:
                pass
        names = list(dict.fromkeys(normalise(n) for n in self.names))
        return difflib.get_close_matches(normalise(term), names, n=k, cutoff=0.6)


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _edits(word: str) -> set[str]:
    """Every string one deletion, transposition, replacement or insertion from ``word``."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    out = {a + b[1:] for a, b in splits if b}
    out |= {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    out |= {a + c + b[1:] for a, b in splits if b for c in _LETTERS}
    out |= {a + c + b for a, b in splits for c in _LETTERS}
    return out


def _by_w(item: tuple[int, float]) -> tuple[float, int]:
    return (-item[1], item[0])


def _sorted(units: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    return tuple(sorted(units.items()))


def _plural(word: str) -> str:
    w = normalise(word)
    irregular = {"person": "people", "man": "men", "woman": "women", "child": "children"}
    if w in irregular:
        return irregular[w]
    if w.endswith("y") and not w.endswith(("ay", "ey", "oy", "uy")):
        return w[:-1] + "ies"
    return w if w.endswith("s") else w + "s"


@functools.lru_cache(maxsize=1)
def sense_table() -> dict[str, str]:
    """The packaged word -> wnid table of the senses units are placed at
    (``data/senses.json``)."""
    raw = resources.files("sparsemm.concepts").joinpath("data", SENSES_FILE).read_text("utf-8")
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("format") != "sparsemm.senses":
        raise SparsemmError(f"the packaged {SENSES_FILE} is damaged; reinstall sparsemm")
    return {normalise(k): str(v) for k, v in data["senses"].items()}


def unit_synset(word: str, wn: WordNet | None = None) -> int | None:
    """Where a unit named ``word`` (a caption word, a vocabulary concept) sits in WordNet:
    the sense table's sense, else the word's most frequent physical sense, else None."""
    wn = wn if wn is not None else wordnet()
    key = normalise(word)
    if not key:
        return None
    wnid = sense_table().get(key)
    if wnid is not None and wn.by_wnid(wnid) is not None:
        return wn.by_wnid(wnid)
    pe = wn.by_wnid(PHYSICAL_ENTITY)
    for s in wn.lookup(OVERRIDES.get(key, key)):
        if (key, wn.wnid(s)) in BLOCKED:
            continue
        if pe is not None and (s == pe or pe in wn.ancestors(s)):
            return s
    return None
