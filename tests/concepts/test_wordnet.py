"""The packaged WordNet noun hierarchy: lookups through the noun morphology, senses in
frequency order, the is-a relation, and a damaged file refused by name."""

from __future__ import annotations

import pytest

from sparsemm.concepts.wordnet import WordNet, normalise, wordnet
from sparsemm.errors import SparsemmError


@pytest.fixture(scope="module")
def wn() -> WordNet:
    return wordnet()


def test_lookup_goes_through_the_noun_morphology(wn: WordNet) -> None:
    dog = wn.by_wnid("n02084071")
    assert dog is not None and wn.lookup("dog")[0] == dog
    for plural in ("dogs", "Dogs", "DOGS"):
        assert wn.lookup(plural)[0] == dog
    assert wn.name(wn.lookup("mice")[0]) == "mouse"  # the exception list
    assert wn.name(wn.lookup("buses")[0]) == "bus"  # "-es" detachment
    assert wn.name(wn.lookup("skies")[0]) == "sky"  # "-ies" -> "-y"
    assert wn.name(wn.lookup("women")[0]) == "woman"
    assert "hot dog" in wn.lemmas(wn.lookup("hot dogs")[1])  # a compound's last word
    assert wn.lookup("xqzvbl") == () and not wn.known("xqzvbl")
    assert wn.lookup("") == ()


def test_senses_come_most_frequent_first(wn: WordNet) -> None:
    mouse = wn.lookup("mouse")
    assert wn.lexname(mouse[0]) == "animal"  # the rodent before the computer mouse
    assert any(wn.wnid(s) == "n03793489" for s in mouse)
    assert len(set(wn.lookup("moon"))) == len(wn.lookup("moon"))  # "Moon" and "moon" once


def test_is_a_and_distances(wn: WordNet) -> None:
    dog, animal = wn.lookup("dog")[0], wn.lookup("animal")[0]
    retriever = wn.by_wnid("n02099601")  # golden retriever
    assert retriever is not None
    assert wn.is_a(retriever, dog) and wn.is_a(retriever, animal) and wn.is_a(dog, dog)
    assert not wn.is_a(dog, retriever)
    assert dog in wn.ancestors(retriever) and retriever in wn.descendants(dog)
    assert wn.distance(retriever, retriever) == 0
    assert wn.distance(retriever, dog) is not None and wn.distance(dog, retriever) is None
    assert wn.depth(animal) < wn.depth(dog)
    assert wn.wnid(dog) == "n02084071" and wn.by_wnid(wn.wnid(dog)) == dog


def test_normalise() -> None:
    assert normalise("  Hot_Dog  ") == "hot dog"
    assert normalise("T-shirt") == "t-shirt"


def test_a_damaged_file_is_refused() -> None:
    with pytest.raises(SparsemmError, match="damaged"):
        WordNet({"format": "something else"})
    good = {
        "format": "sparsemm.wordnet-nouns",
        "offsets": [1, 2],
        "lexfiles": [3],  # one short
        "lemmas": ["a", "b"],
        "parents": [[], [0]],
        "senses": {"a": [0], "b": [1]},
        "exceptions": {},
    }
    with pytest.raises(SparsemmError, match="damaged"):
        WordNet(good)


def test_instances_are_marked_and_other_words_are_english(wn: WordNet) -> None:
    day = [s for s in wn.lookup("day") if "Clarence Day" in wn.lemmas(s)]
    assert day and wn.instance(day[0])  # the writer, an instance of "writer"
    assert not wn.instance(wn.lookup("day")[0])
    assert not wn.instance(wn.by_wnid("n02084071"))  # dog: a kind, not a name
    assert 7000 < sum(wn.instance(i) for i in range(len(wn))) < 9000
    # English in any part of speech, also inflected: no spelling fix is offered for these
    for word in ("sunny", "sunnier", "running", "indoors", "quickly", "biggest", "dog", "red"):
        assert wn.english(word), word
    for word in ("dgo", "xqzvbl", "kelpi"):
        assert not wn.english(word), word


def test_nouns_used_mostly_as_adjectives_are_modifiers(wn: WordNet) -> None:
    # by WordNet's sense-tagged counts: "nice" 29 as an adjective to 0 as a noun (the city)
    for word in ("nice", "good", "lovely", "young", "Nice"):
        assert wn.modifier(word), word
    for word in ("light", "glass", "dog", "baby", "toy", "cute"):  # nouns first, or no noun
        assert not wn.modifier(word), word


def test_accents_are_dropped_as_wordnet_spells_its_words(wn: WordNet) -> None:
    assert normalise("Café") == "cafe" and normalise("crème  brûlée") == "creme brulee"
    assert wn.lookup("café") == wn.lookup("cafe") != ()
