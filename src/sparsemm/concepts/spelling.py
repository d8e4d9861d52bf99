"""Spelling look-alikes: the words one or two edits from a typed word ("dgo" -> "dog"), found
through an index of deletions, for the refusals of :mod:`sparsemm.concepts.vocabulary`."""

from __future__ import annotations

from collections.abc import Sequence


class DeletionIndex:
    """Words by the strings one or two deletions away (symmetric-delete spelling, after
    SymSpell): a word within two edits of a query shares a deletion string with it, so a
    lookup touches a few dozen keys instead of every string two edits away."""

    def __init__(self, words: Sequence[str]) -> None:
        self.words = frozenset(words)
        self.by_delete: dict[str, list[str]] = {}
        for w in self.words:
            for d in _deletes(w):
                self.by_delete.setdefault(d, []).append(w)

    def near(self, word: str, max_dist: int = 2) -> dict[str, int]:
        """{word: edit distance} of the indexed words within ``max_dist`` of ``word``,
        only the closest distance found (1 before 2)."""
        cands: set[str] = set()
        for d in _deletes(word):
            cands.update(self.by_delete.get(d, ()))
        found = {c: _osa(word, c) for c in cands}
        found = {c: d for c, d in found.items() if 0 < d <= max_dist}
        if not found:
            return {}
        best = min(found.values())
        return {c: d for c, d in found.items() if d == best}


def _deletes(word: str) -> set[str]:
    """``word`` and every string one or two deletions from it."""
    one = {word[:i] + word[i + 1 :] for i in range(len(word))}
    two = {w[:i] + w[i + 1 :] for w in one for i in range(len(w))}
    return {word} | one | two


def _osa(a: str, b: str) -> int:
    """Optimal string alignment distance (insertions, deletions, substitutions and
    adjacent transpositions)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]
