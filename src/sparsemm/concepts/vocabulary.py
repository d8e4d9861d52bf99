"""What a query term means to a model: its detectable units, grounded in WordNet.

Every model knows a fixed set of *units*: things it can tell are in a picture (the 1000
ImageNet classes and a face detector's "person" for the photo model, the caption words that
have detectors for SR, the vocabulary concepts of CLIP). :class:`ConceptVocabulary` places
each unit at a WordNet noun synset and reads a query term as the units that cover it:

1. the term's noun senses, most frequent first, keeping those that are physical things
   (below ``physical entity``) and never an instance (Clarence Day is no reading of
   "day"); everyday words WordNet reads otherwise are mapped first (:data:`OVERRIDES`:
   "people" is a group noun there, the plural of "person" here; "indoors", "selfie");
   kinds with nothing below them in WordNet are read as groups (:data:`GROUPS`: pet,
   landmark);
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
   must be present; a count ("two dogs") or a describing word ("big", or a noun used
   mostly as an adjective: "a nice cat" is no city of Nice) is left out with a note, as
   is "baby" or a material right before the thing it describes ("a baby elephant", "a
   paper cup": no person, no paper); a thing the model cannot see ("sunset", "red",
   "kitchen") refuses the phrase as it refuses the word alone, never silently;
6. a term with no reading is refused (:class:`UnknownTerm`) with the closest concepts the
   model knows: curated ones for what no model here sees
   (:data:`~sparsemm.concepts.phrase_words.UNSEEN`: the time of
   day, colours, text), a spelling fix only for a word that is no English word, else by
   the model's text similarity when it has one; a term covering nearly every unit is
   refused as too broad (:class:`TooBroad`: "entity", "physical entity");
7. "cats or dogs" is one concept, the union of the alternatives' units
   (:meth:`ConceptVocabulary.read_union`); :meth:`ConceptVocabulary.implies` says when an
   excluded term covers an included one ("dog but not animal").
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

from sparsemm.concepts.phrase_words import (
    COUNTS,
    EVERYDAY_PEOPLE,
    FILLER,
    PRESENCE,
    PRESENCE_FRAME,
    STOP,
    UNSEEN,
    YOUNG,
)
from sparsemm.concepts.spelling import DeletionIndex
from sparsemm.concepts.wordnet import WordNet, normalise, wordnet
from sparsemm.errors import SparsemmError
from sparsemm.text import plural

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
    # ImageNet's "plane" is the carpenter's; a photo searched for a plane means an airplane
    "plane": "airplane",
    "planes": "airplane",
    "electronics": "electronic device",  # the devices, not the branch of physics
    # photo words: "indoor(s)" and "outside" are the places WordNet calls interior/outdoors
    "indoor": "inside",
    "indoors": "inside",
    "outdoor": "outdoors",
    "outside": "outdoors",
    "open air": "outdoors",
    "selfie": "face",
    "selfies": "face",
    "portrait": "face",
    "portraits": "face",
    "wildlife": "animal",  # WordNet: the animals collectively, a group noun
    "ocean": "sea",  # WordNet's ocean is a sibling of the sea, which photos show alike
    "oceans": "sea",
}
# Notes for words read as something else (the reading says what the model cannot tell).
WORD_NOTES: dict[str, str] = {
    "selfie": "'selfie' is searched as a face ('person (face)'): this model cannot tell a "
    "selfie from any other photo with a face in it",
    "portrait": "'portrait' is searched as a face ('person (face)'): this model cannot tell a "
    "portrait from any other photo with a face in it",
    "wildlife": "'wildlife' is searched as animals: this model cannot tell a wild animal from "
    "a kept one of its kind",
    "pet": "'pet' is searched as the animals people keep (dogs, cats, hamsters, guinea pigs, "
    "rabbits, goldfish, parrots): this model cannot tell a pet from any other such animal",
    "landmark": "'landmark' is searched as the buildings and structures ImageNet knows that "
    "landmarks are made of (castles, palaces, churches, towers, bridges, monuments): this "
    "model cannot tell a famous one from any other",
}
# Word senses read as the union of other synsets (wnid -> member wnids): kinds WordNet has
# but files nothing under that a photo model has units for.
GROUPS: dict[str, tuple[str, ...]] = {
    # pet.n.01 -> dog, domestic cat, hamster, guinea pig, rabbit, goldfish, parrot
    "n01318894": (
        "n02084071", "n02121808", "n02342885", "n02364673", "n02324045", "n01443537",
        "n01816887",
    ),
    # landmark.n.01 -> castle, palace, church, mosque, stupa, obelisk, triumphal arch,
    # steel arch bridge, suspension bridge, megalith, monastery, totem pole, cliff dwelling,
    # beacon (lighthouse), dome, bell cote, planetarium, viaduct, water tower
    "n08624891": (
        "n02980441", "n03877845", "n03028079", "n03788195", "n04346328", "n03837869",
        "n04486054", "n04311004", "n04366367", "n03743016", "n03781244", "n04487394",
        "n03042490", "n02814860", "n03220513", "n02825657", "n03956157", "n04532670",
        "n04562935",
    ),
}  # fmt: skip
# A term that covers at least this share of a model's units (with at least MIN_BROAD_UNITS
# units) names nearly everything a photo can show ("physical entity", "object"): refused.
BROAD_SHARE = 0.75
MIN_BROAD_UNITS = 8
ENTITY = "n00001740"
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
        ("shrimp", "n10543544"),  # WordNet's first sense is a small person, not the prawn
        ("shrimps", "n10543544"),
        # WordNet's first senses are a rookie and a lad; in a photo a cub is a young animal
        ("cub", "n09981834"),
        ("cub", "n09871229"),
        ("cubs", "n09981834"),
        ("cubs", "n09871229"),
        # WordNet's first stroller is a person who strolls; in a photo it is a pushchair
        ("stroller", "n10553235"),
        ("strollers", "n10553235"),
    }
)
# The hypernyms a narrower word may be searched as when the model has nothing narrower
# (step 4 of the module docstring): a woman as a person, a puppy as a dog. Others are
# refused: "kitchen" is not usefully searched as "area", nor "trees" as "vascular plant".
STAND_INS = ("n00007846", "n02084071")  # person.n.01, dog.n.01


class UnknownTerm(SparsemmError):
    """A query term the model has no concept for (``suggestions``: what it does know)."""

    def __init__(self, term: str, message: str, suggestions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.term = term
        self.suggestions = list(suggestions)


class TooBroad(UnknownTerm):
    """A term that covers (nearly) everything the model can see ("physical entity")."""


@dataclass(frozen=True)
class Concept:
    """One noun of a term, read as the units that cover it."""

    term: str  # the word(s) as typed ("trees")
    label: str  # what they were read as ("tree", "person")
    units: tuple[tuple[int, float], ...]  # (unit, weight <= 1): weight < 1 for implied units
    how: str  # "exact" | "narrower" | "implied" | "broader" | "name"
    synset: int | None = None
    note: str = ""
    # "cats or dogs": the alternatives whose units ``units`` unites (how = "union")
    parts: tuple[Concept, ...] = ()


@dataclass(frozen=True)
class Reading:
    """A query term read as concepts that must all be present."""

    term: str
    concepts: tuple[Concept, ...]
    ignored: tuple[str, ...] = ()  # describing words of the phrase the model cannot judge
    counts: tuple[str, ...] = ()  # count words ("two dogs")
    # (word, the thing it describes): a material or "baby" right before it ("paper cup")
    describing: tuple[tuple[str, str], ...] = ()

    @property
    def notes(self) -> list[str]:
        out = [c.note for c in self.concepts if c.note]
        if self.counts:
            shown = " + ".join(c.label for c in self.concepts)
            out.append(
                f"counts are not known to this model: {self.term!r} is searched as "
                f"{shown!r} (one or more)"
            )
        if self.ignored:
            what = ", ".join(repr(w) for w in self.ignored)
            out.append(f"{what} in {self.term!r} left out: this model cannot judge it")
        for word, thing in self.describing:
            out.append(
                f"{word!r} in {self.term!r} is read as saying what the {thing} is (of), not "
                "as a thing of its own: this model cannot judge it"
            )
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
        for group, members in GROUPS.items():
            g = self.wn.by_wnid(group)
            if g is None:
                continue
            for m in (self.wn.by_wnid(w) for w in members):
                for u, w in idx.under.get(m, {}).items() if m is not None else ():
                    if w >= 1.0:
                        idx.under.setdefault(g, {})[u] = 1.0
        self._under = idx.under
        # senses the implied table names: read even when not physical ("sport", an activity
        # its equipment and players show)
        self._implied_senses = frozenset(int(x) for x in (implied or {}))
        self._entity = self.wn.by_wnid(ENTITY)
        self._spell: DeletionIndex | None = None
        self._stand_ins = {i for i in (self.wn.by_wnid(w) for w in STAND_INS) if i is not None}
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
        """The word's physical noun senses (and "entity", above them all, and the senses the
        implied table names), most frequent first; never an instance ("Day" the writer is
        not a reading of "day")."""
        key = normalise(word)
        key = OVERRIDES.get(key, key)
        return [
            s
            for s in self.wn.lookup(key)
            if (self.physical(s) or s == self._entity or s in self._implied_senses)
            and not self.wn.instance(s)
            and (key, self.wn.wnid(s)) not in BLOCKED
        ]

    def _word_note(self, word: str) -> str:
        key = normalise(word)
        for k in (key, OVERRIDES.get(key, key), *self.wn.base_forms(key)):
            if k in WORD_NOTES:
                return WORD_NOTES[k]
        return ""

    def _too_broad(self, word: str, units: Mapping[int, float]) -> TooBroad | None:
        direct = sum(1 for w in units.values() if w >= 1.0)
        n = len(self.names)
        if n < MIN_BROAD_UNITS or direct < BROAD_SHARE * n:
            return None
        return TooBroad(
            word,
            f"{word!r} covers nearly everything this model can see ({direct} of its {n} "
            "concepts), so every photo would match it; name something narrower, e.g. "
            "'animal', 'vehicle', 'food' or 'building'",
        )

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
            broad = self._too_broad(word, units)
            if broad is not None:
                raise broad
            label = self.wn.name(s)
            note = self._word_note(key)
            if how == "implied":
                shown = ", ".join(self.names[u] for u, _ in sorted(units.items(), key=_by_w)[:3])
                more = ", ..." if len(units) > 3 else ""
                note = f"{word!r} is judged from what implies it ({shown}{more})"
            return Concept(word, label, _sorted(units), how, s, note)
        by_name = self._by_name.get(key) or self._by_name.get(OVERRIDES.get(key, key))
        if by_name:  # a unit whose word WordNet does not know
            return Concept(word, self.names[by_name[0]], tuple((u, 1.0) for u in by_name), "name")
        # a stand-in hypernym of the word's main sense (a woman -> person), only when that
        # is its most frequent sense of all: a "poster" is a placard before a person who
        # posts bills, "life" a state before a living person
        first = [s for s in self.wn.lookup(OVERRIDES.get(key, key)) if not self.wn.instance(s)]
        for s in senses[:1] if first[:1] == senses[:1] else []:
            for p in sorted(self._stand_ins):
                steps = self.wn.distance(s, p)
                if steps is None or not 0 < steps <= self.max_broader or not self.covering(p):
                    continue
                label = self.wn.name(p)
                note = (
                    f"{word!r} is searched as {label!r}: this model cannot tell "
                    f"{plural(word)} from other {plural(label)}"
                )
                return Concept(word, label, _sorted(self.covering(p)), "broader", p, note)
        return None

    def read(self, term: str) -> Reading:
        """The reading of a query term; :class:`UnknownTerm` when it names nothing the
        model can see."""
        text = PRESENCE_FRAME.sub("", normalise(term))
        if re.search(r"\bor\b", text):
            return Reading(term, (self.read_union(term),))
        if text in UNSEEN:
            raise self.unknown(term)
        whole = self.read_noun(text) if text else None
        if whole is not None and whole.how == "broader" and self._describes(text):
            raise self.unknown(text, term)  # "lovely" alone is no person
        if whole is not None:
            return Reading(term, (whole,))
        tokens = re.findall(r"[a-z0-9][a-z0-9'\-]*|[,.;:!?]", text)
        # where each word stands: a word right before another (no stop word or punctuation
        # between them, "baby elephant") may describe it
        at = [i for i, w in enumerate(tokens) if w not in STOP and w[0].isalnum()]
        words = [tokens[i] for i in at]
        spans: list[tuple[int, int]] = []  # the words each concept was read from
        concepts: list[Concept] = []
        ignored: list[str] = []
        counts: list[str] = []
        unseen: list[str] = []  # things the phrase names that the model cannot see
        i = 0
        while i < len(words):
            for n in (3, 2, 1):
                chunk = " ".join(words[i : i + n])
                if len(words[i : i + n]) < n:
                    continue
                if n == 1 and chunk in FILLER:
                    i += 1
                    break
                if n == 1 and (chunk in COUNTS or chunk.isdigit()):
                    counts.append(chunk)
                    i += 1
                    break
                if n == 1 and chunk in UNSEEN:
                    unseen.append(chunk)
                    i += 1
                    break
                if n > 1 and not self.wn.known(chunk):
                    continue
                if n == 1 and len(words) > 1 and self._describes(chunk):
                    ignored.append(chunk)  # "a nice cat": the cat, not the city of Nice
                    i += 1
                    break
                c = self.read_noun(chunk)
                if c is not None:
                    concepts.append(c)
                    spans.append((at[i], at[i + n - 1]))
                    i += n
                    break
                if n == 1:
                    if self._names_a_thing(chunk):
                        unseen.append(chunk)
                        spans.append((at[i], at[i]))
                        concepts.append(Concept(chunk, "", (), "unseen"))  # its place
                    else:
                        ignored.append(chunk)
                    i += 1
                    break
            else:  # pragma: no cover - the n == 1 case always breaks
                i += 1
        describing: list[tuple[str, str]] = []
        concepts = self._heads(concepts, spans, describing)
        unseen = [w for w in unseen if w not in {d for d, _ in describing}]
        if unseen and concepts:
            raise UnknownTerm(term, self._phrase_refusal(term, unseen[0], concepts))
        if unseen:  # "something red", "a sunny day": refused as the word alone would be
            raise self.unknown(unseen[0], term)
        if not concepts:
            raise self.unknown(term)
        seen: set[tuple[tuple[int, float], ...]] = set()
        unique = []
        for c in concepts:  # "dog and dogs" is one concept
            if c.units not in seen:
                seen.add(c.units)
                unique.append(c)
        return Reading(term, tuple(unique), tuple(ignored), tuple(counts), tuple(describing))

    def _heads(
        self,
        concepts: list[Concept],
        spans: list[tuple[int, int]],
        describing: list[tuple[str, str]],
    ) -> list[Concept]:
        """``concepts`` (how = "unseen" where a word names a thing the model cannot see)
        less those of one word right before another thing of the phrase (no stop word or
        punctuation between) that describe it: "baby" ("a baby elephant": no person in it)
        or a material ("a paper cup", "a metal chair": the thing is a cup, a chair). They
        join ``describing`` with the thing; the unseen places are dropped."""
        kept = []
        for j, c in enumerate(concepts):
            nxt = concepts[j + 1] if j + 1 < len(concepts) else None
            before = nxt is not None and spans[j + 1][0] == spans[j][1] + 1
            one = spans[j][0] == spans[j][1]
            if before and one and (normalise(c.term) in YOUNG or self._material(c.term)):
                assert nxt is not None
                describing.append((c.term, nxt.term))
            elif c.how != "unseen":
                kept.append(c)
        return kept

    def _material(self, word: str) -> bool:
        """Whether a word's most frequent noun sense is a substance ("paper", "plastic",
        "glass", "metal"), by WordNet's lexicographer file: not "fox" (its fur is a later
        sense) nor "lake" (a pigment, later)."""
        senses = self.wn.lookup(OVERRIDES.get(normalise(word), normalise(word)))
        return bool(senses) and self.wn.lexname(senses[0]) == "substance"

    def read_union(self, term: str) -> Concept:
        """ "cats or dogs", "a cat or a dog": one concept whose units are the union of the
        alternatives' (each alternative one thing the model can see); its evidence is theirs
        together. UnknownTerm when an alternative cannot be read, SparsemmError when one is
        a phrase of several things."""
        text = normalise(term)
        alternatives = [a for a in re.split(r"\s*\bor\b\s*", text) if a.strip()]
        alternatives = [re.sub(r"^(either|a|an|the|some|any)\s+", "", a) for a in alternatives]
        if len(alternatives) < 2:
            raise SparsemmError(f"{term!r}: put a thing on each side of 'or', e.g. 'cat or dog'")
        parts: list[Concept] = []
        notes: list[str] = []  # each alternative's, its left-out words' too ("a baby cheetah")
        for alt in alternatives:
            r = self.read(alt)
            notes += r.notes
            if len(r.concepts) != 1 or r.concepts[0].parts:
                raise SparsemmError(
                    f"{alt!r} in {term!r} is several things; 'or' joins single things "
                    "('cats or dogs'): search the others separately"
                )
            parts.append(r.concepts[0])
        units: dict[int, float] = {}
        for c in parts:
            for u, w in c.units:
                units[u] = max(units.get(u, 0.0), w)
        label = " or ".join(dict.fromkeys(c.label for c in parts))
        note = "; ".join(dict.fromkeys(notes))
        return Concept(term, label, _sorted(units), "union", None, note, tuple(parts))

    def _phrase_refusal(self, term: str, word: str, concepts: Sequence[Concept]) -> str:
        why = UNSEEN[word][0] if word in UNSEEN else "this model has nothing that shows it"
        rest = " and ".join(dict.fromkeys(c.term for c in concepts))
        useful = word in UNSEEN or self.similar is not None  # not spelling look-alikes
        near = [n for n in self.suggest(word) if n not in rest] if useful else []
        hint = f"; closest concepts it knows: {', '.join(near)}" if near else ""
        return (
            f"{word!r} in {term!r} is not something this model can see ({why}); search "
            f"{rest!r} without it{hint}"
        )

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
                    try:
                        c = self.read_noun(chunk)
                    except TooBroad:  # "an object on a table": a description, not names
                        return None
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

    def _describes(self, word: str) -> bool:
        """Whether a word of a phrase describes the thing beside it rather than names one:
        WordNet has it as a noun but it is used more often as an adjective ("nice",
        "good", "lovely", "young"), sparsemm maps it to no word of its own ("outside"), and
        no unit of the model is named by it."""
        key = normalise(word)
        return self.wn.modifier(key) and key not in OVERRIDES and not self._by_name.get(key)

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

    def unknown(self, word: str, term: str | None = None) -> UnknownTerm:
        """The refusal of ``word`` (typed as ``term``, default the word itself), with its
        suggestions computed once."""
        near = self.suggest(word)
        shown = term if term and normalise(term) == normalise(word) else word  # "café"
        return UnknownTerm(term or word, self.refusal(shown, near), near)

    def refusal(self, term: str, near: Sequence[str] | None = None) -> str:
        """Why ``term`` is refused, in one line (``near``: its suggestions, computed when
        not given)."""
        key = normalise(term)
        near = self.suggest(term) if near is None else near
        hint = f"; closest concepts it knows: {', '.join(near)}" if near else ""
        if key in UNSEEN:
            return f"{term!r} is not something this model can see ({UNSEEN[key][0]}){hint}"
        if not self._english_any(term):
            if near:  # a misspelt word: say what it probably is
                fix = " or ".join(near)
                return f"{term!r} is not an English word WordNet knows; did you mean {fix}?"
            return (
                f"{term!r} is not something this model can see (it is no English word "
                "WordNet knows; check the spelling)"
            )
        if not self._senses_any(term):
            known = "WordNet has no such noun"
        elif self._describes(key):  # its look-alike concepts would only mislead
            return f"{term!r} describes a thing rather than names one: name the thing too"
        else:
            known = "this model has nothing that shows it"
        return f"{term!r} is not something this model can see ({known}){hint}"

    def spelling(self, term: str, k: int = 3) -> list[str]:
        """Up to ``k`` words one or two edits (a letter left out, added, changed or two
        swapped) from a one-word ``term`` that the model reads as themselves: what a typo
        ("dgo") probably meant. Closer words first, then words with more senses. Found
        through an index of deletions (built once, on first use), in about a millisecond."""
        word = normalise(term)
        if not re.fullmatch(r"[a-z]{3,20}", word):
            return []
        if self._spell is None:
            self._spell = DeletionIndex(self._spelling_words())
        found = self._spell.near(word)
        readable = []
        for c in sorted(found, key=lambda c: (found[c], -len(self.wn.lookup(c)), c)):
            if c == word:
                continue
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

    def _spelling_words(self) -> list[str]:
        """One-word names of what the model can read: the lemmas of every sense with units
        at or below it, the units' own names, the overrides and the everyday people words."""
        out: set[str] = set(EVERYDAY_PEOPLE) | set(OVERRIDES)
        for s in self._under:
            out.update(normalise(w) for w in self.wn.lemmas(s))
        out.update(self._by_name)
        return sorted(w for w in out if re.fullmatch(r"[a-z]{2,22}", w))

    def _senses_any(self, term: str) -> bool:
        words = [w for w in re.findall(r"[a-z0-9][a-z0-9'\-]*", normalise(term)) if w]
        return any(self.wn.known(w) for w in words) or self.wn.known(normalise(term))

    def _english_any(self, term: str) -> bool:
        """Whether some word of ``term`` is an English word (any part of speech): then a
        spelling fix is not offered ("selfie" is not a misspelt "kelpie")."""
        words = re.findall(r"[a-z0-9][a-z0-9'\-]*", normalise(term))
        return any(self.wn.english(w) for w in words) or self._senses_any(term)

    def suggest(self, term: str, k: int = 3) -> list[str]:
        """Up to ``k`` names closest to ``term``: the useful stand-ins for a word no model
        here can see ("sunset": sky, seashore), what a misspelt word probably meant, else
        unit names by the model's text similarity when it has one, else by spelling."""
        key = normalise(term)
        if key in UNSEEN:  # curated: what a person would search instead (none: colours)
            return [w for w in UNSEEN[key][1] if self._readable(w)][:k]
        if not self._english_any(term):
            # no English word: a typo's fix or nothing; a string with no meaning is not
            # worth the text encoder's time (nor a flood of them)
            return self.spelling(term, k)
        if self.similar is not None:
            try:
                return list(dict.fromkeys(self.similar(term, k)))[:k]
            except SparsemmError:
                pass
        names = list(dict.fromkeys(normalise(n) for n in self.names))
        return difflib.get_close_matches(key, names, n=k, cutoff=0.6)

    def implies(self, included: Sequence[Concept], excluded: Sequence[Concept]) -> bool:
        """True when every item matching ``included`` (all its concepts) also matches
        ``excluded`` to this model: each excluded concept is at or above some included one
        in the hierarchy ("dog" and "animal"; "kitten", read as a cat, and "cat"), or covers,
        at full weight, every unit it is read through."""
        if not included or not excluded:
            return False

        def covers(wide: Concept, narrow: Concept) -> bool:
            if wide.synset is not None and narrow.synset is not None:
                if self.wn.is_a(narrow.synset, wide.synset):
                    return True
            full = {u for u, w in wide.units if w >= 1.0}
            if narrow.how == "implied":  # "flag", read only from a flagpole
                return {u for u, _ in narrow.units} <= full
            mine = [u for u, w in narrow.units if w >= 1.0]
            return bool(mine) and len(mine) == len(narrow.units) and set(mine) <= full

        return all(any(covers(b, c) for c in included) for b in excluded)

    def _readable(self, word: str) -> bool:
        try:
            return self.read_noun(word) is not None
        except SparsemmError:
            return False


def _by_w(item: tuple[int, float]) -> tuple[float, int]:
    return (-item[1], item[0])


def _sorted(units: Mapping[int, float]) -> tuple[tuple[int, float], ...]:
    return tuple(sorted(units.items()))


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
