"""The sparse models an index can serve: one interface over SR, the concept models and VDR.

``sparsemm index --model DIR`` and the :class:`~sparsemm.query.searcher.Searcher` load a
model folder with :func:`load_code_model`, which dispatches on the ``model_type`` recorded
in its ``config.json``:

- ``sr``: codes of the collection's image embeddings (or caption views); queries coded from
  the text backbone's embedding; dimensions labelled by the captions of the items that
  activate them (and SPINE's top words).
- ``vdr``: codes in the BERT vocabulary space, labelled by their tokens. Its adapter lives
  in ``sparsemm_experiments`` and comes in through the ``sparsemm.models`` entry point.
- ``imagenet_concepts``: codes over the 1000 ImageNet-1k classes of EfficientNet-Lite0's
  head (no captions, no training); queries mapped onto classes through the text encoder
  (:mod:`sparsemm.models.concepts`). A dimension is a class, labelled by its name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection
from sparsemm.encoders.base import as_image_encoder
from sparsemm.errors import SparsemmError
from sparsemm.io import read_json
from sparsemm.models.base import check_encoders, config_digest
from sparsemm.models.detectors import ConceptDetectors, has_detectors
from sparsemm.query.strategies import QueryCoder, sr_query_coder
from sparsemm.text import term_text

log = logging.getLogger(__name__)

# What a query image on a collection without an image encoder (caption views) can do instead.
QUERY_IMAGE_HINT = (
    "a query image needs a collection embedded from its images; search like an item of the "
    "collection instead (its id)"
)


class CodeModel(Protocol):
    """What the index and the searcher need of a sparse model."""

    kind: str  # the config's model_type
    default_strategy: str  # what a search uses when the user names no strategy
    top_k: int  # active dimensions per code at inference
    unit_codes: bool  # codes are indexed L2-normalised (False: they hold probabilities)
    training_info: dict[str, Any] | None  # encoders it was trained on (None: unknown)
    detectors: ConceptDetectors | None  # concept detectors saved with it (None: none)

    def encode_items(self, collection: Collection, progress: bool = False) -> sp.csr_matrix:
        """Codes (n_items, d) of every collection item."""
        ...

    def encode_query_images(self, images: Sequence[Any], image_encoder: Any) -> sp.csr_matrix:
        """Codes (n, d) of query images (paths or PIL images) embedded with the collection's
        own ``image_encoder``, coded as :meth:`encode_items` codes an item."""
        ...

    def query_coder(self, text_encoder: Any = None) -> QueryCoder:
        """A query coder; ``text_encoder`` embeds texts for models that read embeddings."""
        ...

    def dim_names(self) -> list[str] | None:
        """A fixed name per dimension (VDR: its token), or None (labels come from data)."""
        ...

    served_by_index: bool  # the match scorer is answered through the index

    def term_scorer(self, text_encoder: Any = None) -> Any:
        """The match scorer's term probabilities (:mod:`sparsemm.query.scorers`), or None
        when they come from the detectors (SR) or the model has none (VDR)."""
        ...


class SRCodeModel:
    kind = "sr"
    unit_codes = True
    served_by_index = True

    def __init__(self, path: str | Path, top_k: int | None = None) -> None:
        from sparsemm.models.sr_lite import SRLite

        # numpy codes (the torch model's, within float rounding): no torch import
        self.model = SRLite.from_pretrained(path)
        cfg = self.model.config
        self.top_k = int(top_k or cfg.inference_top_k or cfg.top_k)
        self.training_info = self.model.training_info
        self.detectors: ConceptDetectors | None = (
            ConceptDetectors.for_model(path) if has_detectors(path) else None
        )
        # The calibrated match probability when the model has detectors (its term
        # probabilities); without them no term has one, and the older hybrid scorer falls
        # back to code similarity.
        self.default_strategy = "match" if self.detectors is not None else "hybrid"

    def encode_items(self, collection: Collection, progress: bool = False) -> sp.csr_matrix:
        return sp.csr_matrix(
            self.model.encode(collection.image_embeddings(), "image", top_k=self.top_k)
        )

    def term_scorer(self, text_encoder: Any = None) -> Any:
        return None

    def encode_embeddings(self, emb: np.ndarray) -> sp.csr_matrix:
        """Codes (n, d) of image embeddings (n, k): what :meth:`encode_items` does per item,
        for a query image embedded outside the collection."""
        return sp.csr_matrix(self.model.encode(emb, "image", top_k=self.top_k))

    def encode_query_images(self, images: Sequence[Any], image_encoder: Any) -> sp.csr_matrix:
        """Codes of query images, as :meth:`encode_items` codes an item: the collection's
        image encoder's unit embedding, then the SR image side."""
        encoder = as_image_encoder(image_encoder, QUERY_IMAGE_HINT)
        return self.encode_embeddings(np.asarray(encoder.encode_image(images), np.float32))

    def query_coder(self, text_encoder: Any = None) -> QueryCoder:
        return sr_query_coder(self.model, top_k=self.top_k, text_encoder=text_encoder)

    def dim_names(self) -> list[str] | None:
        return None


class ConceptCodeModel:
    """The photo concept model: version 2 codes photos from their evidence (whole-image
    class probabilities and faces) and serves the match scorer; version 1 (models saved
    before) codes the collection's pooled embeddings and keeps the hard filter."""

    kind = "imagenet_concepts"
    served_by_index = True

    def __init__(self, path: str | Path, top_k: int | None = None) -> None:
        from sparsemm.models.concepts import ImageNetConceptModel

        self.model = ImageNetConceptModel.from_pretrained(path)
        self.top_k = int(top_k or self.model.config.item_top_k)
        self.training_info = self.model.training_info
        self.detectors: ConceptDetectors | None = None
        self.version = int(self.model.config.version)
        self.unit_codes = self.version == 1
        # version 1 has no term probabilities: the hard filter kept an excluded class out
        # (benchmarks/own_photos.py, 13/16 hand-checked queries against 11/16 for hybrid)
        self.default_strategy = "match" if self.version >= 2 else "filter"
        self._reader: Any = None
        self._scorer: Any = None

    def encode_items(self, collection: Collection, progress: bool = False) -> sp.csr_matrix:
        from sparsemm.models.concept_evidence import photo_evidence, pooled_features

        if self.version >= 2:
            evidence = photo_evidence(collection, self._evidence_reader(), progress=progress)
            return self.model.codes_from_evidence(evidence, self.top_k)
        return self.model.encode_pooled(pooled_features(collection, progress=progress), self.top_k)

    def read_ahead(
        self, collection_root: Path, items: Sequence[dict[str, Any]], progress: bool = False
    ) -> None:
        """Read and record the evidence of photos about to join the collection at
        ``collection_root`` (version 2; version 1 codes the collection's embeddings), so
        coding them once they are in reads no photo."""
        if self.version >= 2:
            from sparsemm.models.concept_evidence import read_ahead

            read_ahead(collection_root, items, self._evidence_reader(), progress=progress)

    def _evidence_reader(self) -> Any:
        from sparsemm.models.concept_evidence import EvidenceReader

        if self._reader is None:
            self._reader = EvidenceReader(self.model)
        return self._reader

    def encode_query_images(self, images: Sequence[Any], image_encoder: Any) -> sp.csr_matrix:
        """Codes of query images, as the collection's items are coded: their evidence
        (version 2), or the backbone's un-normalised pooled features through the classifier
        head (version 1)."""
        image_encoder = as_image_encoder(image_encoder, QUERY_IMAGE_HINT)
        if self.version >= 2:
            from sparsemm.models.concept_evidence import EvidenceReader

            if self._reader is None:
                self._reader = EvidenceReader(self.model, backbone=image_encoder)
            return self.model.codes_from_evidence(self._reader.read(list(images)), self.top_k)
        raw = image_encoder.encode_image(list(images), normalize=False)
        return self.model.encode_pooled(np.asarray(raw, dtype=np.float32), self.top_k)

    def query_coder(self, text_encoder: Any = None) -> QueryCoder:
        n_dims = self.model.n_dims

        def code(emb: np.ndarray, texts: Any) -> sp.csr_matrix:
            if text_encoder is not None:
                emb = text_encoder.encode_text(list(texts))
            out = sp.csr_matrix(self.model.encode_text(emb))
            if out.shape[1] < n_dims:  # the face unit has no class text
                out = sp.csr_matrix(
                    (out.data, out.indices, out.indptr), shape=(out.shape[0], n_dims)
                )
            return out

        return code

    def dim_names(self) -> list[str] | None:
        return list(self.model.dim_names)

    def term_scorer(self, text_encoder: Any = None) -> Any:
        """The photo model's term probabilities (version 2); refusals name the classes
        closest in meaning through ``text_encoder`` when given."""
        if self.version < 2:
            return None
        if self._scorer is None or (text_encoder is not None and self._scorer[0] is None):
            from sparsemm.query.scorers import UnitScorer

            similar = None
            if text_encoder is not None:
                model = self.model

                def similar(term: str, k: int) -> list[str]:
                    emb = text_encoder.encode_text([term_text(term)])
                    return model.similar_names(emb[0], k)

            self._scorer = (text_encoder, UnitScorer(self.model, self.model.vocabulary(similar)))
        return self._scorer[1]


class ClipCodeModel:
    """A CLIP or SigLIP collection's concept model
    (:class:`~sparsemm.models.clip_concepts.ClipConceptModel`): SpLiCE codes, zero-shot
    term probabilities over the collection's image embeddings."""

    kind = "clip_concepts"
    default_strategy = "match"
    unit_codes = False  # SpLiCE weights: the scorer recomposes images from them
    served_by_index = False  # zero-shot reads the dense embeddings: ranked in memory

    def __init__(self, path: str | Path, top_k: int | None = None) -> None:
        from sparsemm.models.clip_concepts import ClipConceptModel

        self.model = ClipConceptModel.from_pretrained(path)
        self.top_k = int(top_k or self.model.config.item_top_k)
        self.training_info = self.model.training_info
        self.detectors: ConceptDetectors | None = None
        self._scorer: Any = None

    def encode_items(self, collection: Collection, progress: bool = False) -> sp.csr_matrix:
        return self.model.encode_images(collection.image_embeddings())

    def encode_query_images(self, images: Sequence[Any], image_encoder: Any) -> sp.csr_matrix:
        encoder = as_image_encoder(image_encoder, QUERY_IMAGE_HINT)
        return self.model.encode_images(np.asarray(encoder.encode_image(list(images))))

    def query_coder(self, text_encoder: Any = None) -> QueryCoder:
        dec = self.model.decomposer()

        def code(emb: np.ndarray, texts: Any) -> sp.csr_matrix:
            if text_encoder is not None:
                emb = text_encoder.encode_text(list(texts))
            return sp.csr_matrix(dec.transform(np.asarray(emb, dtype=np.float32), "text"))

        return code

    def dim_names(self) -> list[str] | None:
        return list(self.model.names)

    def term_scorer(self, text_encoder: Any = None) -> Any:
        from sparsemm.query.scorers import ZeroShotScorer

        if self._scorer is None:
            self._scorer = ZeroShotScorer(self.model, self.model.vocabulary())
        return self._scorer


# Entry points of this group add adapters from other packages: ``model_type = "module:Class"``
# (sparsemm_experiments adds ``vdr``). A type named in MODEL_TYPES is never looked up there.
MODEL_GROUP = "sparsemm.models"

MODEL_TYPES: dict[str, Any] = {
    "sr": SRCodeModel,
    "imagenet_concepts": ConceptCodeModel,
    "clip_concepts": ClipCodeModel,
}


class SettingsChanged(SparsemmError):
    """The model's config.json is not the one an index was built with (checksums differ)."""


def load_code_model(
    path: str | Path,
    top_k: int | None = None,
    *,
    collection: tuple[Mapping[str, Any], str | Path] | None = None,
    config_sha256: str | None = None,
) -> CodeModel:
    """Load a saved sparse model folder as a :class:`CodeModel` (by its ``model_type``).

    With ``collection`` (a collection's manifest, and its folder as the user named it),
    refuse a model trained on other encoders than the collection's
    (:func:`~sparsemm.models.base.check_encoders`); with ``config_sha256`` (what an index
    recorded), raise :class:`SettingsChanged` when the folder's settings were edited since."""
    model = _load(path, top_k)
    if config_sha256 is not None and config_sha256 != config_digest(path):
        raise SettingsChanged(
            f"the settings in {path}/config.json changed since the index was built; restore "
            f"them, or rebuild the index with `sparsemm index COLLECTION --model {path}`"
        )
    if collection is not None:
        check_encoders(model.training_info, collection[0], path, collection[1])
    return model


def _load(path: str | Path, top_k: int | None) -> CodeModel:
    """:func:`load_code_model` without its checks against a collection or an index."""
    cfg = Path(path) / "config.json"
    if not Path(path).exists():
        raise SparsemmError(f"model folder not found: {path}; check the path")
    if not cfg.is_file():
        raise SparsemmError(
            f"{path} is not a saved model (no config.json); train one with `sparsemm train`"
        )
    raw = read_json(cfg)
    if not isinstance(raw, dict):
        raise SparsemmError(
            f"{cfg} is malformed (a JSON object was expected, got {type(raw).__name__}); "
            "re-create the model"
        )
    kind = raw.get("model_type")
    types = MODEL_TYPES if kind in MODEL_TYPES else model_types()
    if kind not in types:
        raise SparsemmError(
            f"{path} holds a {kind!r} model; the index serves {', '.join(sorted(types))} models"
        )
    return types[str(kind)](path, top_k)


def model_types() -> dict[str, Any]:
    """MODEL_TYPES and the adapters of the ``sparsemm.models`` entry points, by model type
    (MODEL_TYPES first; one entry point per name; one that cannot be imported is skipped)."""
    from importlib.metadata import entry_points

    found = dict(MODEL_TYPES)
    for ep in sorted(entry_points(group=MODEL_GROUP), key=lambda e: e.name):
        if ep.name in found:
            continue
        try:
            found[ep.name] = ep.load()
        except ImportError as exc:  # a plugin whose dependencies are not installed
            log.debug("skipping the %s entry point %r: %s", MODEL_GROUP, ep.name, exc)
    return found
