"""A caption-free concept model: ImageNet-1k classes as named sparse dimensions.

No CLIP-like image-text model is available offline, but the image backbone the project
runs, EfficientNet-Lite0, ends in an ImageNet-1k classifier. Its 1000 classes are a ready
concept space whose dimensions have names:

- an **item's code** is the classifier's softmax over the 1000 classes, cut to its top
  ``item_top_k`` probabilities (and those >= ``min_prob``): non-negative, sparse, and read
  as "tabby 0.61, tiger cat 0.22, Egyptian cat 0.09";
- a **query's code** maps a text onto classes through the text encoder (all-MiniLM-L6-v2
  offline): each class is described by its WordNet synonyms ("tabby, tabby cat") and a
  one-sentence gloss; the query embedding's cosine with a class is
  ``(1 - w) * max_s cos(q, syn_s) + w * cos(q, gloss)`` (w = ``description_weight``). Classes
  within ``query_margin`` of the best one and above ``min_query_sim`` are kept (at most
  ``query_top_k``), weighted ``exp((sim - best) / query_temperature)``. A term below
  ``min_query_sim`` for every class maps to nothing: the model says it does not know it.

Version 2 (what ``sparsemm up`` builds: :mod:`sparsemm.models.imagenet_concepts`) codes
photos from their *evidence* instead: the classifier over the whole image and the faces an
MTCNN detector finds (``face_unit``, the "person (face)" dimension), read once per photo
(:class:`~sparsemm.models.concept_evidence.EvidenceReader`, stored in
``COLLECTION/concepts/evidence.json``), with calibrated presence probabilities; query terms
are read through the WordNet hierarchy (:mod:`sparsemm.concepts`) and scored by
:class:`sparsemm.query.scorers.UnitScorer`. What it still cannot know: a person without a
visible face (beyond ImageNet's few person classes: scuba diver, groom, ballplayer), men
from women, scenes with no object that implies them, colours and counts; see
docs/own-photos.md.

Version 1 items are coded from the collection's EfficientNet-Lite0 embeddings. Those are stored
L2-normalised, while the classifier reads the un-normalised pooled features, so the
pooled norm of every image is kept in ``COLLECTION/concepts/norms.json`` (keyed by image
path, size and mtime; computed once by re-running the backbone, or recorded by
``sparsemm up`` while it encodes): logits = ``W (norm * x) + b`` are then exact.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.models.base import ArrayModule, PretrainedMixin, check_field_types
from sparsemm.text import TERM_TEMPLATE  # the query side embeds terms with the same template

if TYPE_CHECKING:
    from sparsemm.models.concept_evidence import PhotoEvidence

log = logging.getLogger(__name__)

MODEL_TYPE = "imagenet_concepts"
FACE_UNIT_NAME = "person (face)"
IMPLIED_FILE = "imagenet_implied.json"  # in sparsemm/concepts/data
# ImageNet classes filed under a WordNet sense other than what the class shows: class 968
# "cup" is n07930864, a mixed drink, while its photos are cups (placed at cup.n.01).
CLASS_SENSES = {"n07930864": "n03147509"}


@dataclass(frozen=True)
class ConceptConfig:
    """Settings of an :class:`ImageNetConceptModel` (defaults: the ImageNet-1k head)."""

    # "tabby, tabby cat": the comma-separated synonyms of each class, in label order; the
    # first one names the dimension
    class_synonyms: tuple[str, ...] = ()
    n_features: int = 1280  # pooled backbone features the classifier reads
    text_dim: int = 384  # query-text embedding size (all-MiniLM-L6-v2)
    item_top_k: int = 10  # active classes per item: the head's mass sits in a few classes
    min_prob: float = 0.01  # classes below this probability are noise, not concepts
    query_top_k: int = 64  # a generic word ("dog") spans many fine classes (120 breeds)
    query_margin: float = 0.15  # keep classes this close (cosine) to the best match
    min_query_sim: float = 0.5  # below this for every class, the term names no class
    query_temperature: float = 0.1  # weight exp((sim - best) / T): near-ties share
    description_weight: float = 0.5  # share of the gloss in a class's similarity
    template: str = TERM_TEMPLATE  # how synonyms were embedded ("a photo of a tabby")
    # -- version 2: photo evidence (whole-image class probabilities and faces) -------------
    version: int = 1  # 1: codes from the collection's pooled embeddings; 2: photo evidence
    class_wnids: tuple[str, ...] = ()  # WordNet id per class: grounds it in the hierarchy
    face_unit: bool = False  # one more dimension, "person (face)", from the face detector
    image_size: int = 224  # shorter side of the whole-image view the classifier reads
    # P(concept present) = sigmoid(presence_scale * logit(evidence) + presence_bias), the
    # evidence being the concept's summed class probability: a softmax splits one photo's
    # mass between its objects, so a visible cup behind the coffee gets little of it
    presence_scale: float = 1.0
    presence_bias: float = 0.0
    # P(person | best face probability s) = sigmoid(face_slope * (logit(s) - logit(face_center)))
    face_center: float = 0.95
    face_slope: float = 2.0
    # -- regions: the classifier also reads square tiles of the photo, so a second, small or
    # off-centre object (the guitar beside the drum, the car down the street) gets evidence
    # of its own; each class keeps its largest probability over the tiles, in a second
    # block of dimensions after the face unit
    regions: bool = False
    tile_fraction: float = 0.6  # a tile's side as a share of the photo's shorter side
    # tiles along the longer side (two along the shorter one); 0: no tiles of this size,
    # only the finer grid below (which must then be set)
    max_tiles: int = 3
    # a second, finer grid of tiles (0: none): its side as a share of the shorter side, at
    # most ``small_max_tiles`` along each side; a thing that fills a tenth of the photo (the
    # table under the cup, the plant behind the bird) fills a good part of one of them
    small_tile_fraction: float = 0.0
    small_max_tiles: int = 4
    region_top_k: int = 0  # classes kept over the tiles (0: item_top_k, as over the photo)
    # a concept's evidence is max(whole-image evidence, region_weight * region evidence):
    # one tile seeing a thing is weaker evidence than the whole photo seeing it
    region_weight: float = 1.0
    # a term to leave out is judged from any region that shows it, with its own presence
    # calibration (both fitted on labelled photos; docs/own-photos.md)
    exclude_region_weight: float = 1.0
    exclude_presence_scale: float = 1.0
    exclude_presence_bias: float = 0.0
    # a word read as a broader thing ("a woman" as a person): P(word) = share * P(broader),
    # the share of photos of the broader thing that show the word's (fitted on labelled
    # photos): the model cannot tell a woman from a man, so it says how likely she is
    broader_share: float = 1.0

    def __post_init__(self) -> None:
        check_field_types(self)  # "face_unit": "yes" is refused here, not at its first use
        # config.json stores a list; the frozen config keeps a tuple either way
        object.__setattr__(self, "class_synonyms", tuple(str(s) for s in self.class_synonyms))
        if not self.class_synonyms:
            raise ValueError("class_synonyms must name at least one class")
        if self.item_top_k < 1 or self.query_top_k < 1 or self.region_top_k < 0:
            raise ValueError("item_top_k, query_top_k >= 1 and region_top_k >= 0 required")
        if not 0.0 <= self.description_weight <= 1.0:
            raise ValueError("description_weight must be in [0, 1]")
        if self.query_temperature <= 0.0:
            raise ValueError("query_temperature must be positive")
        if "{}" not in self.template:
            raise ValueError("template must contain '{}'")
        object.__setattr__(self, "class_wnids", tuple(str(w) for w in self.class_wnids))
        if self.version not in (1, 2):
            raise ValueError(f"unknown concept model version {self.version}")
        if self.class_wnids and len(self.class_wnids) != len(self.class_synonyms):
            raise ValueError("class_wnids must name one WordNet id per class")
        if not (0.0 < self.face_center < 1.0 and self.face_slope > 0 and self.presence_scale > 0):
            raise ValueError("face_center in (0, 1), face_slope > 0 and presence_scale > 0")
        if self.image_size < 32:
            raise ValueError("image_size must be at least 32")
        for name, kind in (
            ("face_unit", bool),
            ("regions", bool),
            ("max_tiles", int),
            ("small_max_tiles", int),
            ("region_top_k", int),
        ):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name} must be a {kind.__name__}")
        if not 0.2 <= self.tile_fraction <= 1.0 or self.max_tiles < 0:
            raise ValueError("tile_fraction in [0.2, 1] and max_tiles >= 0 required")
        if self.max_tiles == 0 and not self.small_tile_fraction:
            raise ValueError("max_tiles = 0 (no coarse tiles) needs a small_tile_fraction")
        if self.small_tile_fraction and not (
            0.2 <= self.small_tile_fraction < self.tile_fraction and self.small_max_tiles >= 1
        ):
            raise ValueError(
                "small_tile_fraction is 0 or in [0.2, tile_fraction), with small_max_tiles >= 1"
            )
        if not (0.0 <= self.region_weight <= 1.0 and 0.0 <= self.exclude_region_weight <= 1.0):
            raise ValueError("region_weight and exclude_region_weight must be in [0, 1]")
        if not 0.0 < self.broader_share <= 1.0:
            raise ValueError("broader_share must be in (0, 1]")
        if self.exclude_presence_scale <= 0:
            raise ValueError("exclude_presence_scale must be positive")


def split_synonyms(entry: str) -> list[str]:
    """ "tabby, tabby cat" -> ["tabby", "tabby cat"] (empty parts dropped)."""
    return [s.strip() for s in str(entry).split(",") if s.strip()]


# What tells apart two ImageNet classes that share their only name, by WordNet id (the
# synsets' own hypernyms): a reader sees "crane (bird)", never "crane (class 134)".
SENSE_HINTS = {
    "n02012849": "bird",  # crane
    "n03126707": "machine",  # crane
    "n03710637": "tights",  # maillot (the other is "maillot, tank suit")
}


def dimension_names(class_synonyms: Sequence[str], class_wnids: Sequence[str] = ()) -> list[str]:
    """One unique readable name per class: its first synonym, with the second one added in
    parentheses when two classes share the first (ImageNet has two 'crane's), or when a class
    has no second one, the hint :data:`SENSE_HINTS` holds for its WordNet id."""
    firsts = [
        split_synonyms(s)[0] if split_synonyms(s) else f"class {i}"
        for i, s in enumerate(class_synonyms)
    ]
    seen: dict[str, int] = {}
    for f in firsts:
        seen[f] = seen.get(f, 0) + 1
    names = []
    for i, (entry, first) in enumerate(zip(class_synonyms, firsts, strict=True)):
        if seen[first] > 1:
            rest = split_synonyms(entry)[1:]
            hint = SENSE_HINTS.get(class_wnids[i]) if i < len(class_wnids) else None
            first = f"{first} ({rest[0] if rest else hint or f'class {i}'})"
        names.append(first)
    return names


class ImageNetConceptModel(PretrainedMixin, ArrayModule):
    """Classifier head + class text table: items and queries coded over the classes.

    Arrays: ``fc_weight`` (C, F), ``fc_bias`` (C,), ``synonym_emb`` (S, D) unit rows (one
    per synonym, in class order), ``description_emb`` (C, D) unit rows (zero without glosses).
    Nothing is trained, so the model is numpy throughout: loading and coding queries never
    import torch (reading photos does, through the backbone).
    """

    config_class = ConceptConfig
    model_type = MODEL_TYPE
    fc_weight: np.ndarray
    fc_bias: np.ndarray
    synonym_emb: np.ndarray
    description_emb: np.ndarray

    def __init__(self, config: ConceptConfig) -> None:
        super().__init__()
        self.config = config
        self.synonyms = [split_synonyms(s) for s in config.class_synonyms]
        if any(not s for s in self.synonyms):
            raise ValueError("every class needs at least one synonym")
        n_classes = len(config.class_synonyms)
        n_syn = sum(len(s) for s in self.synonyms)
        self.declare("fc_weight", n_classes, config.n_features)
        self.declare("fc_bias", n_classes)
        self.declare("synonym_emb", n_syn, config.text_dim)
        self.declare("description_emb", n_classes, config.text_dim)
        # synonym row -> class, for the max over a class's synonyms
        self.synonym_class = np.repeat(
            np.arange(n_classes), [len(s) for s in self.synonyms]
        ).astype(np.int64)
        self.names = dimension_names(config.class_synonyms, config.class_wnids)

    @property
    def n_classes(self) -> int:
        return len(self.config.class_synonyms)

    @property
    def region_offset(self) -> int | None:
        """First dimension of the region block (class c's region evidence is dimension
        ``region_offset + c``), or None when the model reads no regions."""
        return self.n_classes + int(self.config.face_unit) if self.config.regions else None

    @property
    def max_tile_count(self) -> int:
        """The most tiles the model reads in one photo (0 without regions)."""
        cfg = self.config
        if not cfg.regions:
            return 0
        small = cfg.small_max_tiles**2 if cfg.small_tile_fraction else 0
        return 2 * cfg.max_tiles + small

    @property
    def n_dims(self) -> int:
        """Code dimensions: the classes, the face unit, then the classes again as seen in
        the photo's regions (version 2)."""
        return self.n_classes * (1 + int(self.config.regions)) + int(self.config.face_unit)

    @property
    def dim_names(self) -> list[str]:
        names = self.names + ([FACE_UNIT_NAME] if self.config.face_unit else [])
        if self.config.regions:
            names += [f"{n} (in part of the photo)" for n in self.names]
        return names

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        class_synonyms: Sequence[str],
        fc_weight: np.ndarray,
        fc_bias: np.ndarray,
        text_encoder: Any,
        descriptions: Sequence[str] | None = None,
        progress: bool = False,
        **config: Any,
    ) -> ImageNetConceptModel:
        """A model from a classifier head (C, F) + (C,) and the class texts, embedding the
        synonyms (with the template) and glosses with ``text_encoder`` (``encode_text``)."""
        w = np.asarray(fc_weight, dtype=np.float32)
        b = np.asarray(fc_bias, dtype=np.float32)
        if w.ndim != 2 or b.shape != (w.shape[0],) or w.shape[0] != len(class_synonyms):
            raise SparsemmError(
                f"classifier head shapes {w.shape} / {b.shape} do not match "
                f"{len(class_synonyms)} classes"
            )
        if descriptions is not None and len(descriptions) != len(class_synonyms):
            raise SparsemmError("give one description per class (or none)")
        if descriptions is None:
            config["description_weight"] = 0.0
        cfg = ConceptConfig(
            class_synonyms=tuple(str(s) for s in class_synonyms),
            n_features=int(w.shape[1]),
            text_dim=int(text_encoder.dim),
            **config,
        )
        model = cls(cfg)
        synonyms = [cfg.template.format(s) for syn in model.synonyms for s in syn]
        log.info("embedding %d class synonyms with %s", len(synonyms), text_encoder.name)
        syn_emb = text_encoder.encode_text(synonyms, normalize=True, progress=progress)
        desc_emb = np.zeros((len(class_synonyms), cfg.text_dim), dtype=np.float32)
        if descriptions is not None:
            log.info("embedding %d class descriptions", len(descriptions))
            desc_emb = text_encoder.encode_text(
                list(descriptions), normalize=True, progress=progress
            )
        model.load_state_dict(
            {
                "fc_weight": w,
                "fc_bias": b,
                "synonym_emb": np.asarray(syn_emb, dtype=np.float32),
                "description_emb": np.asarray(desc_emb, dtype=np.float32),
            }
        )
        from sparsemm.data.encode import encoder_info

        model.training_info = {"text_encoder": encoder_info(text_encoder)}
        return model.eval()

    # -- items ------------------------------------------------------------------------------
    def class_probabilities(self, pooled: np.ndarray) -> np.ndarray:
        """Un-normalised pooled features (n, F) -> softmax class probabilities (n, C)."""
        x = np.ascontiguousarray(pooled, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.config.n_features:
            raise SparsemmError(
                f"expected pooled features (n, {self.config.n_features}), got {tuple(x.shape)}"
            )
        logits = x @ self.fc_weight.T + self.fc_bias
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)

    def encode_pooled(self, pooled: np.ndarray, top_k: int | None = None) -> sp.csr_matrix:
        """Item codes (n, C): each row's top-k probabilities >= ``min_prob`` (the top one
        is always kept, so no item has an empty code)."""
        return top_k_rows(
            self.class_probabilities(pooled),
            int(top_k or self.config.item_top_k),
            self.config.min_prob,
        )

    # -- queries ----------------------------------------------------------------------------
    def class_similarity(self, text_emb: np.ndarray) -> np.ndarray:
        """Unit query embeddings (n, D) -> similarity with each class (n, C)."""
        q = np.asarray(text_emb, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.config.text_dim:
            raise SparsemmError(
                f"expected text embeddings (n, {self.config.text_dim}), got {q.shape}; the "
                "query text encoder must be the one the model was built with"
            )
        syn = q @ self.synonym_emb.T  # (n, S)
        best_syn = np.full((len(q), self.n_classes), -np.inf, dtype=np.float32)
        for i in range(len(q)):
            np.maximum.at(best_syn[i], self.synonym_class, syn[i])
        w = self.config.description_weight
        if w == 0.0:
            return best_syn
        return (1.0 - w) * best_syn + w * (q @ self.description_emb.T)

    def encode_text(self, text_emb: np.ndarray, top_k: int | None = None) -> sp.csr_matrix:
        """Query codes (n, C) from unit text embeddings (see the module docstring); an
        all-zero row means the text names no class."""
        cfg = self.config
        sim = self.class_similarity(text_emb)
        k = min(int(top_k or cfg.query_top_k), self.n_classes)
        rows, cols, vals = [], [], []
        for i, s in enumerate(sim):
            best = float(s.max())
            if not math.isfinite(best) or best < cfg.min_query_sim:
                continue
            floor = max(cfg.min_query_sim, best - cfg.query_margin)
            top = np.argsort(-s, kind="stable")[:k]
            top = top[s[top] >= floor]
            rows += [i] * len(top)
            cols += top.tolist()
            vals += np.exp((s[top] - best) / cfg.query_temperature).tolist()
        return sp.csr_matrix(
            (np.asarray(vals, dtype=np.float32), (rows, cols)), shape=(len(sim), self.n_classes)
        )

    # -- version 2: photo evidence and concepts -------------------------------------------
    def face_presence(self, best: np.ndarray) -> np.ndarray:
        """P(a person is in the photo) from each photo's best face probability (0: none)."""
        cfg = self.config
        s = np.clip(np.asarray(best, dtype=np.float64), 0.0, 1.0 - 1e-9)
        z = cfg.face_slope * (_logit(np.maximum(s, 1e-12)) - _logit(np.asarray(cfg.face_center)))
        return np.where(s > 0.0, 1.0 / (1.0 + np.exp(-z)), 0.0)

    def presence(self, evidence: np.ndarray, excluded: bool = False) -> np.ndarray:
        """P(present) from a concept's summed class probability (0 stays 0); ``excluded``:
        the calibration of a term to leave out (its evidence includes every region)."""
        cfg = self.config
        e = np.clip(np.asarray(evidence, dtype=np.float64), 0.0, 1.0)
        a, b = (
            (cfg.exclude_presence_scale, cfg.exclude_presence_bias)
            if excluded and cfg.regions
            else (cfg.presence_scale, cfg.presence_bias)
        )
        z = a * _logit(np.clip(e, 1e-6, 1.0 - 1e-6)) + b
        return np.where(e > 0.0, 1.0 / (1.0 + np.exp(-z)), 0.0)

    def codes_from_evidence(
        self, evidence: Sequence[PhotoEvidence], top_k: int | None = None
    ) -> sp.csr_matrix:
        """Item codes (n, n_dims) of version 2: each photo's top-k whole-image class
        probabilities >= ``min_prob`` (its best always kept), then the face unit's P(person),
        then (``regions``) the top ``region_top_k`` (else top-k) of each class's largest
        probability over the tiles.
        Values are probabilities, not unit-normalised: the concept scorer reads them."""
        k = max(1, int(top_k or self.config.item_top_k))
        rows, cols, vals = [], [], []
        for i, ev in enumerate(evidence):
            ranked = sorted(ev.classes, key=lambda cp: (-cp[1], cp[0]))[:k]
            for j, (c, p) in enumerate(ranked):
                if (p >= self.config.min_prob or j == 0) and p > 0 and 0 <= c < self.n_classes:
                    rows.append(i)
                    cols.append(int(c))
                    vals.append(float(p))
            if self.config.face_unit and ev.faces:
                pf = float(self.face_presence(np.asarray([max(ev.faces)]))[0])
                if pf >= self.config.min_prob:
                    rows.append(i)
                    cols.append(self.n_classes)
                    vals.append(pf)
            off = self.region_offset
            if off is not None:
                k_r = int(self.config.region_top_k) or k
                ranked = sorted(ev.regions, key=lambda cp: (-cp[1], cp[0]))[:k_r]
                for c, p in ranked:
                    if p >= self.config.min_prob and 0 <= c < self.n_classes:
                        rows.append(i)
                        cols.append(off + int(c))
                        vals.append(float(p))
        return sp.csr_matrix(
            (np.asarray(vals, dtype=np.float32), (rows, cols)), shape=(len(evidence), self.n_dims)
        )

    def vocabulary(self, similar: Any = None) -> Any:
        """The classes (and the face unit) grounded in WordNet, with the implied-scene table
        (:class:`~sparsemm.concepts.vocabulary.ConceptVocabulary`); ``similar`` names the
        classes closest to an unknown term (for refusals)."""
        from sparsemm.concepts.vocabulary import ConceptVocabulary
        from sparsemm.concepts.wordnet import wordnet

        wn = wordnet()
        synsets: list[Any] = [
            wn.by_wnid(CLASS_SENSES.get(w, w)) for w in self.config.class_wnids
        ] or [None] * len(self.names)
        names = list(self.names)
        if self.config.face_unit:
            names.append(FACE_UNIT_NAME)
            synsets.append(tuple(wn.by_wnid(w) for w in ("n00007846", "n05600637")))
        by_wnid = {w: i for i, w in enumerate(self.config.class_wnids)}
        implied: dict[int, list[tuple[int, float]]] = {}
        for entry in implied_table():
            target = wn.by_wnid(entry["wnid"])
            pairs = [(by_wnid[w], float(x)) for w, _, x in entry["classes"] if w in by_wnid]
            if target is not None and pairs:
                implied.setdefault(target, []).extend(pairs)
        return ConceptVocabulary(names, synsets, implied, similar=similar, wn=wn)

    def similar_names(self, text_emb: np.ndarray, k: int = 3) -> list[str]:
        """The ``k`` class names whose texts are closest to one unit query embedding."""
        sim = self.class_similarity(np.asarray(text_emb, dtype=np.float32).reshape(1, -1))[0]
        return [self.names[int(c)] for c in np.argsort(-sim, kind="stable")[:k]]


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return np.log(p) - np.log1p(-p)


@functools.lru_cache(maxsize=1)
def implied_table() -> list[dict[str, Any]]:
    """The packaged implied-scene table (``sparsemm/concepts/data/imagenet_implied.json``):
    per concept (a WordNet id), the ImageNet classes that imply it and a weight each."""
    from importlib import resources

    raw = resources.files("sparsemm.concepts").joinpath("data", IMPLIED_FILE).read_text("utf-8")
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("format") != "sparsemm.implied":
        raise SparsemmError(f"the packaged {IMPLIED_FILE} is damaged; reinstall sparsemm")
    return list(data["implied"])


def top_k_rows(probs: np.ndarray, k: int, min_value: float) -> sp.csr_matrix:
    """Keep each row's k largest values that are >= ``min_value`` (always its largest)."""
    n, c = probs.shape
    k = max(1, min(k, c))
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]  # (n, k)
    vals = np.take_along_axis(probs, top, axis=1)
    keep = vals >= min_value
    keep[:, 0] = True
    rows = np.repeat(np.arange(n), k).reshape(n, k)
    return sp.csr_matrix((vals[keep].astype(np.float32), (rows[keep], top[keep])), shape=(n, c))
