"""Derive sparsemm's concept hierarchy file from the WordNet 3.0 noun database.

    apt-get download wordnet-base && dpkg -x wordnet-base_*.deb wn
    python scripts/derive_wordnet.py wn/usr/share/wordnet

writes ``src/sparsemm/concepts/data/wordnet-nouns.json.gz`` (every noun synset: its offset,
lexicographer file, lemmas with their sense numbers, and its hypernyms, instance hypernyms
included, and which synsets are instances; the noun exception list for irregular plurals;
the one-word verbs, adjectives and adverbs that are not nouns; the nouns more often used as
adjectives, by WordNet's sense-tagged counts) and copies WordNet's licence
beside it as ``WORDNET-LICENSE``. Glosses, examples and the other pointer types are left
out: sparsemm needs the lemmas and the is-a hierarchy only. The output is deterministic
(same input, same bytes), so a re-run shows no diff.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "sparsemm" / "concepts" / "data"
LICENSE_HEAD = "WordNet Release 3.0"


def read_synsets(
    path: Path,
) -> tuple[list[int], list[int], list[list[str]], list[list[int]], list[bool]]:
    """(offsets, lexicographer file numbers, lemmas, hypernym offsets, whether the synset is
    an instance: a named person, place or thing, linked upward by instance hypernyms only)
    in file order."""
    offsets, lexfiles, lemmas, parents, instance = [], [], [], [], []
    with path.open(encoding="latin-1") as fh:
        for line in fh:
            if line.startswith("  "):  # the licence header
                continue
            fields = line.split(" | ")[0].split()
            offset, lexfile, pos = int(fields[0]), int(fields[1]), fields[2]
            if pos != "n":
                continue
            n_words = int(fields[3], 16)
            words = [fields[4 + 2 * i] for i in range(n_words)]
            rest = fields[4 + 2 * n_words :]
            n_ptr = int(rest[0])
            hyper = []
            kinds = set()
            for i in range(n_ptr):
                symbol, target, tpos = rest[1 + 4 * i], int(rest[2 + 4 * i]), rest[3 + 4 * i]
                if symbol in ("@", "@i") and tpos == "n":
                    hyper.append(target)
                    kinds.add(symbol)
            offsets.append(offset)
            lexfiles.append(lexfile)
            lemmas.append(words)
            parents.append(hyper)
            instance.append(kinds == {"@i"})
    return offsets, lexfiles, lemmas, parents, instance


def read_other_words(d: Path, nouns: set[str]) -> list[str]:
    """Lower-case one-word lemmas of WordNet's verbs, adjectives and adverbs, and their
    irregular forms (verb.exc, adj.exc), that are not noun lemmas: with the nouns, the words
    sparsemm takes as English (no spelling fix is offered for them)."""
    out: set[str] = set()
    for name in ("index.verb", "index.adj", "index.adv"):
        with (d / name).open(encoding="latin-1") as fh:
            for line in fh:
                if not line.startswith("  "):
                    out.add(line.split()[0].lower())
    for name in ("verb.exc", "adj.exc", "adv.exc"):
        with (d / name).open(encoding="latin-1") as fh:
            out.update(line.split()[0].lower() for line in fh if line.split())
    return sorted(w for w in out if w.isalpha() and w not in nouns)


def read_modifiers(d: Path, nouns: set[str]) -> list[str]:
    """Lower-case one-word noun lemmas tagged more often as adjectives than as nouns in
    WordNet's sense-tagged corpus (``cntlist.rev``: "nice" 29 to 0, "good" 262 to 26,
    "lovely" 11 to 0; not "light", 45 to 117): in a phrase they describe the thing beside
    them ("a nice cat") rather than name a thing of their own (the city of Nice)."""
    counts: dict[str, list[int]] = {}
    with (d / "cntlist.rev").open(encoding="latin-1") as fh:
        for line in fh:
            key, _, tagged = line.split()
            lemma, _, rest = key.partition("%")
            kind = rest[:1]  # 1 noun, 3 adjective, 5 adjective satellite
            if kind in ("1", "3", "5") and lemma.isalpha():
                c = counts.setdefault(lemma.lower(), [0, 0])
                c[kind != "1"] += int(tagged)
    return sorted(w for w, (noun, adj) in counts.items() if w in nouns and adj > noun)


def read_sense_ranks(path: Path) -> dict[tuple[str, int], int]:
    """(lowercase lemma, synset offset) -> sense number (1 = most frequent), from index.noun."""
    ranks: dict[tuple[str, int], int] = {}
    with path.open(encoding="latin-1") as fh:
        for line in fh:
            if line.startswith("  "):
                continue
            f = line.split()
            lemma, n_synsets, n_ptr = f[0], int(f[2]), int(f[3])
            synsets = f[6 + n_ptr : 6 + n_ptr + n_synsets]
            for rank, off in enumerate(synsets, 1):
                ranks[(lemma.lower(), int(off))] = rank
    return ranks


def senses_index(
    offsets: list[int], lemmas: list[list[str]], ranks: dict[tuple[str, int], int]
) -> dict[str, list[int]]:
    """Lemma key -> synset indices, most frequent sense first (ties in file order)."""
    found: dict[str, list[tuple[int, int]]] = {}
    for i, (off, words) in enumerate(zip(offsets, lemmas, strict=True)):
        for w in words:
            key = " ".join(w.replace("_", " ").lower().split())
            found.setdefault(key, []).append((ranks.get((w.lower(), off), 99), i))
    return {k: list(dict.fromkeys(i for _, i in sorted(v))) for k, v in found.items()}


def read_exceptions(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with path.open(encoding="latin-1") as fh:
        for line in fh:
            f = line.split()
            if len(f) >= 2:
                out.setdefault(f[0], f[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dict_dir", type=Path, help="WordNet's dict folder (data.noun, index.noun)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--license",
        type=Path,
        default=None,
        help="WordNet's licence text (default: DICT_DIR/../doc/wordnet-base/copyright)",
    )
    args = ap.parse_args()
    d = args.dict_dir
    offsets, lexfiles, lemmas, parents, instance = read_synsets(d / "data.noun")
    ranks = read_sense_ranks(d / "index.noun")
    where = {off: i for i, off in enumerate(offsets)}
    nouns = {w.lower() for ws in lemmas for w in ws}
    data = {
        "format": "sparsemm.wordnet-nouns",
        "version": 2,
        "source": "WordNet 3.0, Princeton University (Debian wordnet-base); noun synsets, "
        "lemmas, sense numbers and hypernyms only",
        "offsets": offsets,
        "lexfiles": lexfiles,
        "lemmas": ["|".join(ws) for ws in lemmas],
        # lemma key (lower case, spaces) -> its synsets, most frequent sense first
        "senses": senses_index(offsets, lemmas, ranks),
        "parents": [[where[p] for p in ps if p in where] for ps in parents],
        "exceptions": read_exceptions(d / "noun.exc"),
        # synsets that are instances (Clarence Day, the Eiffel Tower), never a reading
        "instances": [i for i, flag in enumerate(instance) if flag],
        "other_words": read_other_words(d, nouns),
        # nouns used more as adjectives ("nice", "good"): in a phrase, describing words
        "modifiers": read_modifiers(d, nouns),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    # mtime=0: the same input gives the same bytes
    (args.out / "wordnet-nouns.json.gz").write_bytes(gzip.compress(raw, 9, mtime=0))
    lic = args.license or d.parent / "doc" / "wordnet-base" / "copyright"
    text = lic.read_text(encoding="utf-8")
    (args.out / "WORDNET-LICENSE").write_text(text, encoding="utf-8")
    print(f"{len(offsets)} synsets -> {args.out / 'wordnet-nouns.json.gz'}")


if __name__ == "__main__":
    main()
