"""Search one indexed collection: :class:`Searcher`, the Python API every front end calls.

A :class:`Searcher` opens a collection, its index (or another store holding the same codes:
Qdrant) and the model the index names. It answers parsed queries ("A but not B", several
excluded terms allowed) with the model's default strategy (``match``: a calibrated match
probability per item, served through the index by :mod:`sparsemm.query.two_stage`) or any
registered one, and explains each hit (:mod:`sparsemm.query.hits`): the concept dimensions
that matched the include terms and, for every excluded term, the dimensions checked and the
item's mass on them. Dimension labels come from the index manifest, written by
:func:`sparsemm.query.indexing.build_index` (names: :mod:`sparsemm.query.naming`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import UP_SOURCE_KIND, Collection, open_collection
from sparsemm.data.sources import text_name
from sparsemm.encoders.base import CachedTextEncoder, get_encoder
from sparsemm.encoders.batching import MAX_BATCH, BatchingTextEncoder
from sparsemm.encoders.text_store import StoredTextEncoder, TextEmbeddingStore
from sparsemm.errors import SparsemmError
from sparsemm.index import Exclusion, InvertedIndex
from sparsemm.index.store import Store
from sparsemm.io import read_json
from sparsemm.linalg import normalize_rows
from sparsemm.models.base import check_encoders, config_digest
from sparsemm.models.lit_lite import AlignedTextEncoder, AlignerLite
from sparsemm.query.code_models import load_code_model
from sparsemm.query.hits import Answer, Concept, ExcludedCheck, Explainer, Hit, term_evidence
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.rank import rank_query
from sparsemm.query.request import MATCH_THRESHOLD, QueryRequest
from sparsemm.query.scorers import DetectorScorer, refuse_self_exclusion
from sparsemm.query.strategies import (
    ExclusionContext,
    HardFilter,
    Hybrid,
    Match,
    ReferenceSet,
    StrategySpec,
    available_strategies,
    get_spec,
    get_strategy,
)
from sparsemm.query.strategies.match import LIKE_PREFIX
from sparsemm.query.two_stage import (
    ServedResult,
    count_matches,
    served_match,
    served_rank,
    sub_context,
)
from sparsemm.query.unit_lists import UnitLists
from sparsemm.text import singular, tokenize

log = logging.getLogger(__name__)

INDEX_DIR = "index"
LEGACY_LABELS = "labels.json"
CHECK_BATCH = 16  # query terms embedded per encoder call when checking them


def _label_lists(labels: Any, key: str, root: Path) -> list[list[str]]:
    """The index manifest's dimension labels of one kind: a list of lists of words."""
    value = labels.get(key, []) if isinstance(labels, dict) else None
    if not isinstance(value, list) or not all(
        isinstance(ws, list) and all(isinstance(w, str) for w in ws) for ws in value
    ):
        raise SparsemmError(
            f"the index in {root} has malformed dimension labels ({key!r}); rebuild it with "
            "`sparsemm index`"
        )
    return value


def _rebuild_hint(collection_dir: str | Path, root: Path) -> str:
    """How to build a damaged index again: the command with the model its manifest names
    (when it can be read), and the `sparsemm up` way."""
    try:
        model = (read_json(root / "manifest.json").get("meta") or {}).get("model")
    except (SparsemmError, OSError, ValueError, AttributeError):
        model = None
    cmd = f"sparsemm index {collection_dir} --model {model or 'MODEL_DIR'}"
    return f"`{cmd}`, or for a folder made by `sparsemm up`, run `sparsemm up` again"


def _up_photos(collection: Collection) -> str | None:
    """The photo folder of a collection made by `sparsemm up` (None for other collections)."""
    source = collection.manifest.get("source")
    if isinstance(source, dict) and source.get("kind") == UP_SOURCE_KIND:
        return str(source.get("path") or "PHOTOS")
    return None


class Searcher:
    """Answer queries over one indexed collection (see the module docstring)."""

    def __init__(
        self,
        collection_dir: str | Path,
        encoder: Any = None,
        store: Store | None = None,
        image_encoder: Any = None,
        in_memory: bool = False,
    ) -> None:
        self.collection: Collection = open_collection(collection_dir)
        # collection.root: where open_collection found it (a crash may have parked it aside)
        root = self.collection.root / INDEX_DIR
        if not (root / "manifest.json").is_file():
            photos = _up_photos(self.collection)
            if photos is not None:  # `up` was stopped between the collection and the index
                raise SparsemmError(
                    f"{collection_dir} has no index yet (was `sparsemm up` interrupted?); run "
                    f"`sparsemm up {shlex.quote(photos)}` again: it builds the index from the "
                    "stored embeddings"
                )
            raise SparsemmError(
                f"{collection_dir} has no index; build it with `sparsemm index "
                f"{collection_dir} --model MODEL_DIR`"
            )
        try:
            self.index = InvertedIndex.open(root, in_memory=in_memory)
        except SparsemmError as exc:  # damaged: say how to build it again, with what
            raise SparsemmError(f"{exc} ({_rebuild_hint(collection_dir, root)})") from exc
        if store is not None and (len(store) != len(self.index) or store.dim != self.index.dim):
            raise SparsemmError(
                f"the {store.backend} store holds {len(store)} items of dim {store.dim}, the "
                f"collection's index {len(self.index)} of dim {self.index.dim}; re-run "
                f"`sparsemm index ... --backend {store.backend}` to bring it up to date"
            )
        # Where the served path reads candidates and codes: the collection's own index, or a
        # store holding the same items (e.g. a Qdrant collection).
        self.store: Store = store if store is not None else self.index
        if list(self.index.ids) != self.collection.ids:
            raise SparsemmError(
                f"the index in {root} does not match the collection's items; rebuild it"
            )
        meta = self.index.meta
        if not meta or "model" not in meta:
            raise SparsemmError(
                f"the index in {root} does not name its model; rebuild it with `sparsemm index`"
            )
        top_k = meta.get("top_k")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise SparsemmError(
                f"the index in {root} has no valid top_k in its manifest ({top_k!r}); rebuild "
                f"it with `sparsemm index {collection_dir} --model MODEL_DIR`"
            )
        for key in ("model", "dense_model"):
            if meta.get(key) and not Path(str(meta[key])).exists():
                raise SparsemmError(
                    f"the index in {root} was built with the {key.replace('_', ' ')} "
                    f"{meta[key]}, which is no longer there (moved or deleted?); rebuild the "
                    f"index with `sparsemm index {collection_dir} --model MODEL_DIR"
                    f"{' --dense-model ALIGNER_DIR' if key == 'dense_model' else ''}` naming "
                    "where it is now"
                )
        self.model = load_code_model(meta["model"], top_k)
        recorded = meta.get("model_config_sha256")
        if recorded is not None and recorded != config_digest(meta["model"]):
            photos = _up_photos(self.collection)
            again = (
                f"run `sparsemm up {shlex.quote(photos)}` again"
                if photos is not None
                else f"rebuild the index with `sparsemm index {collection_dir} --model "
                f"{meta['model']}`"
            )
            raise SparsemmError(
                f"the settings in {meta['model']}/config.json changed since the index in "
                f"{root} was built (their checksum differs from the one the index recorded); "
                f"restore them, or {again}"
            )
        self.default_strategy: str = self.model.default_strategy
        check_encoders(
            self.model.training_info, self.collection.manifest, meta["model"], collection_dir
        )
        self.top_k = top_k
        labels = meta.get("labels")
        if not isinstance(labels, dict):  # an index built before labels lived in its meta
            legacy = root / LEGACY_LABELS
            labels = read_json(legacy) if legacy.is_file() else {}
        self.labels_data: list[list[str]] = _label_lists(labels, "data", root)
        self.labels_spine: list[list[str]] = _label_lists(labels, "spine", root)
        self.aligner = (
            AlignerLite.from_pretrained(meta["dense_model"]) if meta.get("dense_model") else None
        )
        if self.aligner is not None:
            check_encoders(
                self.aligner.training_info,
                self.collection.manifest,
                meta["dense_model"],
                collection_dir,
            )
        self._encoder = encoder
        self._ctx: ExclusionContext | None = None
        self._text_ctx: ExclusionContext | None = None
        self._codes: sp.csr_matrix | None = None
        self._dense: np.ndarray | None = None
        # How the last search was answered (served path: candidates, certificate).
        self.last_served: ServedResult | None = None
        self._captionless: bool | None = None
        self._image_encoder: Any = image_encoder  # query images (search_like)
        self._rows: dict[str, int] | None = None
        self._raw_text: CachedTextEncoder | None = None  # shared by aligned space and coder
        self._seen_words: frozenset[str] | None = None  # caption and label words (unknown_words)
        self._unit_lists: Any = False  # not looked for yet (None: none that fit)
        self._match: Match | None = None  # the match scorer over the text context

    def close(self) -> None:
        """Close a store this searcher was given (a Qdrant client); the collection's own
        index needs no closing."""
        if self.store is not self.index:
            self.store.close()

    def __enter__(self) -> Searcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def unit_lists(self) -> Any:
        """The collection's :class:`~sparsemm.query.unit_lists.UnitLists` when they were
        computed from this model's detectors over this index (None otherwise: the served
        path then bounds terms through the code lists, exact but slower; a warning says how
        to build them again when they are stale). Only the collection's own index uses
        them; another store (Qdrant) numbers its rows alike but is not checked."""
        if self._unit_lists is False:
            self._unit_lists = None
            det = self.text_context.detectors
            if det is not None and self.store is self.index:
                try:
                    lists = UnitLists.load(self.collection.root)
                except SparsemmError as exc:
                    log.warning("%s; searching without them", exc)
                    lists = None
                if lists is not None and lists.fits(det, self.index):
                    self._unit_lists = lists
                elif lists is not None:
                    log.warning(
                        "the unit lists of %s were computed for other detectors or another "
                        "index; searching without them (slower). `sparsemm index` builds "
                        "them again",
                        self.collection.root,
                    )
        return self._unit_lists

    @unit_lists.setter
    def unit_lists(self, lists: Any) -> None:
        self._unit_lists = lists

    @property
    def codes(self) -> sp.csr_matrix:
        """Every item's code, loaded on first use: only strategies other than the served
        default (and query-time detector fits) need them; the served path reads the index."""
        if self._codes is None:
            codes = sp.csr_matrix(self.index.codes(np.arange(len(self.index))))
            codes.sort_indices()  # explanations read rows through indptr
            self._codes = codes
        return self._codes

    # -- context ---------------------------------------------------------------------------
    @property
    def encoder(self) -> Any:
        """The collection's own text encoder (same name and model), for query texts."""
        if self._encoder is None:
            info = self.collection.manifest.get("text_encoder", self.collection.manifest["encoder"])
            kwargs = {"model": info["model"]} if info.get("model") else {}
            text_dim = self.collection.text_dim

            def build() -> Any:
                enc = get_encoder(str(info["name"]), **kwargs)
                if int(enc.dim) != text_dim:
                    raise SparsemmError(
                        f"the {info['name']} encoder gives {enc.dim}-d vectors but the "
                        f"collection's texts are {text_dim}-d; re-encode the collection"
                    )
                return enc

            # Texts embedded before (by any process) come from the user's store: the
            # encoder is built only for a text the store does not hold.
            store = TextEmbeddingStore.for_encoder({**info, "dim": text_dim})
            if store is None:
                self._encoder = build()
            else:
                self._encoder = StoredTextEncoder(build, store, str(info["name"]), text_dim)
        return self._encoder

    def batch_text_encoding(self, max_batch: int = MAX_BATCH) -> None:
        """Encode the query texts of searches running at once in other threads together
        (:class:`~sparsemm.encoders.batching.BatchingTextEncoder`): what a server answering
        many requests turns on, since one forward pass over several short texts costs
        little more than over one. Text caches built so far are dropped (a second call
        changes nothing)."""
        if isinstance(self._encoder, BatchingTextEncoder):
            return
        self._encoder = BatchingTextEncoder(self.encoder, max_batch)
        self._ctx = self._text_ctx = None
        self._raw_text = None

    @property
    def dense(self) -> np.ndarray | None:
        """Items in the query texts' dense space: the aligned projection of the image
        embeddings with a dense model, the embeddings themselves for one backbone, None for
        two unaligned backbones without a dense model (dense strategies unavailable)."""
        if self._dense is None:
            col = self.collection
            if self.aligner is not None:
                self._dense = self.aligner.encode_image(col.image_embeddings())
            elif col.dim == col.text_dim:
                self._dense = col.image_embeddings()
        return self._dense

    @property
    def context(self) -> ExclusionContext:
        if self._ctx is None:
            col = self.collection
            captions = [list(it.get("captions", [])) for it in col.items]
            labels = [list(it.get("labels") or []) for it in col.items]
            reference = None
            if any(captions) or any(labels):
                # The collection's own captions and tags supervise the word detectors.
                reference = ReferenceSet(
                    captions=captions,
                    dense=self.dense,
                    codes=self.codes,
                    labels=labels if any(labels) else None,
                )
            text_encoder, coder = self._coders()
            self._ctx = ExclusionContext(
                items_dense=self.dense,
                items_codes=self.codes,
                text_encoder=text_encoder,
                query_coder=coder,
                reference=reference,
                detectors=self.model.detectors,
                concepts=self.model.term_scorer(self._raw_encoder()),
            )
            if self._text_ctx is not None:  # one set of text caches for both contexts
                self._ctx.share_text_caches(self._text_ctx)
        return self._ctx

    def _coders(self) -> tuple[Any, Any]:
        """(text encoder of the dense strategies, query coder of the sparse ones)."""
        text_encoder: Any = self.encoder
        coder = self.model.query_coder()
        if self.aligner is not None:
            # Dense strategies score in the aligned space; SR reads the raw text backbone.
            # Both embed the same texts with it: one cache, so each text is encoded once.
            if self._raw_text is None:
                self._raw_text = CachedTextEncoder(self.encoder)
            text_encoder = AlignedTextEncoder(self._raw_text, self.aligner)
            coder = self.model.query_coder(text_encoder=self._raw_text)
        return text_encoder, coder

    def _raw_encoder(self) -> Any:
        """The collection's text encoder, cached (what the model's term scorer embeds
        unknown terms with to suggest the closest concepts)."""
        if self._raw_text is None:
            self._raw_text = CachedTextEncoder(self.encoder)
        return self._raw_text

    def clear_text_caches(self) -> None:
        """Forget every cached query-text embedding and code (the next query is encoded
        from scratch: what ``benchmarks/two_stage.py`` times as a never-seen query)."""
        for ctx in (self._ctx, self._text_ctx):
            if ctx is not None:
                ctx.clear_text_caches()
        if self._raw_text is not None:
            self._raw_text.cache.clear()

    def query_caches(self) -> list[Any]:
        """Every per-query cache this searcher holds (each an LRU bounded by entries):
        what a long-running server may also clear when they hold too much memory."""
        caches: list[Any] = []
        for ctx in (self._ctx, self._text_ctx):
            if ctx is not None:
                caches += [c for c in ctx.query_caches() if all(c is not d for d in caches)]
        if self._raw_text is not None:
            caches.append(self._raw_text.cache)
        return caches

    @property
    def text_context(self) -> ExclusionContext:
        """A context with no items: query encoders, text caches and the model's detectors.
        The served path scores index candidates in sub-contexts of it."""
        if self._text_ctx is None:
            if self._ctx is not None:
                self._text_ctx = sub_context(
                    self._ctx, sp.csr_matrix((0, self.index.dim), dtype=np.float32)
                )
                self._text_ctx.reference = None
            else:
                text_encoder, coder = self._coders()
                self._text_ctx = ExclusionContext(
                    items_codes=sp.csr_matrix((0, self.index.dim), dtype=np.float32),
                    text_encoder=text_encoder,
                    query_coder=coder,
                    detectors=self.model.detectors,
                    concepts=self.model.term_scorer(self._raw_encoder()),
                )
        return self._text_ctx

    def served(self, strategy: str, **params: Any) -> bool:
        """True when ``strategy`` is answered through the index (candidates + certified
        exact rescoring, :mod:`sparsemm.query.two_stage`) rather than over every code in
        memory: the default ``match`` (its term probabilities come from the model: detectors
        saved with SR, the photo model's units), and ``hybrid`` on codes with the model's own
        detectors (or on a collection with no captions or labels, where no term has one)."""
        if strategy == "match":
            return bool(getattr(self.model, "served_by_index", True))
        if strategy != "hybrid" or params.get("features", "codes") != "codes":
            return False
        if self.model.detectors is not None:
            return True
        return self.captionless

    @property
    def captionless(self) -> bool:
        """The collection has no captions and no labels (read once)."""
        if self._captionless is None:
            items = self.collection.items
            self._captionless = not any(it.get("captions") or it.get("labels") for it in items)
        return self._captionless

    def strategies(self) -> list[str]:
        """The registered strategies this collection can run (what the page's menu offers):
        dense ones only with a shared image-text space, those that learn from captions
        only on a collection with captions or labels, ``match`` with a model whose terms
        it can read."""
        shared = self.aligner is not None or self.collection.dim == self.collection.text_dim
        out = []
        for name in available_strategies():
            spec = get_spec(name)
            if spec.kind == "dense" and not shared:
                continue
            if "reference" in spec.cls.requires and self.captionless:
                continue
            if name == "match" and not (
                self.default_strategy == "match" or self.model.detectors is not None
            ):
                continue
            out.append(name)
        return out

    def dim_words(self, dim: int) -> list[str]:
        data = self.labels_data[dim] if dim < len(self.labels_data) else []
        spine = self.labels_spine[dim] if dim < len(self.labels_spine) else []
        return data or spine

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
        if self._seen_words is None:  # captions, labels and dimension names, read once
            seen: set[str] = set()
            names = self.model.dim_names() or []  # ImageNet classes, VDR tokens
            for it in [*self.collection.items, {"labels": names}]:
                for text in [*(it.get("captions") or []), *(it.get("labels") or [])]:
                    toks = tokenize(str(text))
                    seen.update(toks)
                    seen.update(singular(t) for t in toks)
            self._seen_words = frozenset(seen)
        return bool(forms & self._seen_words)

    # -- search ----------------------------------------------------------------------------
    def check_terms(self, query: Query, strategy: str) -> None:
        """Raise SparsemmError naming a query term that means nothing to the model: its query
        code (sparse strategies) or text embedding (dense ones) is all zeros, or it holds no
        letter or digit (emoji, symbols), so searching for it would return nothing (or noise)
        and excluding it would silently exclude nothing.

        ``strategy`` is a registered strategy name or a kind ("sparse" / "dense"). The
        messages are those of the web API (:mod:`sparsemm.web.app`).
        """
        if strategy == "match":
            self.check_match(query)
            return
        kind = strategy if strategy in ("sparse", "dense") else get_spec(strategy).kind
        ctx = self.text_context
        # Embed (and code) the terms in batches first: one at a time, the 32 terms of a full
        # query were 66 encoder calls (seconds); batches of CHECK_BATCH stay on the light
        # MiniLM path. Same vectors, cached for the search that follows.
        unique = list(dict.fromkeys([*query.include, *query.exclude]))
        for i in range(0, len(unique), CHECK_BATCH):
            ctx.prefetch(unique[i : i + CHECK_BATCH], codes=kind == "sparse")
        for side, terms in (("search for", query.include), ("exclude", query.exclude)):
            for term in terms:
                # A term without a letter or digit (emoji, symbols) names no concept, though
                # a subword encoder embeds it (as [UNK] or byte pieces) to a non-zero vector.
                wordless = not any(ch.isalnum() for ch in term)
                vec = ctx.term_code(term) if kind == "sparse" else ctx.term_embedding(term)
                if wordless or not np.any(vec):
                    raise SparsemmError(
                        f"{term!r} matches no concept of this collection's model, so it "
                        f"cannot {side} anything; check the spelling or try another word"
                    )

    def match_strategy(self, ctx: ExclusionContext | None = None, **params: Any) -> Match:
        """The match scorer over ``ctx`` (default: the text context, for readings; that one
        is built once per text context and reused by every search)."""
        base = ctx if ctx is not None else self.text_context
        reuse = ctx is None and not params
        if reuse and self._match is not None and self._match.ctx is base:
            return self._match
        strat = get_strategy("match", base, **params)
        assert isinstance(strat, Match)
        if reuse:
            self._match = strat
        return strat

    def check_match(self, query: Query) -> None:
        """Raise SparsemmError for a term the match scorer cannot read: no letter or digit,
        nothing the model can see (UnknownTerm, with the closest concepts it knows), or a
        phrase whose code is empty. Readings are cached for the search that follows."""
        strat = self.match_strategy()
        ctx = strat.ctx
        readings = []
        for side, terms in (("search for", query.include), ("exclude", query.exclude)):
            for term in terms:
                if not any(ch.isalnum() for ch in term):
                    raise SparsemmError(
                        f"{term!r} matches no concept of this collection's model, so it "
                        f"cannot {side} anything; check the spelling or try another word"
                    )
                readings.append((side, term, strat.reading(term)))
        # every text the search will embed or code, in batches: the terms, the include
        # text (ties) and the words of the detectors a term is read through
        texts = [*query.include, *query.exclude]
        if query.include:
            texts.append(strat.tie_text(query.include))
        for _, _, reading in readings:
            texts.extend(strat.scorer.texts(reading))
        unique = list(dict.fromkeys(texts))
        for i in range(0, len(unique), CHECK_BATCH):
            ctx.prefetch(unique[i : i + CHECK_BATCH], codes=ctx.query_coder is not None)
        for side, term, reading in readings:
            if reading.kind == "similarity" and not np.any(ctx.term_code(term)):
                raise SparsemmError(
                    f"{term!r} matches no concept of this collection's model, so it "
                    f"cannot {side} anything; check the spelling or try another word"
                )
        refuse_self_exclusion(readings, strat.scorer.vocabulary)

    def notes(self, query: str | Query, strategy: str | None = None) -> list[str]:
        """What the served scorer says about how it read the query's terms ("'woman' is
        searched as 'person': ..."): empty for other strategies or unknown terms."""
        if (strategy or self.default_strategy) != "match":
            return []
        q = parse_query(query) if isinstance(query, str) else query
        strat = self.match_strategy()
        out: list[str] = []
        for t in (*q.include, *q.exclude):
            try:
                out += [n for n in strat.reading(t).notes if n not in out]
            except SparsemmError:
                continue
        return out

    def probabilistic(self, strategy: str | None = None) -> bool:
        """Whether ``strategy``'s scores (default: the model's) are match probabilities."""
        name = strategy or self.default_strategy
        return name in available_strategies() and bool(
            getattr(get_spec(name).cls, "probabilistic", False)
        )

    def count_matches(
        self, query: str | Query, threshold: float = MATCH_THRESHOLD, strategy: str | None = None
    ) -> int | None:
        """How many items have a match probability of at least ``threshold`` (exactly, with
        the index's bounds: :func:`~sparsemm.query.two_stage.count_matches`); None when the
        strategy's scores are not probabilities."""
        if not self.probabilistic(strategy):
            return None
        return self._count(query if isinstance(query, Query) else parse_query(query), threshold)

    def _count(self, q: Query, threshold: float) -> int:
        """:meth:`count_matches` for the match scorer."""
        self.check_terms(q, "match")
        if self.served("match"):
            return count_matches(
                self.store,
                self.text_context,
                q,
                threshold,
                nonnegative=self.index.nonnegative,
                unit_lists=self.unit_lists,
            )
        strat = self.match_strategy(self.context)
        return int((strat.probability(q.include, q.exclude) >= threshold).sum())

    def prepare(self, query: str | Query, strategy: str | None = None, **params: Any) -> None:
        """Encode (and code) ``query``'s texts into the text caches without ranking: what
        :meth:`search` would encode first, with the same errors for bad terms. A server
        calls it before taking a search lane, so the texts of many waiting requests are
        encoded in shared batches while the lanes rank other queries."""
        q = query if isinstance(query, Query) else parse_query(query)
        strategy = strategy or self.default_strategy
        if strategy not in available_strategies():
            return  # search() names it
        if strategy == "match":
            self.check_terms(q, "match")
            return
        kind = "sparse" if self.served(strategy, **params) else get_spec(strategy).kind
        if kind == "dense" and self.dense is None:
            return  # search() explains it
        self.check_terms(q, kind)

    def strategy_spec(self, strategy: str | None = None) -> StrategySpec:
        """The registered strategy a search runs (default: the model's), looked up once per
        search; SparsemmError for an unknown name or a dense strategy this collection has no
        shared image-text space for."""
        name = strategy or self.default_strategy
        if name not in available_strategies():
            raise SparsemmError(
                f"unknown strategy {name!r}; available: {', '.join(available_strategies())}"
            )
        spec = get_spec(name)
        if spec.kind == "dense" and self.dense is None:
            raise SparsemmError(
                f"strategy {name!r} is dense, but this collection's images and texts come "
                "from different backbones with no shared space; rebuild the index with "
                "`sparsemm index ... --dense-model ALIGNER` or use a sparse strategy"
            )
        return spec

    def answer(self, request: QueryRequest) -> Answer:
        """Run one :class:`~sparsemm.query.request.QueryRequest` as every front end does:
        the hits (by the model's default scorer unless the request names another, or like
        an item or image), then what a person reading them needs: whether the scores are
        match probabilities, the hits at ``min_score`` or more and how many items in all
        reach it, how the terms were read, words no vocabulary holds, and whether the index
        path proved the hits exact."""
        q, k, offset = request.query, request.k, request.offset
        name = request.strategy or ("filter" if request.engine == "index" else None)
        spec = self.strategy_spec(name)
        served = None
        if request.engine == "index" or (
            self.store is not self.index and not self.served(spec.name)
        ):
            if self.store is not self.index and (spec.name != "filter" or offset):
                raise SparsemmError(
                    f"--backend {self.store.backend} serves the default ({self.default_strategy}"
                    ", with a model that has detectors: `sparsemm train detectors`) and "
                    "--strategy filter without --offset"
                )
            hits = self.search_index(q, k=k)
        elif request.like is not None:
            if spec.kind == "dense":
                raise SparsemmError(
                    f"strategy {spec.name!r} ranks text embeddings; a like-query is a sparse "
                    "code (use the default or another sparse strategy)"
                )
            by_id = isinstance(request.like, str) and not Path(request.like).is_file()
            # an item may be left out of its own "more like" list (_without_excluded_self):
            # then rank one more from the top, so the page holds k hits at the right ranks
            own = self.row_of(request.like) if by_id and q.exclude else None
            want, first = (offset + k + 1, 0) if own is not None else (k, offset)
            with self.like_term(request.like) as term:
                hits, served = self._ranked(Query((term,), q.exclude), spec, want, first, {})
            if own is not None:
                hits = self._without_excluded_self(hits, own)[offset : offset + k]
                for i, h in enumerate(hits):
                    h.rank = offset + i + 1
        else:
            hits, served = self._ranked(q, spec, k, offset, {})
        hits = [h for h in hits if math.isfinite(h.score)]
        prob = bool(getattr(spec.cls, "probabilistic", False))
        if request.min_score is not None and not prob:
            if spec.name == self.default_strategy:  # "use the default" would be no help
                raise SparsemmError(
                    "a minimum score keeps matches by probability, and this collection's "
                    f"model gives none (its default scorer, {spec.name}, ranks by "
                    "similarity; an SR model needs word detectors: `sparsemm train "
                    "detectors MODEL COLLECTION`); search without --min-score"
                )
            raise SparsemmError(
                f"a minimum score keeps matches by probability; the {spec.name} scorer's "
                "scores are not probabilities (use the default scorer)"
            )
        if request.min_score is not None:
            hits = [h for h in hits if h.score >= request.min_score]
        threshold = matches = None
        if prob and request.like is None and (request.count or request.min_score is not None):
            threshold = request.min_score if request.min_score is not None else MATCH_THRESHOLD
            matches = self._count(q, threshold)
        notes = self.notes(q, spec.name) if request.like is None else []
        certified = served is None or served.certified
        if served is not None and not served.certified:
            notes.append(
                f"the index path stopped at {served.candidates} candidates before proving "
                "these are the exact top results (very large collections); they are the best "
                "of those"
            )
        return Answer(
            query=q,
            strategy=spec.name,
            hits=hits,
            probabilistic=prob,
            min_score=request.min_score,
            threshold=threshold,
            matches=matches,
            certified=certified,
            notes=notes,
            unknown_words=self._unread_words(q, spec.name),
        )

    def _unread_words(self, q: Query, strategy: str) -> list[str]:
        """:meth:`unknown_words` less the words of terms the match scorer read as concepts
        (through the hierarchy, not as subword pieces: "selfie" read as a face)."""
        unknown = self.unknown_words(q)
        if not unknown or strategy != "match":
            return unknown
        read: set[str] = set()
        strat = self.match_strategy()
        for t in (*q.include, *q.exclude):
            try:
                if strat.reading(t).kind == "concepts":
                    read.update(tokenize(t))
            except SparsemmError:
                continue
        return [w for w in unknown if w not in read]

    @staticmethod
    def _without_excluded_self(hits: list[Hit], own: int) -> list[Hit]:
        """The hits of "more like item X, but not B" without X (collection row ``own``)
        when X likely carries an excluded term (its own code matches itself best, so it
        came first regardless)."""
        return [
            h
            for h in hits
            if not (
                h.row == own
                and any(e.side == "exclude" and e.value >= MATCH_THRESHOLD for e in h.evidence)
            )
        ]

    def search(
        self,
        query: str | Query,
        k: int = 10,
        strategy: str | None = None,
        exclude: tuple[str, ...] = (),
        offset: int = 0,
        **params: Any,
    ) -> list[Hit]:
        """Top ``k`` hits (after ``offset``) for a query; several excluded terms all apply.
        ``strategy`` defaults to the model's (``match`` for SR and the concept models,
        ``code_arith`` for VDR).

        The default scorer is served through the index (:meth:`served`: candidates, then
        exact rescoring, certified equal to ranking every item); other strategies rank
        every item with :func:`sparsemm.query.rank.rank_query`, the function the benchmarks
        use. Raises SparsemmError for bad input, including a term the model knows nothing
        about (:meth:`check_terms`). :meth:`answer` is the same search with what the front
        ends show around the hits."""
        if k < 1 or offset < 0:
            raise SparsemmError("k must be >= 1 and offset >= 0")
        q = query if isinstance(query, Query) else parse_query(query, exclude=exclude)
        return self._ranked(q, self.strategy_spec(strategy), k, offset, params)[0]

    def _ranked(
        self, q: Query, spec: StrategySpec, k: int, offset: int, params: dict[str, Any]
    ) -> tuple[list[Hit], ServedResult | None]:
        """The hits of a checked query and strategy, with how the index path served them
        (None: ranked over every code in memory)."""
        strategy = spec.name
        served = self.served(strategy, **params)
        res: ServedResult | None = None
        if served and strategy == "match":
            base = self.text_context
            self.check_terms(q, "match")
            res = served_match(
                self.store,
                base,
                q,
                k=k,
                offset=offset,
                nonnegative=self.index.nonnegative,
                unit_lists=self.unit_lists,
                **params,
            )
            rows, scores = res.rows, res.scores
        elif served:
            base = self.text_context
            self.check_terms(q, "sparse")  # served() means hybrid on codes
            res = served_rank(
                self.store,
                base,
                q,
                strategy,
                k=k,
                offset=offset,
                nonnegative=self.index.nonnegative,  # a remote store holds the same codes
                **params,
            )
            rows, scores = res.rows, res.scores
        else:
            base = self.context
            strat = spec.build(base, **params)
            self.check_terms(q, "match" if isinstance(strat, Match) else strat.kind)
            rows, scores = rank_query(base, q, strat, k=k, offset=offset)
        self.last_served = res
        # Explanations read only the hits' codes, from the index's row store; the served
        # path's evidence is computed on a context of just those rows.
        codes = sp.csr_matrix(self._codes_of(rows))
        codes.sort_indices()
        if served:
            strat = spec.build(sub_context(base, codes), **params)
        at_hits = served  # evidence arrays hold the hits in order (else every item)
        if isinstance(strat, Match):
            # the probability itself, not the rank key (P at 1% with ties broken)
            p = strat.probability(q.include, q.exclude)
            scores = p if served else p[np.asarray(rows, dtype=np.int64)]
        why = self.explainer(q)
        terms: list[tuple[str, str, str, np.ndarray, np.ndarray, list[str]]] = []
        if isinstance(strat, Match):
            for side, group in (("include", q.include), ("exclude", q.exclude)):
                terms += [
                    (t, side, *self._match_evidence(strat, t, side == "exclude")) for t in group
                ]
        elif isinstance(strat, Hybrid):
            for side, group in (("include", q.include), ("exclude", q.exclude)):
                terms += [(t, side, *self._term_evidence(strat, t), []) for t in group]
        hits = []
        for i, (r, sc) in enumerate(zip(rows, scores, strict=True)):
            h = self._hit(offset + i + 1, int(r), float(sc), why, codes, i)
            at = i if at_hits else int(r)  # where the evidence arrays hold this item
            h.evidence = [term_evidence(codes, i, at, self.dim_words, *t) for t in terms]
            h.scored_by = {e.term: e.kind for e in h.evidence}
            hits.append(h)
        return hits, res

    def _match_evidence(
        self, strat: Match, term: str, excluded: bool = False
    ) -> tuple[str, np.ndarray, np.ndarray, list[str]]:
        """(kind, (n,) P(term | item), (d,) per-dimension weight, unit names) of one term
        for the match scorer: the dims are the reading's units (the photo model), the
        detector's weights (SR), or the phrase's query code."""
        reading = strat.reading(term)
        d = self.index.dim
        weight = np.zeros(d, dtype=np.float64)
        names: list[str] = []
        scorer = strat.scorer
        if reading.kind == "similarity":
            weight = np.asarray(normalize_rows(strat.ctx.term_code(term)), dtype=np.float64)
        elif isinstance(scorer, DetectorScorer):
            for c in reading.concepts:
                for u, _ in c.units[:8]:
                    w, _, _ = scorer.detectors.column_at(u)
                    weight = np.maximum(weight, np.asarray(w, dtype=np.float64))
        else:
            for c in reading.concepts:
                for u, w in c.units:
                    if u < d:
                        weight[u] = max(weight[u], w)
        for c in reading.concepts:
            names.append(c.label)
        kind = reading.source or reading.kind
        return kind, strat.term_probability(term, excluded), weight, names

    @staticmethod
    def _term_evidence(strat: Hybrid, term: str) -> tuple[str, np.ndarray, np.ndarray]:
        """(kind, (n,) value per item of the strategy's context, (d,) per-dimension weight)
        of one query term."""
        if strat.has_detector(term):
            return "detector", strat.present(term), strat.detector_weights(term)
        code = normalize_rows(strat.ctx.term_code(term))
        return "code similarity", strat.similarity(term), np.asarray(code, dtype=np.float64)

    def _hit(
        self, rank: int, row: int, score: float, why: Explainer, codes: sp.csr_matrix, i: int
    ) -> Hit:
        """Hit for collection ``row``, whose code is row ``i`` of ``codes`` (sorted CSR)."""
        item = self.collection.items[row]
        caps = item.get("captions") or [""]
        hit = Hit(
            rank=rank,
            row=row,
            id=str(item["id"]),
            score=score,
            caption=caps[0],
            labels=list(item.get("labels", [])),
            also=[str(a) for a in item.get("also") or []],
        )
        hit.matched, hit.excluded = why.explain(codes, i)
        return hit

    def explainer(self, q: Query, n_dims: int = 5) -> Explainer:
        """What explaining any hit of ``q`` needs, computed once per query: the include
        code and each excluded term's dimensions with their words: the 6 its detector
        weighs most when the model has one, else those the ``filter`` strategy drops items
        on (the active dims of the term's query code)."""
        ctx = self.text_context
        a = q.include_text
        filt: HardFilter | None = None  # built only for a term nothing else reads
        checks = []
        model = self.model.detectors
        match = self.match_strategy() if self.default_strategy == "match" else None
        for b in q.exclude:
            units = self._reading_dims(match, b) if match is not None else None
            if units is not None:
                # the dims of the units the match scorer read the term as (the photo model)
                on = np.zeros(self.index.dim, dtype=bool)
                on[units] = True
            elif model is not None and b in model:
                # The dims the term's detector weighs most: what says "b is here".
                w = model.column(b)[0]
                on = np.zeros(len(w), dtype=bool)
                on[[j for j in np.argsort(-w, kind="stable")[:6] if w[j] > 0]] = True
            else:
                if filt is None:
                    built = get_strategy("filter", ctx, dims="query")
                    assert isinstance(built, HardFilter)
                    filt = built
                on = filt.b_weights(a, b) > 0  # (d,) bool: the dims `filter` drops items on
            dims = [int(j) for j in np.flatnonzero(on)]
            words = sorted({w for j in dims[:3] for w in self.dim_words(j)[:2]})
            checks.append((b, dims, on, words))
        include_code = ctx.term_code(a) if a else np.zeros(self.index.dim, np.float32)
        if match is not None and q.include:
            dims = [u for t in q.include for u in (self._reading_dims(match, t) or [])]
            if dims:  # the match scorer's own reading of the include terms
                include_code = np.zeros(self.index.dim, np.float32)
                include_code[dims] = 1.0
        return Explainer(include_code, checks, self.dim_words, n_dims)

    def _reading_dims(self, match: Match, term: str) -> list[int] | None:
        """Code dimensions a term was read as, when its units are dimensions (the photo
        model: classes and the face unit, direct ones first); None otherwise."""
        if isinstance(match.scorer, DetectorScorer):
            return None
        try:
            reading = match.reading(term)
        except SparsemmError:
            return None
        units = [
            u
            for c in reading.concepts
            for u, w in sorted(c.units, key=lambda x: -x[1])
            if u < self.index.dim
        ]
        return list(dict.fromkeys(units)) or None

    def item_code(self, row: int) -> sp.csr_matrix:
        """(1, d) sorted CSR code of one item, read from the index."""
        return self.item_codes([row])

    def item_codes(self, rows: Any) -> sp.csr_matrix:
        """(len(rows), d) sorted CSR codes of items, read from the index in one call."""
        codes = sp.csr_matrix(self._codes_of(np.asarray(rows, dtype=np.int64)))
        codes.sort_indices()
        return codes

    def explain(
        self, row: int, q: Query, n_dims: int = 5
    ) -> tuple[list[Concept], list[ExcludedCheck]]:
        """Matched concepts (top q_j x_j over the include code) and excluded-term checks."""
        return self.explainer(q, n_dims).explain(self.item_code(row), 0)

    def search_index(
        self,
        query: str | Query,
        k: int = 10,
        exclude: tuple[str, ...] = (),
        **params: Any,
    ) -> list[Hit]:
        """Scalable path for strategy ``filter``: the inverted index scores A's code and
        applies B's dimensions as a hard :class:`~sparsemm.index.Exclusion`.

        Returns the same ranking as ``search(..., strategy="filter", dims="query")``: the
        index holds unit-length codes, so its inner product is their cosine with the query;
        B's dims and the threshold come from the ``filter`` strategy itself.
        """
        q = query if isinstance(query, Query) else parse_query(query, exclude=exclude)
        strat = get_strategy("filter", self.text_context, **{"dims": "query", **params})
        assert isinstance(strat, HardFilter)
        self.check_terms(q, "sparse")
        if not q.include:
            raise SparsemmError(
                "the index engine needs something to include; an exclusion-only query is "
                "ranked by the default strategy (drop --engine index)"
            )
        a = q.include_text
        ex = None
        if q.exclude:
            dims = np.unique(
                np.concatenate([np.flatnonzero(strat.b_weights(a, b) > 0) for b in q.exclude])
            )
            ex = Exclusion(dims, threshold=float(strat.p["threshold"]), mode="filter")
        qa = self.text_context.term_code(a)
        qa = qa / max(float(np.linalg.norm(qa)), 1e-12)  # scores = cosine, as in `search`
        res = self.store.search(qa, k=k, exclude=ex)
        why = self.explainer(q)
        keep = [i for i, s in enumerate(res.scores) if s > 0]  # no concept in common: no match
        rows = np.asarray(res.rows, dtype=np.int64)[keep]
        codes = sp.csr_matrix(self._codes_of(rows))
        codes.sort_indices()
        return [
            self._hit(i + 1, int(r), float(res.scores[keep[i]]), why, codes, i)
            for i, r in enumerate(rows)
        ]

    def _codes_of(self, rows: np.ndarray) -> sp.csr_matrix:
        """Codes of ``rows`` from the serving store (the collection's index by default)."""
        return self.store.codes(np.asarray(rows, dtype=np.int64))

    # -- image queries ("more like this, but not X") ------------------------------------
    @property
    def image_encoder(self) -> Any:
        """The collection's own image encoder (same name and model), for query images."""
        if self._image_encoder is None:
            info = self.collection.manifest["encoder"]
            # a packaged model is recorded by its name (efficientnet-lite0), a local one by
            # its folder; only the folder is an argument of the encoder
            model = info.get("model")
            kwargs = {"model": model} if model and Path(str(model)).expanduser().is_dir() else {}
            enc = get_encoder(str(info["name"]), **kwargs)
            if int(enc.dim) != self.collection.dim:
                raise SparsemmError(
                    f"the {info['name']} encoder gives {enc.dim}-d vectors but the collection's "
                    f"images are {self.collection.dim}-d; re-encode the collection"
                )
            self._image_encoder = enc
        return self._image_encoder

    def row_of(self, item_id: str) -> int:
        """The collection row of ``item_id``; SparsemmError when there is no such item."""
        if self._rows is None:
            self._rows = {str(i): r for r, i in enumerate(self.collection.ids)}
        row = self._rows.get(str(item_id))
        if row is None:  # a file name given with its own bytes (caf\xe9.png)
            row = self._rows.get(text_name(str(item_id)))
        if row is None:
            raise SparsemmError(f"no item {item_id!r} in {self.collection.root}; check the id")
        return row

    def image_code(self, image: Any) -> np.ndarray:
        """(d,) item code of a query image (a path or PIL image): embedded with the
        collection's image encoder, then coded as :meth:`CodeModel.encode_items` codes an
        item (SR: the image side; VDR: spatial features; ImageNet concepts: the classifier
        head)."""
        try:
            code = self.model.encode_query_images([image], self.image_encoder)
        except SparsemmError:
            raise
        except Exception as exc:  # a corrupt or unreadable image file
            raise SparsemmError(f"could not read the query image: {exc}") from exc
        return np.asarray(sp.csr_matrix(code).toarray()[0], dtype=np.float32)

    def like_code(self, like: Any) -> tuple[str, np.ndarray]:
        """(label, (d,) code) of a "more like this" target: an item id of the collection
        (its stored code from the index) or an image file."""
        if isinstance(like, str) and not Path(like).is_file():
            row = self.row_of(like)
            code = np.asarray(self.item_code(row).toarray()[0], dtype=np.float32)
            return f"item {self.collection.ids[row]}", code
        if isinstance(like, str | Path) and not Path(like).is_file():
            raise SparsemmError(f"query image not found: {like}")
        name = text_name(Path(like).name) if isinstance(like, str | Path) else "uploaded image"
        return f"image {name}", self.image_code(like)

    def search_like(
        self,
        like: Any,
        exclude: tuple[str, ...] = (),
        k: int = 10,
        strategy: str | None = None,
        offset: int = 0,
    ) -> list[Hit]:
        """ "More like this, but not X": rank with ``like``'s code (see :meth:`like_code`) as
        the include side and ``exclude`` applied, through the same scorer as a text query.

        The code stands in for an include term's query code (a pseudo-term, named
        "like: LABEL", whose cached code is the item code): the served ``match`` scores
        ``cos(code, x) prod_B (1 - P(B | x))`` (``hybrid``: ``alpha cos(code, x) - gamma
        sum_B cos(q_B, x) + beta sum_B log(1 - P(B | x) / c_B)``), through the same
        certified index path as text. Dense strategies are refused: the code is not a text
        embedding.
        """
        query = Query((), tuple(exclude)) if exclude else Query.empty()
        request = QueryRequest(query, k, offset, strategy, like)
        return self.answer(request).hits

    @contextlib.contextmanager
    def like_term(self, like: Any) -> Iterator[str]:
        """A pseudo include term ("like: LABEL") whose query code is ``like``'s code (see
        :meth:`like_code`) while the block runs; removed afterwards, so a typed query never
        meets it. Not thread-safe: the web service holds its lock around it."""
        label, code = self.like_code(like)
        if not np.any(code):
            raise SparsemmError(f"the {label} has an empty code: nothing to search like it")
        term = f"{LIKE_PREFIX}{label}"
        ctxs = [c for c in (self.text_context, self._ctx) if c is not None]
        for ctx in ctxs:
            ctx.pin_query_code(term, code)
        try:
            yield term
        finally:  # the full context may have been built meanwhile: clear it too
            for late in (self.text_context, self._ctx, *ctxs):
                if late is not None:
                    late.pin_query_code(term, None)

    def explain_like(
        self, row: int, like: Any, exclude: tuple[str, ...] = (), n_dims: int = 5
    ) -> tuple[list[Concept], list[ExcludedCheck]]:
        """:meth:`explain` for a like-query: the concepts item ``row`` shares with ``like``."""
        with self.like_term(like) as term:
            return self.explain(row, Query((term,), tuple(exclude)), n_dims)
