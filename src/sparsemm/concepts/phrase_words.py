"""The everyday words of a query phrase that name no thing in a photo, for
:mod:`sparsemm.concepts.vocabulary`: what no photo model here can see (the time of day,
colours, text), counts, filler and stop words, the frame that only says a thing is shown,
and the words for people and young ones."""

from __future__ import annotations

import re

# Words for what no photo model here can see, each with why and what to search instead.
_TIME = (
    "this model sees things, not the time of day or the light",
    ("sky", "seashore", "lakeside"),
)
_COLOUR = ("this model names things, not their colours", ())
_TEXT = ("this model does not read text", ("menu", "street sign", "book jacket"))
UNSEEN: dict[str, tuple[str, tuple[str, ...]]] = {
    **dict.fromkeys(
        "sunset sunsets sunrise sunrises sundown dusk dawn twilight night nights nighttime "
        "evening evenings morning daylight daytime day days afternoon golden hour".split(),
        _TIME,
    ),
    **dict.fromkeys(
        "red blue green yellow black white purple pink brown grey gray violet beige "
        "turquoise colour color colours colors colourful colorful".split(),
        _COLOUR,
    ),
    **dict.fromkeys("text texts writing document documents words letters".split(), _TEXT),
}
# Count words: "two dogs" is read as dogs, with a note that counts are not known.
COUNTS = frozenset(
    "two three four five six seven eight nine ten eleven twelve dozen dozens several "
    "many multiple few numerous".split()
)
# Words of a phrase that frame it rather than name a thing in the picture.
# words for people a typo may have meant, though the model widens them to "person"
EVERYDAY_PEOPLE = frozenset(
    "man men woman women child children boy boys girl girls baby babies kid kids".split()
)
# Words for a young one that, right before a thing, say its age ("a baby elephant")
YOUNG = frozenset({"baby", "babies"})
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
# A frame around a phrase that only says its things are shown: "I can see a dog", "a dog
# can be seen", "a dog is visible". Only the frame is dropped, so "a can of soda" keeps "can".
PRESENCE_FRAME = re.compile(
    r"^(?:(?:i|we|you|one)\s+(?:can|could)\s+(?:see|spot)|there\s+(?:is|are))\s+"
    r"|\s+(?:(?:can|could)\s+be\s+seen|(?:is|are)\s+(?:visible|shown))$"
)
