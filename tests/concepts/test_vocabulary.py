"""Reading query terms through the hierarchy: coverage below a sense, implied scenes,
stand-in hypernyms, phrases noun by noun, refusals with suggestions, unit senses."""

from __future__ import annotations

import pytest

from sparsemm.concepts.vocabulary import ConceptVocabulary, UnknownTerm, unit_synset
from sparsemm.concepts.wordnet import wordnet

# a few ImageNet classes, by WordNet id, and a face detector's unit
UNITS = {
    "golden retriever": "n02099601",
    "tabby": "n02123045",
    "cheetah": "n02130308",
    "minivan": "n03770679",
    "school bus": "n04146614",
    "canoe": "n02951358",
    "lakeside": "n09332890",
    "espresso": "n07920052",
    "coffee mug": "n03063599",
}


@pytest.fixture(scope="module")
def vocab() -> ConceptVocabulary:
    wn = wordnet()
    names = [*UNITS, "person (face)"]
    synsets: list = [wn.by_wnid(w) for w in UNITS.values()]
    synsets.append((wn.by_wnid("n00007846"), wn.by_wnid("n05600637")))  # person, face
    lake = wn.by_wnid("n09328904")
    implied = {lake: [(names.index("lakeside"), 0.9), (names.index("canoe"), 0.5)]}
    return ConceptVocabulary(
        names, synsets, implied, similar=lambda term, k: ["tabby", "cheetah", "canoe"][:k]
    )


def units(vocab: ConceptVocabulary, term: str) -> set[str]:
    return {vocab.names[u] for c in vocab.read(term).concepts for u, _ in c.units}


def test_a_word_covers_what_lies_below_it(vocab: ConceptVocabulary) -> None:
    assert units(vocab, "dogs") == {"golden retriever"}
    assert units(vocab, "an animal") == {"golden retriever", "tabby", "cheetah"}
    assert units(vocab, "vehicles") == {"minivan", "school bus", "canoe"}
    assert units(vocab, "big cat") == {"cheetah"}
    assert units(vocab, "cat") == {"tabby"}  # a domestic cat; the big cats are felines
    assert vocab.read("cheetah").concepts[0].how == "exact"
    assert vocab.read("bus").concepts[0].how == "narrower"
    # a mug is a cup to people (WordNet files it beside the cup, sparsemm adds the edge)
    assert units(vocab, "cups") == {"coffee mug"}


def test_people_and_faces_are_the_face_unit(vocab: ConceptVocabulary) -> None:
    for term in ("people", "a person", "face", "somebody"):
        assert units(vocab, term) == {"person (face)"}, term
    woman = vocab.read("woman")
    assert woman.concepts[0].how == "broader" and woman.concepts[0].label == "person"
    assert woman.notes == [
        "'woman' is searched as 'person': this model cannot tell women from other people"
    ]
    women = "'women' is searched as 'person': this model cannot tell women from other people"
    assert vocab.read("women").notes == [women]
    assert "cannot tell old men from other people" in vocab.read("an old man").notes[0]


def test_implied_scenes_carry_their_weight(vocab: ConceptVocabulary) -> None:
    lake = vocab.read("lake").concepts[0]
    assert lake.how == "implied" and dict(lake.units) == {6: 0.9, 5: 0.5}
    assert "implies" in lake.note
    water = vocab.read("water").concepts[0]  # a body of water, above the lake
    assert water.label == "body of water" and dict(water.units)[6] == 0.9


def test_phrases_are_read_noun_by_noun(vocab: ConceptVocabulary) -> None:
    mug = vocab.read("a mug of coffee")
    assert [c.label for c in mug.concepts] == ["mug", "coffee"]
    boat = vocab.read("a boat on a lake")
    assert [c.label for c in boat.concepts] == ["boat", "lake"]
    faces = vocab.read("a close-up of a face")
    assert [c.label for c in faces.concepts] == ["face"]  # "close-up" frames the phrase
    # a thing the model cannot see is never dropped from a phrase: the phrase is refused,
    # saying what to search instead; a describing word is left out with a note
    with pytest.raises(UnknownTerm, match="'kitchen' in 'a dog in a kitchen' is not something"):
        vocab.read("a dog in a kitchen")
    big = vocab.read("a big dog")
    assert [c.label for c in big.concepts] == ["dog"]
    assert big.ignored == ("big",) and "left out" in big.notes[0]
    # a noun used mostly as an adjective describes the thing beside it: "a nice dog" is no
    # city of Nice, "a lovely cheetah" no beautiful woman read as a person
    for term, word in (
        ("a nice dog", "nice"),
        ("a lovely cheetah", "lovely"),
        ("good dogs", "good"),
    ):
        r = vocab.read(term)
        assert [c.label for c in r.concepts] == [term.split()[-1].rstrip("s")], term
        assert r.ignored == (word,) and "left out" in r.notes[0], term
    with pytest.raises(
        UnknownTerm, match="'nice' describes a thing rather than names one: name the thing too"
    ):
        vocab.read("nice")
    # "baby" or a material right before another thing describes it: a baby cheetah shows
    # no person, a paper cup no paper; apart (a word or a comma between) each is a thing
    for term, word, label in (
        ("a baby cheetah", "baby", "cheetah"),
        ("a paper cup", "paper", "cup"),
    ):
        r = vocab.read(term)
        assert [c.label for c in r.concepts] == [label] and r.ignored == (), term
        assert r.describing == ((word, label),), term
        assert f"{word!r} in {term!r} is read as saying what the {label} is" in r.notes[-1]
    for term in ("a baby with a cheetah", "baby, cheetah", "a baby. a cheetah"):
        assert [c.label for c in vocab.read(term).concepts] == ["person", "cheetah"], term
    assert [c.label for c in vocab.read("woman cheetah").concepts] == ["person", "cheetah"]
    union = vocab.read("a baby cheetah or a tabby").concepts[0]  # "or" keeps the note
    assert union.how == "union" and "'baby' in 'baby cheetah' is read as saying" in union.note
    with pytest.raises(UnknownTerm, match="'paper' in 'paper and a cup' is not something"):
        vocab.read("paper and a cup")  # a thing of its own, which this model cannot see
    assert vocab.read_names("there is a dog and a cheetah") is not None
    assert vocab.read_names("a dog running fast") is None  # a description, not a list


def test_a_frame_that_only_says_a_thing_is_shown_is_dropped(vocab: ConceptVocabulary) -> None:
    for term in ("I can see a dog", "we could spot a dog", "a dog can be seen", "a dog is visible"):
        assert units(vocab, term) == {"golden retriever"}, term
    both = vocab.read("I can see a boat on a lake")
    assert [c.label for c in both.concepts] == ["boat", "lake"]
    # "can" inside a phrase is a thing, not a frame: the phrase keeps it
    with pytest.raises(UnknownTerm, match="in 'a can of coffee'"):
        vocab.read("a can of coffee")


def test_unknown_terms_are_refused_with_what_the_model_knows(vocab: ConceptVocabulary) -> None:
    with pytest.raises(UnknownTerm) as err:
        vocab.read("moon")
    assert "not something this model can see" in str(err.value)
    assert err.value.suggestions == ["tabby", "cheetah", "canoe"]
    with pytest.raises(UnknownTerm, match="no English word WordNet knows; check the spelling"):
        vocab.read("xqzvbl")
    with pytest.raises(UnknownTerm):
        vocab.read("galaxy")  # not the plant galax
    with pytest.raises(UnknownTerm):
        vocab.read("kitchen")  # not widened to "area"


def test_units_are_placed_at_their_caption_sense() -> None:
    wn = wordnet()
    assert wn.wnid(unit_synset("mouse")) == "n03793489"  # the computer mouse (sense table)
    assert wn.wnid(unit_synset("dog")) == "n02084071"
    assert unit_synset("sport ball") is not None
    assert unit_synset("xqzvbl") is None
    assert wn.lexname(unit_synset("plant")) != "artifact"  # not a factory


def test_chickens_are_imagenets_hen_and_cock() -> None:
    """ImageNet's hen and cock are WordNet's adult female and male bird of any kind; its
    photos (and people) mean chickens, so "chicken", "poultry" and "fowl" cover both."""
    wn = wordnet()
    ids = {"hen": "n01514859", "cock": "n01514668", "ostrich": "n01518878"}
    vocab = ConceptVocabulary(
        list(ids), [wn.by_wnid(w) for w in ids.values()], {}, similar=lambda term, k: []
    )
    for term in ("a chicken", "chickens", "poultry", "fowl"):
        assert units(vocab, term) == {"hen", "cock"}, term
    assert units(vocab, "a bird") == {"hen", "cock", "ostrich"}
