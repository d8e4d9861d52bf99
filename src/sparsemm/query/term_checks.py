"""Can the model read a query's terms? :class:`TermChecks`, the part of a
:class:`~sparsemm.query.searcher.Searcher` that checks terms before a search ranks.

:meth:`TermChecks.check_terms` refuses a term that means nothing to the model (no letter or
digit, an empty code, nothing the match scorer's vocabulary can see, with the closest
concepts it knows); :meth:`TermChecks.unknown_words` names words no vocabulary holds;
:meth:`TermChecks.notes` says how the match scorer read each term;
:meth:`TermChecks.example_query` is a query the collection answers. The texts a search will
embed are encoded here in batches, so the ranking that follows finds them cached.
"""

from __future__ import annotations

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.query.handle import IndexedCollection
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.scorers import no_concept
from sparsemm.query.strategies import Match, get_spec
from sparsemm.query.strategies.context import CHECK_BATCH
from sparsemm.text import singular, tokenize

# everyday things an example query is made of, commonest first when photos tie
EVERYDAY = (
    "people", "an animal", "a dog", "a cat", "a bird", "a vehicle", "a car", "a boat",
    "a flower", "food", "a building", "furniture", "a bottle", "a cup",
)  # fmt: skip
FALLBACK_EXAMPLE = "a dog"
EXAMPLE_MAX_ITEMS = 100_000  # past this, the example is not worth reading every code


class TermChecks(IndexedCollection):
    """Term checks over one indexed collection (see the module docstring)."""

    _example: str | None = None

    def example_query(self) -> str:
        """A query this collection answers (`sparsemm up` suggests it, the page shows it):
        the everyday thing most of its items show (at 50% or more), but not the one most
        often with it that not all of them show ("an animal but not a dog"); "a dog" when
        the model reads none of them or the collection is very large. Computed once."""
        if self._example is None:
            self._example = self._example_query()
        return self._example

    def _match_over_items(self) -> Match:
        """The match scorer over every item's code, as the served ranking scores them: over
        the codes alone, so that a note or the page's example does not load every image
        embedding as well (the full context does); the full context where the model's
        match is not served by the index."""
        if not self.served("match"):
            return self.match_strategy(self.context)
        strat = self.match_strategy().over(self.codes)
        assert isinstance(strat, Match)
        return strat

    def _example_query(self) -> str:
        if len(self.collection.items) > EXAMPLE_MAX_ITEMS:
            return FALLBACK_EXAMPLE
        try:
            strat = self._match_over_items()
        except SparsemmError:  # a model without the match scorer
            return FALLBACK_EXAMPLE
        shown: dict[str, np.ndarray] = {}
        for word in EVERYDAY:
            try:
                shown[word] = strat.term_probability(word) >= 0.5
            except SparsemmError:  # a word this model cannot see
                continue
        if not shown or not max(int(s.sum()) for s in shown.values()):
            return FALLBACK_EXAMPLE
        want = max(shown, key=lambda w: int(shown[w].sum()))  # the first of the commonest
        n = int(shown[want].sum())
        both = {w: int((s & shown[want]).sum()) for w, s in shown.items() if w != want}
        apart = [w for w, k in both.items() if 0 < k < n]
        if not apart:
            return want
        return f"{want} but not {max(apart, key=lambda w: both[w])}"

    def unknown_words(self, query: Query | str) -> list[str]:
        """Words of ``query``'s terms that this searcher has never seen, in query order: in
        none of the model's detector vocabulary or dimension names, the words of the
        collection's captions and labels, or the text encoder's whole-word vocabulary (when
        it has one: MiniLM's WordPiece words). Such a word ("xqzvbl", a typo) is still
        encoded, as subword pieces, and searched or excluded by what the pieces mean; the
        CLI, the web API and the page name it so the result is not trusted in silence.
        Stop words are never reported; a query with no vocabulary to check against reports
        nothing."""
        q = parse_query(query) if isinstance(query, str) else query
        words = [w for t in (*q.include, *q.exclude) for w in tokenize(t)]
        missing = [w for w in dict.fromkeys(words) if not self._knows(w, cheap=True)]
        return [w for w in missing if not self._knows(w, cheap=False)]

    def _knows(self, word: str, cheap: bool) -> bool:
        forms = {word, singular(word)}
        if cheap:
            detectors = self.model.detectors
            if detectors is not None and any(f in detectors for f in forms):
                return True
            vocab = getattr(self.encoder, "word_vocabulary", None)
            words = vocab() if callable(vocab) else None
            return bool(words and forms & words)
        if self.seen_words is None:  # captions, labels and dimension names, read once
            seen: set[str] = set()
            names = self.model.dim_names() or []  # ImageNet classes, VDR tokens
            for it in [*self.collection.items, {"labels": names}]:
                for text in [*(it.get("captions") or []), *(it.get("labels") or [])]:
                    toks = tokenize(str(text))
                    seen.update(toks)
                    seen.update(singular(t) for t in toks)
            self.seen_words = frozenset(seen)
        return bool(forms & self.seen_words)

    def check_terms(self, query: Query, strategy: str) -> None:
        """Raise SparsemmError naming a query term that means nothing to the model: its query
        code (sparse strategies) or text embedding (dense ones) is all zeros, or it holds no
        letter or digit (emoji, symbols), so searching for it would return nothing (or noise)
        and excluding it would silently exclude nothing.

        ``strategy`` is a registered strategy name or a kind ("sparse" / "dense"). The
        messages are those of the web API (:mod:`sparsemm.web.app`).
        """
        if strategy == "match":
            self.match_strategy().check_query(query.include, query.exclude)
            return
        kind = strategy if strategy in ("sparse", "dense") else get_spec(strategy).kind
        ctx = self.text_context
        # embed (and code) the terms in batches first, cached for the search that follows
        ctx.prefetch([*query.include, *query.exclude], codes=kind == "sparse", batch=CHECK_BATCH)
        for side, terms in (("search for", query.include), ("exclude", query.exclude)):
            for term in terms:
                # A term without a letter or digit (emoji, symbols) names no concept, though
                # a subword encoder embeds it (as [UNK] or byte pieces) to a non-zero vector.
                wordless = not any(ch.isalnum() for ch in term)
                vec = ctx.term_code(term) if kind == "sparse" else ctx.term_embedding(term)
                if wordless or not np.any(vec):
                    raise no_concept(term, side)

    def notes(self, query: str | Query, strategy: str | None = None) -> list[str]:
        """What the served scorer says about how it read the query's terms ("'woman' is
        searched as 'person': ..."): empty for other strategies or unknown terms."""
        q = parse_query(query) if isinstance(query, str) else query
        return self._read_terms(q, strategy or self.default_strategy)[0]

    def _read_terms(self, q: Query, strategy: str) -> tuple[list[str], list[str]]:
        """(:meth:`notes`, :meth:`unknown_words` less the words of terms the match scorer read
        as concepts: through the hierarchy, not as subword pieces, "selfie" read as a face),
        reading each term once."""
        unknown = self.unknown_words(q)
        if strategy != "match":
            return [], unknown
        notes, read = self.match_strategy().read_notes([*q.include, *q.exclude])
        return notes, [w for w in unknown if w not in read]

    def empty_note(self, q: Query, found: int = 0, k: int = 1, offset: int = 0) -> str | None:
        """Why the match scorer found fewer items for ``q`` than a page of ``k`` asked for:
        ``found`` (all that match at all, counting the ``offset`` skipped) when some did, and
        with none, read over every item: a wanted thing no item shows, wanted things found
        only apart, or every item with them also showing a thing to leave out. None when
        the query has nothing wanted, the page is full, every item matches or the offset
        is past the collection. A page starting past the matches says so."""
        total = len(self.collection.items)
        if not q.include or found >= offset + k or found >= total or offset >= total:
            return None  # a full page, or a collection (or offset) shorter than the page
        if found:
            what = " and ".join(repr(t) for t in q.include)
            past = f"; this page starts past them (offset {offset})" if offset >= found else ""
            return (
                f"only {found} of the {total} items {'shows' if found == 1 else 'show'} any "
                f"sign of {what}{self._parts(q)}; the others are a 0% match{past}"
            )
        strat = self._match_over_items()
        shown = {t: int((strat.term_probability(t) > 0).sum()) for t in q.include}
        if not all(shown.values()):
            none = next(t for t, n in shown.items() if n == 0)
            return f"no item shows {none!r}: its match is 0% for every item"
        together = strat.probability(q.include, ())
        if len(q.include) > 1 and not together.any():
            apart = ", ".join(f"{t!r} in {n} item{'s' * (n != 1)}" for t, n in shown.items())
            return f"no item shows these together ({apart}); search them one at a time"
        if q.exclude and not strat.probability(q.include, q.exclude).any():
            return "every item showing what is wanted also shows what is left out"
        return None

    def _parts(self, q: Query) -> str:
        """For a wanted side of several things ("big cat in the grass"), how many items show
        each alone (" (5 show 'big cat', 24 'grass'; a match needs them all)"); else ""."""
        if len(q.include) == 1 and len(q.include[0].split()) == 1:
            return ""  # one word, one thing
        strat = self._match_over_items()
        parts = []
        for t in q.include:
            r = strat.reading(t)
            parts += [c.term for c in r.concepts] if len(r.concepts) > 1 else [t]
        names = list(dict.fromkeys(parts))
        if len(names) < 2:
            return ""
        n = [int((strat.term_probability(p) > 0).sum()) for p in names]
        shown = [f"{n[0]} {'shows' if n[0] == 1 else 'show'} {names[0]!r}"]
        shown += [f"{c} {p!r}" for p, c in zip(names[1:], n[1:], strict=True)]
        return f" ({', '.join(shown)}; a match needs them all)"
