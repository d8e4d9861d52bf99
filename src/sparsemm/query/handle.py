"""One indexed collection, opened and checked once: :class:`IndexedCollection`.

It opens a collection, its index (or another store holding the same codes: Qdrant) and the
model the index names, refuses what does not fit together (a damaged or stale index, a
moved model, edited settings), and holds what every search of it shares: the items'
codes, the query text encoders and their caches, the scoring contexts, the unit lists of
the served ``match`` and the dimension names. :class:`~sparsemm.query.searcher.Searcher`
answers queries over it; index building reads it for the unit lists.
"""

from __future__ import annotations

import logging
from itertools import zip_longest
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import (
    UP_LOCK,
    Collection,
    collection_root,
    open_collection,
    relocated,
    up_args,
)
from sparsemm.data.sources import text_name
from sparsemm.encoders.base import CachedTextEncoder, collection_encoder
from sparsemm.encoders.batching import MAX_BATCH, BatchingTextEncoder
from sparsemm.encoders.text_store import query_text_encoder
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.index.store import Store
from sparsemm.io import lock_holder, read_json
from sparsemm.models.base import EncoderMismatch, check_encoders
from sparsemm.models.lit_lite import AlignedTextEncoder, AlignerLite
from sparsemm.query.code_models import SettingsChanged, load_code_model
from sparsemm.query.strategies import (
    STRATEGIES,
    ExclusionContext,
    Match,
    ReferenceSet,
    StrategySpec,
    available_strategies,
    get_spec,
    get_strategy,
)
from sparsemm.query.unit_lists import UnitLists

log = logging.getLogger(__name__)

_H = TypeVar("_H", bound="IndexedCollection")

INDEX_DIR = "index"
LEGACY_LABELS = "labels.json"


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


def _refuse_while_up_runs(collection: Collection, photos: str | None) -> None:
    """SparsemmError saying so when a running `sparsemm up` holds the folder of
    ``collection`` (its index is then being brought up to date, not damaged); ``photos``:
    :meth:`~sparsemm.data.collection.Collection.up_args` of it."""
    pid = None if photos is None else lock_holder(collection.root.parent / UP_LOCK)
    if pid is not None:
        raise SparsemmError(
            f"`sparsemm up {photos}` is updating this collection (pid {pid}); search again "
            "when it has finished"
        )


def _up_again(exc: SparsemmError, photos: str) -> SparsemmError:
    """``exc`` (a damaged collection or model file of a `sparsemm up` folder) with its
    remedy ("re-create it", "re-run `sparsemm encode`") replaced by the command that
    repairs it: `sparsemm up` re-encodes a collection it cannot open and writes its concept
    model again."""
    text = str(exc)
    head, sep, tail = text.rpartition("; ")
    if sep and tail.startswith("re-"):
        text = head
    return SparsemmError(f"{text}; run `sparsemm up {photos}` again to repair it")


def _open_up_collection(collection_dir: str | Path) -> Collection:
    """open_collection, whose errors for a folder `sparsemm up` made name `sparsemm up`
    (which repairs it) rather than `sparsemm encode`."""
    try:
        return open_collection(collection_dir)
    except SparsemmError as exc:
        root = collection_root(collection_dir)
        try:
            manifest = read_json(root / "manifest.json")
        except (SparsemmError, OSError):
            manifest = None
        photos = up_args(root, manifest)
        if photos is None:
            raise
        raise _up_again(exc, photos) from exc


class IndexedCollection:
    """An indexed collection opened for searching (see the module docstring)."""

    def __init__(
        self,
        collection_dir: str | Path,
        encoder: Any = None,
        store: Store | None = None,
        image_encoder: Any = None,
        in_memory: bool = False,
    ) -> None:
        self.collection: Collection = _open_up_collection(collection_dir)
        # collection.root: where open_collection found it (a crash may have parked it aside)
        root = self.collection.root / INDEX_DIR
        meta = self._open_index(collection_dir, root, store, in_memory)
        self._open_model(collection_dir, root, meta)
        labels = meta.get("labels")
        if not isinstance(labels, dict):  # an index built before labels lived in its meta
            legacy = root / LEGACY_LABELS
            labels = read_json(legacy) if legacy.is_file() else {}
        self.labels_data: list[list[str]] = _label_lists(labels, "data", root)
        self.labels_spine: list[list[str]] = _label_lists(labels, "spine", root)
        # each dimension's words: the data's, else SPINE's (dim_words)
        words: Any = zip_longest(self.labels_data, self.labels_spine, range(self.dim), fillvalue=[])
        self.dim_labels: list[list[str]] = [d or w for d, w, _ in words]
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
        self._captionless: bool | None = None
        self._image_encoder: Any = image_encoder  # query images (search_like)
        self._rows: dict[str, int] | None = None
        self._raw_text: CachedTextEncoder | None = None  # shared by aligned space and coder
        self.seen_words: frozenset[str] | None = None  # caption and label words (unknown_words)
        self._unit_lists: Any = False  # not looked for yet (None: none that fit)
        self._match: Match | None = None  # the match scorer over the text context

    def _open_index(
        self, collection_dir: str | Path, root: Path, store: Store | None, in_memory: bool
    ) -> dict[str, Any]:
        """Open the collection's index (and check ``store`` holds the same items); its
        manifest's meta once checked: the model it names is there, a valid top_k."""
        if not (root / "manifest.json").is_file():
            photos = self.collection.up_args()
            _refuse_while_up_runs(self.collection, photos)
            if photos is not None:  # `up` was stopped between the collection and the index
                raise SparsemmError(
                    f"{collection_dir} has no index yet (was `sparsemm up` interrupted?); run "
                    f"`sparsemm up {photos}` again: it builds the index from the "
                    "stored embeddings"
                )
            raise SparsemmError(
                f"{collection_dir} has no index; build it with `sparsemm index "
                f"{collection_dir} --model MODEL_DIR`"
            )
        try:
            self.index = InvertedIndex.open(root, in_memory=in_memory)
        except SparsemmError as exc:  # damaged: say how to build it again, with what
            photos = self.collection.up_args()
            if photos is None:
                raise SparsemmError(f"{exc} ({_rebuild_hint(collection_dir, root)})") from exc
            text, sep, _ = str(exc).rpartition("; rebuild")
            raise SparsemmError(
                f"{text if sep else exc}; run `sparsemm up {photos}` again: it rebuilds the "
                "index from the stored embeddings"
            ) from exc
        self.dim: int = self.index.dim  # code dimensions
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
            photos = self.collection.up_args()
            _refuse_while_up_runs(self.collection, photos)
            # `up` stopped between rewriting the collection and updating its index
            remedy = (
                f"run `sparsemm up {photos}` again to bring it up to date"
                if photos is not None
                else f"rebuild it ({_rebuild_hint(collection_dir, root)})"
            )
            raise SparsemmError(
                f"the index in {root} does not match the collection's items; {remedy}"
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
        meta = dict(meta)
        for key in ("model", "dense_model"):
            if not meta.get(key):
                continue
            # the model `up` keeps in the photo folder moves with it: read it where it is now
            there = relocated(Path(str(meta[key])), self.collection.photos_moved)
            if there is not None and there.exists():
                meta[key] = str(there)
            elif not Path(str(meta[key])).exists():
                photos = self._up_model(meta[key])
                if photos is not None:  # up writes its model again
                    raise SparsemmError(
                        f"the model {meta[key]} the index in {root} was built with is no "
                        f"longer there; run `sparsemm up {photos}` again to repair it"
                    )
                raise SparsemmError(
                    f"the index in {root} was built with the {key.replace('_', ' ')} "
                    f"{meta[key]}, which is no longer there (moved or deleted?); rebuild the "
                    f"index with `sparsemm index {collection_dir} --model MODEL_DIR"
                    f"{' --dense-model ALIGNER_DIR' if key == 'dense_model' else ''}` naming "
                    "where it is now"
                )
        self.top_k = top_k
        return meta

    def _open_model(self, collection_dir: str | Path, root: Path, meta: dict[str, Any]) -> None:
        """Load the model the index names; refuse edited settings or other encoders."""
        try:
            self.model = load_code_model(
                meta["model"],
                self.top_k,
                collection=(self.collection.manifest, collection_dir),
                config_sha256=meta.get("model_config_sha256"),
            )
        except SettingsChanged:
            photos = self.collection.up_args()
            again = (
                f"run `sparsemm up {photos}` again"
                if photos is not None
                else f"rebuild the index with `sparsemm index {collection_dir} --model "
                f"{meta['model']}`"
            )
            raise SparsemmError(
                f"the settings in {meta['model']}/config.json changed since the index in "
                f"{root} was built (their checksum differs from the one the index recorded); "
                f"restore them, or {again}"
            ) from None
        except EncoderMismatch:
            raise
        except SparsemmError as exc:
            photos = self._up_model(meta["model"])
            if photos is None:
                raise
            raise _up_again(exc, photos) from exc
        self.default_strategy: str = self.model.default_strategy

    def _up_model(self, model: Any) -> str | None:
        """The `sparsemm up` arguments that repair ``model``: when the collection is up's
        and the model is one up keeps beside it (OUT/model, OUT/sr); else None."""
        photos = self.collection.up_args()
        out = self.collection.root.parent
        mine = {(out / name).resolve() for name in ("model", "sr")}
        return photos if photos is not None and Path(str(model)).resolve() in mine else None

    def close(self) -> None:
        """Close a store this searcher was given (a Qdrant client); the collection's own
        index needs no closing."""
        if self.store is not self.index:
            self.store.close()

    def __enter__(self: _H) -> _H:
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
            det = self.model.detectors  # the text context's
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

    @property
    def encoder(self) -> Any:
        """The collection's own text encoder (same name and model), for query texts."""
        if self._encoder is None:
            info = self.collection.manifest.get("text_encoder", self.collection.manifest["encoder"])
            self._encoder = query_text_encoder(info, self.collection.text_dim)
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
            text_encoder, coder, concepts = self._text_parts()
            self._ctx = ExclusionContext(
                items_dense=self.dense,
                items_codes=self.codes,
                text_encoder=text_encoder,
                query_coder=coder,
                reference=reference,
                detectors=self.model.detectors,
                concepts=concepts,
            )
            if self._text_ctx is not None:  # one set of text caches for both contexts
                self._ctx.share_text_caches(self._text_ctx)
        return self._ctx

    def _text_parts(self) -> tuple[Any, Any, Any]:
        """(text encoder of the dense strategies, query coder of the sparse ones, the
        model's term scorer: it embeds unknown terms with the collection's text encoder,
        cached, to suggest the closest concepts)."""
        text_encoder: Any = self.encoder
        coder = self.model.query_coder()
        if self._raw_text is None:
            self._raw_text = CachedTextEncoder(self.encoder)
        if self.aligner is not None:
            # Dense strategies score in the aligned space; SR reads the raw text backbone.
            # Both embed the same texts with it: one cache, so each text is encoded once.
            text_encoder = AlignedTextEncoder(self._raw_text, self.aligner)
            coder = self.model.query_coder(text_encoder=self._raw_text)
        return text_encoder, coder, self.model.term_scorer(self._raw_text)

    def built_contexts(self) -> list[ExclusionContext]:
        """The scoring contexts built so far (the text context, the full one)."""
        return [c for c in (self._text_ctx, self._ctx) if c is not None]

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
                self._text_ctx = self._ctx.sub(sp.csr_matrix((0, self.dim), dtype=np.float32))
                self._text_ctx.reference = None
            else:
                text_encoder, coder, concepts = self._text_parts()
                self._text_ctx = ExclusionContext(
                    items_codes=sp.csr_matrix((0, self.dim), dtype=np.float32),
                    text_encoder=text_encoder,
                    query_coder=coder,
                    detectors=self.model.detectors,
                    concepts=concepts,
                )
        return self._text_ctx

    def served(self, strategy: str, **params: Any) -> bool:
        """True when ``strategy`` is answered through the index (candidates + certified
        exact rescoring, :mod:`sparsemm.query.strategies.ranking`) rather than over every code in
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

    def probabilistic(self, strategy: str | None = None) -> bool:
        """Whether ``strategy``'s scores (default: the model's) are match probabilities."""
        name = strategy or self.default_strategy
        return name in available_strategies() and bool(
            getattr(get_spec(name).cls, "probabilistic", False)
        )

    def strategy_spec(self, strategy: str | None = None) -> StrategySpec:
        """The registered strategy a search runs (default: the model's), looked up once per
        search; SparsemmError for an unknown name or a dense strategy this collection has no
        shared image-text space for."""
        name = strategy or self.default_strategy
        spec = STRATEGIES.get(name)
        if spec is None:
            raise SparsemmError(f"unknown strategy {name!r}; available: {', '.join(STRATEGIES)}")
        if spec.kind == "dense" and self.dense is None:
            raise SparsemmError(
                f"strategy {name!r} is dense, but this collection's images and texts come "
                "from different backbones with no shared space; rebuild the index with "
                "`sparsemm index ... --dense-model ALIGNER` or use a sparse strategy"
            )
        return spec

    def dim_words(self, dim: int) -> list[str]:
        return self.dim_labels[dim] if dim < len(self.dim_labels) else []

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

    def item_code(self, row: int) -> sp.csr_matrix:
        """(1, d) sorted CSR code of one item, read from the index."""
        return self.item_codes([row])

    def item_codes(self, rows: Any) -> sp.csr_matrix:
        """(len(rows), d) sorted CSR codes of items, read from the index in one call."""
        codes = sp.csr_matrix(self.store.codes(np.asarray(rows, dtype=np.int64)))
        codes.sort_indices()  # from the serving store (the collection's index by default)
        return codes

    @property
    def image_encoder(self) -> Any:
        """The collection's own image encoder (same name and model), for query images."""
        if self._image_encoder is None:
            info = self.collection.manifest["encoder"]
            self._image_encoder = collection_encoder(info, self.collection.dim, "images")
        return self._image_encoder

    def row_of(self, item_id: str) -> int:
        """The collection row of ``item_id``; SparsemmError when there is no such item."""
        if self._rows is None:
            self._rows = {str(i): r for r, i in enumerate(self.collection.ids)}
        row = self._rows.get(str(item_id))
        if row is None:  # a file name given with its own bytes (caf\xe9.png)
            row = self._rows.get(text_name(str(item_id)))
        if row is None:
            raise SparsemmError(no_item(item_id, self.collection.root))
        return row


def no_item(item_id: str, collection: str | Path) -> str:
    """The one-line error for a "more like this" that names neither an item nor a file."""
    return (
        f"no item {item_id!r} in {collection}, and no picture file at that path; "
        "give an item id (as search prints it) or the path of a picture"
    )
