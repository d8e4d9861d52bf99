"""The concept model of a CLIP-like encoder: SpLiCE codes, zero-shot term probabilities.

For users with CLIP or SigLIP weights (``sparsemm up PHOTOS --encoder clip``): no training,
no captions.

- **Items** are coded by SpLiCE (:mod:`sparsemm.baselines.splice`; Bhalla et al., NeurIPS
  2024) over a named vocabulary: the ImageNet-1k class names, the 80 COCO objects and any
  SpLiCE vocabulary file (``--vocabulary``: one concept a line, e.g. SpLiCE's LAION
  concepts), each concept embedded with the encoder's own text tower as "a photo of a
  {concept}". A dimension is a concept, placed in WordNet (the hierarchy the other models
  share).
- **A query term's probability** is zero-shot: P(t | x) = sigmoid(scale cos(x, text(t)) +
  bias), the maximum over the term and the vocabulary concepts below it in the hierarchy
  ("vehicle": the word, car, bus, ...). SigLIP was trained for exactly that score and gives
  (scale, bias) itself. CLIP's softmax temperature says nothing about one pair, so its
  (scale, bias) are fitted when the model is built, on the collection itself, with SpLiCE's
  codes as the targets: a concept in an image's code counts as present, the others as
  absent (:func:`fit_temperature`).

Files: ``config.json`` (concepts, encoder, settings) and ``model.safetensors`` (the concept
embeddings and SpLiCE's dictionary and means).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.models.base import PretrainedMixin
from sparsemm.text import TERM_TEMPLATE

log = logging.getLogger(__name__)

MODEL_TYPE = "clip_concepts"
# the 80 COCO object categories (Lin et al., 2014)
COCO_OBJECTS = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat",
    "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack",
    "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball",
    "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket",
    "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair",
    "couch", "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse",
    "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier",
    "toothbrush",
)  # fmt: skip


@dataclass(frozen=True)
class ClipConceptConfig:
    """Settings of a :class:`ClipConceptModel`."""

    concepts: tuple[str, ...] = ()  # the vocabulary, one code dimension each
    dim: int = 512  # embedding dimension of the encoder
    encoder: str = "clip"  # registered name of the image/text encoder
    encoder_model: str = ""  # its hub name or folder
    template: str = TERM_TEMPLATE  # how a concept or a term is embedded
    l1_penalty: float = 0.25  # SpLiCE's lambda (sparser codes with more)
    item_top_k: int = 32  # at most this many concepts per item code
    scale: float = 100.0  # P(t | x) = sigmoid(scale * cos + bias)
    bias: float = -25.0
    calibration: str = "fitted"  # "fitted" (on the collection) | "model" (SigLIP's own)
    max_expansion: int = 64  # concepts below a term that its probability also reads
    image_scale: float = 1.0  # SpLiCE: mean norm of the centred image embeddings
    text_scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "concepts", tuple(str(c) for c in self.concepts))
        if not self.concepts:
            raise ValueError("a CLIP concept model needs at least one concept")
        if self.dim < 1 or self.item_top_k < 1 or self.l1_penalty <= 0:
            raise ValueError("dim, item_top_k and l1_penalty must be positive")
        if "{}" not in self.template:
            raise ValueError("template must contain '{}'")
        if not (np.isfinite(self.scale) and np.isfinite(self.bias)) or self.scale <= 0:
            raise ValueError("scale must be positive and finite, bias finite")


class ClipConceptModel(PretrainedMixin, nn.Module):
    """SpLiCE codes over a concept vocabulary + zero-shot term probabilities.

    Buffers: ``concept_emb`` (V, D) unit text embeddings of the concepts, ``dictionary``
    (V, D) SpLiCE's centred atoms, ``concept_mean``, ``image_mean``, ``text_mean`` (D,).
    """

    config_class = ClipConceptConfig
    model_type = MODEL_TYPE
    concept_emb: torch.Tensor
    dictionary: torch.Tensor
    concept_mean: torch.Tensor
    image_mean: torch.Tensor
    text_mean: torch.Tensor

    def __init__(self, config: ClipConceptConfig) -> None:
        super().__init__()
        self.config = config
        v, d = len(config.concepts), config.dim
        self.register_buffer("concept_emb", torch.zeros(v, d))
        self.register_buffer("dictionary", torch.zeros(v, d))
        self.register_buffer("concept_mean", torch.zeros(d))
        self.register_buffer("image_mean", torch.zeros(d))
        self.register_buffer("text_mean", torch.zeros(d))

    @property
    def names(self) -> list[str]:
        return list(self.config.concepts)

    # -- building --------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        concepts: Sequence[str],
        encoder: Any,
        image_embeddings: np.ndarray,
        progress: bool = False,
        **config: Any,
    ) -> ClipConceptModel:
        """Embed the concepts with ``encoder``'s text tower, fit SpLiCE's means on the
        collection's ``image_embeddings`` and the zero-shot (scale, bias): the encoder's own
        for a sigmoid-trained model, else :func:`fit_temperature` on the collection."""
        from sparsemm.baselines.splice import SpliceDecomposer

        names = list(dict.fromkeys(str(c).strip() for c in concepts if str(c).strip()))
        if not names:
            raise SparsemmError("the concept vocabulary is empty")
        img = np.asarray(image_embeddings, dtype=np.float32)
        if img.ndim != 2 or not len(img) or img.shape[1] != int(encoder.dim):
            raise SparsemmError(
                f"need (n, {encoder.dim}) image embeddings from {encoder.name}, got {img.shape}"
            )
        template = str(config.pop("template", TERM_TEMPLATE))
        emb = encoder.encode_text([template.format(c) for c in names], progress=progress)
        emb = normalize_rows(np.asarray(emb, dtype=np.float32))
        dec = SpliceDecomposer(names, l1_penalty=float(config.get("l1_penalty", 0.25)))
        dec.fit(img, emb)
        own = encoder.pair_logit() if hasattr(encoder, "pair_logit") else None
        cfg = ClipConceptConfig(
            concepts=tuple(names),
            dim=int(encoder.dim),
            encoder=str(encoder.name),
            encoder_model=str(getattr(encoder, "model_id", "")),
            template=template,
            image_scale=float(dec.image_scale_),
            text_scale=float(dec.text_scale_),
            calibration="model" if own is not None else "fitted",
            **config,
        )
        model = cls(cfg)
        with torch.no_grad():
            model.concept_emb.copy_(torch.from_numpy(emb))
            model.dictionary.copy_(torch.from_numpy(np.asarray(dec.dictionary_, np.float32)))
            model.concept_mean.copy_(torch.from_numpy(np.asarray(dec.concept_mean_, np.float32)))
            model.image_mean.copy_(torch.from_numpy(np.asarray(dec.image_mean_, np.float32)))
            model.text_mean.copy_(torch.from_numpy(np.asarray(dec.text_mean_, np.float32)))
        if own is not None:
            scale, bias = own
        else:
            codes = model.encode_images(img)
            own_scale = getattr(getattr(encoder, "model_", None), "logit_scale", None)
            fallback = float(own_scale.detach().exp()) if own_scale is not None else 100.0
            scale, bias = fit_temperature(normalize_rows(img) @ emb.T, codes, fallback)
        import dataclasses

        model.config = dataclasses.replace(model.config, scale=float(scale), bias=float(bias))
        from sparsemm.data.encode import encoder_info

        info = encoder_info(encoder)
        model.training_info = {"image_encoder": info, "text_encoder": info}
        return model.eval()

    # -- items -------------------------------------------------------------------------------
    def decomposer(self) -> Any:
        """The SpLiCE decomposer these buffers describe."""
        from sparsemm.baselines.splice import SpliceDecomposer

        dec = SpliceDecomposer(self.names, l1_penalty=self.config.l1_penalty)
        dec.dictionary_ = self.dictionary.numpy()
        dec.concept_mean_ = self.concept_mean.numpy()
        dec.image_mean_ = self.image_mean.numpy()
        dec.text_mean_ = self.text_mean.numpy()
        dec.image_scale_ = self.config.image_scale
        dec.text_scale_ = self.config.text_scale
        return dec

    def encode_images(self, image_embeddings: np.ndarray) -> sp.csr_matrix:
        """SpLiCE codes (n, V) of image embeddings, each cut to its ``item_top_k`` largest
        weights (the top one always kept)."""
        codes = sp.csr_matrix(self.decomposer().transform(image_embeddings, "image"))
        return _top_k(codes, self.config.item_top_k)

    # -- zero-shot -----------------------------------------------------------------------------
    def probability(self, cosines: np.ndarray) -> np.ndarray:
        """P(present) of image-text cosines."""
        z = self.config.scale * np.asarray(cosines, dtype=np.float64) + self.config.bias
        return np.exp(-np.logaddexp(0.0, -z))

    def vocabulary(self, similar: Any = None) -> Any:
        """The concepts placed in WordNet (:func:`~sparsemm.concepts.vocabulary.unit_synset`)."""
        from sparsemm.concepts.vocabulary import ConceptVocabulary, unit_synset
        from sparsemm.concepts.wordnet import wordnet

        wn = wordnet()
        return ConceptVocabulary(
            self.names, [unit_synset(c, wn) for c in self.names], similar=similar, wn=wn
        )


def fit_temperature(
    cosines: np.ndarray, codes: sp.csr_matrix, fallback_scale: float = 100.0
) -> tuple[float, float]:
    """(scale, bias) of P(present) = sigmoid(scale cos + bias), fitted by logistic
    regression of "the concept is in the image's SpLiCE code" on the zero-shot cosine over
    every (image, concept) pair of ``cosines`` (n, V) (the absent pairs subsampled, then
    the bias corrected back to their share). When the cosine says nothing about the codes
    (a fitted scale <= 0: too few images, or an untrained model) the scale is
    ``fallback_scale`` (CLIP's own logit scale) and only the bias is fitted, to the share
    of present pairs."""
    from sparsemm.models.detectors import fit_logistic

    y = np.asarray(sp.csr_matrix(codes).toarray() > 0, dtype=np.float64).ravel()
    x = np.asarray(cosines, dtype=np.float64).ravel()
    if y.sum() == 0 or y.sum() == len(y):
        raise SparsemmError("cannot fit the zero-shot temperature: the codes are empty or full")
    # balance by subsampling the absent pairs (deterministic)
    pos = np.flatnonzero(y > 0)
    neg = np.flatnonzero(y == 0)
    rng = np.random.default_rng(0)
    neg = rng.choice(neg, size=min(len(neg), 20 * len(pos)), replace=False)
    idx = np.concatenate([pos, neg])
    (a,), b = fit_logistic(x[idx, None], y[idx])
    # undo the subsampling of the absent pairs: prior odds back to the full set
    b += float(np.log(len(neg) / max(1, int((y == 0).sum()))))
    if not (np.isfinite(a) and a > 0 and np.isfinite(b)):
        log.warning(
            "the zero-shot cosines do not follow the concept codes; keeping the scale %.0f "
            "and fitting the bias to the share of present concepts",
            fallback_scale,
        )
        share = float(y.mean())
        a = fallback_scale
        b = float(np.log(share / (1.0 - share)) - a * x.mean())
    return float(a), float(b)


def _top_k(codes: sp.csr_matrix, k: int) -> sp.csr_matrix:
    rows, cols, vals = [], [], []
    for i in range(codes.shape[0]):
        lo, hi = codes.indptr[i], codes.indptr[i + 1]
        idx, val = codes.indices[lo:hi], codes.data[lo:hi]
        keep = np.argsort(-val, kind="stable")[:k]
        rows += [i] * len(keep)
        cols += idx[keep].tolist()
        vals += val[keep].tolist()
    return sp.csr_matrix((np.asarray(vals, np.float32), (rows, cols)), shape=codes.shape)
