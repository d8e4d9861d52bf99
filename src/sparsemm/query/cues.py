"""The negation grammar of the query parser (:mod:`sparsemm.query.parse`): the cue words
that open or close an exclusion, the word classes that bound its noun phrase, and how long
a term may be."""

from __future__ import annotations

MAX_NP_WORDS = 3  # an excluded noun phrase: "dining table", "baseball glove", "hot dog"
MAX_TERM_WORDS = 3  # include pieces up to this long are terms; longer text is one phrase
MAX_LABEL_WORDS = 5  # ...and only while all pieces together stay this short

# Single-word prefix cues: the noun phrase after them is excluded.
NEGATIONS = frozenset(
    {"not", "no", "without", "except", "excluding", "exclude", "minus", "w/o", "sans", "neither"}
)
# Multi-word prefix cues (token tuples), longest first when matched.
PREFIX_CUES: tuple[tuple[str, ...], ...] = tuple(
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
CUES_BY_FIRST: dict[str, tuple[tuple[str, ...], ...]] = {
    w: tuple(c for c in PREFIX_CUES if c[0] == w) for w in dict.fromkeys(c[0] for c in PREFIX_CUES)
}
# Sentence cues that may end without an object ("..., isn't it"): no error then.
SOFT_CUES = frozenset({"isn't", "aren't", "wasn't", "weren't", "lacking", "lacks", "lack"})
# "doesn't have X", "does not contain X", "not wearing X": the verb after the cue is skipped.
AUX_NEG = frozenset({"doesn't", "don't", "didn't", "cannot", "can't"})
HAVE_VERBS = frozenset(
    {
        "have", "has", "contain", "contains", "show", "shows", "include", "includes",
        "feature", "features", "hold", "holds", "depict", "depicts", "display", "displays",
        "wear", "carry", "see", "find", "want", "need", "like",
        "wearing", "holding", "having", "carrying", "showing", "containing", "including",
        "featuring", "using", "depicting",
    }
)  # fmt: skip
# Postfix cues: "X is absent", "X is missing", "X nowhere to be seen", "X is not present".
POSTFIX = frozenset({"absent", "missing", "nowhere", "gone", "lacking"})
NOT_PRESENT = frozenset(
    {
        "present", "visible", "shown", "pictured", "seen", "included", "there", "here",
        "around", "anywhere", "nearby", "in", "to", "depicted", "found", "featured",
    }
)  # fmt: skip
OUT_OF = frozenset({"sight", "view", "frame", "picture", "image", "shot", "photo"})
# "not" before these is not an exclusion: "not only", "not without" (double negation)...
DOUBLE_NEG = frozenset({"only", "without", "free", "devoid", "lacking", "empty", "missing"})
# ... nor "no" before these ("no fewer than two cats", "no longer a cat").
NO_IDIOMS = frozenset({"fewer", "less", "longer", "matter", "doubt", "way"})
# "anything but X" = everything except X.
EVERYTHING = frozenset({"anything", "everything", "everybody", "everyone", "all"})
# After "not", these mean the sentence goes on, not that an object is excluded
# ("the dog is not on the couch", "not too big"): "not" stays an ordinary word.
NOT_FOLLOWERS = frozenset(
    {"on", "at", "near", "under", "over", "by", "inside", "outside", "from", "into", "onto",
     "behind", "above", "below", "next", "around", "for", "to", "all", "just", "too", "so",
     "quite", "merely", "exactly", "really", "very", "always", "even", "yet", "every",
     "allowed", "looking", "facing", "moving", "working"}
)  # fmt: skip
# A list item starting with one of these is a new clause ("no shirt, wearing shorts").
PARTICIPLES = frozenset(
    {"wearing", "holding", "carrying", "sitting", "standing", "walking", "eating", "playing",
     "looking", "riding", "lying", "laying", "running", "flying", "using", "watching",
     "waiting", "talking", "smiling", "posing", "reading", "working", "cooking", "drinking"}
)  # fmt: skip
# Words meaning "no person".
PERSON = "person"
PERSON_ADJECTIVES = frozenset({"unoccupied", "uninhabited", "deserted", "unpopulated"})
PERSON_WORDS = frozenset({"nobody", "noone", "no-one"}) | PERSON_ADJECTIVES
# Skipped between a cue and its noun phrase.
DETERMINERS = frozenset(
    {"a", "an", "the", "any", "some", "single", "one", "more", "other", "such", "even",
     "its", "his", "her", "their", "my", "your", "our"}
)  # fmt: skip
# Words that end an excluded noun phrase (prepositions, verbs, clause words, cues, filler).
NP_STOP = frozenset(
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
NP_NOT_VERB = frozenset(
    {"building", "buildings", "ceiling", "clothing", "painting", "paintings", "bedding",
     "railing", "awning", "icing", "frosting", "topping", "toppings", "stuffing", "pudding",
     "seed", "seeds", "bed", "beds", "sled", "sleds", "shed", "bread", "steed",
     "thing", "things", "something", "anything", "nothing", "everything", "king", "kings",
     "ring", "rings", "wing", "wings", "string", "strings", "swing", "swings", "spring",
     "earring", "earrings", "duckling", "ducklings", "sibling", "siblings"}
)  # fmt: skip
# Presence filler after an excluded phrase ("in the image", "to be seen", "is visible").
FILLER = frozenset(
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
FILLER_ANCHOR = frozenset(
    {
        "image", "images", "picture", "pictures", "photo", "photos", "photograph", "pic",
        "scene", "frame", "shot", "view", "sight", "seen", "visible", "present", "shown",
        "found", "pictured", "depicted", "anywhere", "whatsoever", "around", "nearby",
        "here", "there", "evident", "apparent", "spotted", "detected", "all",
    }
)  # fmt: skip
# Words that only set up a prefix cue: dropped from the end of the include before it
# ("there is no X", "the image has no X", "a kitchen with no X").
CUE_SETUP = frozenset(
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
CONNECTIVES = frozenset(
    {"and", "but", "yet", "while", "where", "whereas", "though", "although", "so", "with",
     "as", "or", "nor", "also", "plus", "then", "which", "that"}
)  # fmt: skip
LEADING_CONNECTIVES = CONNECTIVES - {"that", "which"}
# Words that separate include terms ("cat and dog"; "but" ends a label-style exclusion).
SPLIT_WORDS = frozenset({"and", "but"})
LIST_WORDS = frozenset({"or", "nor", "and"})
# Words that, right before a cue, are part of how it is said in label queries.
CONNECTORS = frozenset({"but", "and", "or", "with", "yet"})
# Between a postfix cue and the noun phrase before it ("a chair is missing").
LINKING_VERBS = frozenset(
    {"is", "are", "was", "were", "be", "seems", "seem", "appears", "appear", "remains",
     "remain", "being"}
)  # fmt: skip

ARTICLES = frozenset({"a", "an", "the", "some", "any"})
# What a person types before what they want ("show me a cat", "I'm looking for a dog",
# "there are dogs"): dropped from the start of an include term that has words after it.
REQUESTS = tuple(
    tuple(r.split())
    for r in (
        "can you please show me", "can you please find me", "can you please find",
        "can you show me", "can you find me", "can you find", "could you show me",
        "could you find me", "could you find", "please show me", "please find me",
        "please find", "please show", "i'm looking for", "i am looking for", "im looking for",
        "we're looking for", "i want to see", "i'd like to see", "i would like to see",
        "i want", "i need", "looking for", "search for", "look for", "show me", "find me",
        "give me", "get me", "show", "find", "please", "i can see", "we can see",
        "you can see",
    )
)  # fmt: skip
# a piece that is only a request is dropped; "i can" is what "i can see no dogs" leaves
# once "see no dogs" is read as the exclusion
REQUEST_SET = frozenset(REQUESTS) | {("i", "can"), ("we", "can"), ("you", "can")}
MEDIA = frozenset(
    {
        "photo", "photos", "picture", "pictures", "image", "images", "photograph",
        "photographs", "pic", "pics", "shot", "shots", "snapshot",
    }
)  # fmt: skip
