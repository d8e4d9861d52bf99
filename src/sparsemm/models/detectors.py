"""Concept detectors saved with a sparse model: one logistic regression per vocabulary term.

A detector says how likely an item's code carries a term ("dog", "dining table"): it is a
linear function of the item's unit-normalised code, w_t . (scale x / |x|) + b_t, trained
when the model is (``sparsemm train sr``, ``sparsemm train detectors``) on the training
items' captions and labels: the target of item i for term t is "some caption of i mentions
t, or i is labelled t" (:class:`sparsemm.text.CaptionIndex` rules). Captions name only
some of what an image shows, so targets are positive-unlabelled; each term keeps its
Elkan-Noto rate c_t (the mean fitted probability over its positives), and
P(t present | x) = P(mention | x) / c_t.

Query time fits nothing: a term in the vocabulary is looked up by its singular content
tokens (``dogs`` -> ``dog``), a term outside it has no detector and the scorer falls back
to code similarity (:class:`sparsemm.query.strategies.Hybrid`).

Files in the model folder: ``detectors.safetensors`` (``weights`` (d, V) float32, ``bias``
(V,), ``rate`` (V,); when fitted, ``calibration`` (8,): the match scorer's P(term | x) =
sigmoid(a z + g cos + c) for caption words and for labels and its phrase calibration, see
:mod:`sparsemm.query.scorers`, and ``term_codes`` (d, V): the query code of each term the
cos is taken with; ``label_terms`` (V,) uint8: which terms are labels) and
``detectors.json`` (format, version, the terms with their WordNet senses, the training
settings and the SHA-256 of the safetensors file, checked on load together with the shapes
and finiteness, so a damaged or mismatched file is refused by name).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, json_sha256, read_json, sha256_file, write_json
from sparsemm.text import term_tokens

WEIGHTS_FILE = "detectors.safetensors"
log = logging.getLogger(__name__)

META_FILE = "detectors.json"
FORMAT = "sparsemm.detectors"
VERSION = 2  # 2: WordNet senses, label flags and the match calibration (1 still read)
READABLE = (1, 2)
CALIBRATION_SIZE = 8  # a, g, c (caption words), phrase_a, phrase_c, a, g, c (labels)


@dataclass(frozen=True)
class DetectorConfig:
    """How a model's detectors are trained (stored in ``detectors.json``)."""

    min_mentions: int = 10  # a term needs this many positive training items
    max_terms: int = 4000  # the most frequent terms are kept
    bigrams: bool = True  # frequent two-word names too ("hot dog", "dining table")
    l2: float = 1e-3  # L2 penalty of the logistic regressions
    scale: float = 10.0  # unit codes are multiplied by this before the regression
    head_ratio: float = 0.1  # CaptionIndex head-noun back-off of multi-word terms
    max_iter: int = 200  # L-BFGS iterations
    chunk: int = 1024  # terms fitted together (memory: items x chunk targets)
    # targets follow the WordNet hierarchy ("a puppy" is a dog), and hypernyms above the
    # words get detectors of their own ("vehicle"); False: the words' own mentions only
    hierarchy: bool = True

    def __post_init__(self) -> None:
        if self.min_mentions < 1 or self.max_terms < 1 or self.max_iter < 1 or self.chunk < 1:
            raise SparsemmError("detector settings must be positive integers")
        if not (self.l2 >= 0 and self.scale > 0 and 0 <= self.head_ratio <= 1):
            raise SparsemmError("detector l2 >= 0, scale > 0 and head_ratio in [0, 1] required")


def _key(term: str) -> tuple[str, ...]:
    return tuple(term_tokens(term))


class ConceptDetectors:
    """A model's term detectors (see the module docstring). ``weights`` (d, V)."""

    def __init__(
        self,
        terms: list[str],
        weights: np.ndarray,
        bias: np.ndarray,
        rate: np.ndarray,
        config: DetectorConfig | None = None,
        counts: list[int] | None = None,
        model_sha256: str | None = None,
        calibration: np.ndarray | None = None,
        wnids: list[str | None] | None = None,
        label_terms: np.ndarray | None = None,
        term_codes: np.ndarray | None = None,
    ) -> None:
        self.terms = list(terms)
        self.weights = np.ascontiguousarray(weights, dtype=np.float32)
        self.bias = np.asarray(bias, dtype=np.float32)
        self.rate = np.asarray(rate, dtype=np.float32)
        self.config = config or DetectorConfig()
        self.counts = list(counts) if counts is not None else [0] * len(self.terms)
        # SHA-256 of the model weights the detectors were fitted on (None: not recorded)
        self.model_sha256 = model_sha256
        # the WordNet sense each term was fitted at (hierarchical targets), or None for
        # detectors fitted without the hierarchy
        self.wnids = None if wnids is None else [None if w is None else str(w) for w in wnids]
        if self.wnids is not None and len(self.wnids) != len(self.terms):
            raise SparsemmError("detector wnids need one entry per term")
        # which terms are labels of the training items (their own calibration group)
        self.label_terms = (
            np.zeros(len(self.terms), dtype=bool)
            if label_terms is None
            else np.asarray(label_terms, dtype=bool).ravel()
        )
        if self.label_terms.shape != (len(self.terms),):
            raise SparsemmError("detector label flags need one entry per term")
        v = len(self.terms)
        if self.weights.ndim != 2 or self.weights.shape[1] != v:
            raise SparsemmError(f"detector weights have shape {self.weights.shape} for {v} terms")
        if self.bias.shape != (v,) or self.rate.shape != (v,) or len(self.counts) != v:
            raise SparsemmError("detector bias, rate and counts need one entry per term")
        # (a, g, c, phrase_a, phrase_c) of sparsemm.query.scorers.Calibration, fitted on
        # items the detectors were not fitted on (None: not calibrated)
        self.calibration = (
            None if calibration is None else np.asarray(calibration, dtype=np.float32).ravel()
        )
        if self.calibration is not None and self.calibration.shape != (CALIBRATION_SIZE,):
            raise SparsemmError(f"detector calibration needs {CALIBRATION_SIZE} values")
        for name, arr in (("weights", self.weights), ("bias", self.bias), ("rate", self.rate)):
            if not np.isfinite(arr).all():
                raise SparsemmError(f"detector {name} hold NaN or inf values")
        if self.calibration is not None and not np.isfinite(self.calibration).all():
            raise SparsemmError("detector calibration holds NaN or inf values")
        # (d, V) the query code of each term as the calibration read it (its code
        # similarity is part of P(term | x)); None: coded by the query's text encoder
        self.term_codes = (
            None if term_codes is None else np.ascontiguousarray(term_codes, dtype=np.float32)
        )
        if self.term_codes is not None and (
            self.term_codes.shape != self.weights.shape or not np.isfinite(self.term_codes).all()
        ):
            raise SparsemmError("detector term codes need one finite (d,) code per term")
        self._index: dict[tuple[str, ...], int] = {}
        for j, t in enumerate(self.terms):
            self._index.setdefault(_key(t), j)

    @property
    def dim(self) -> int:
        return int(self.weights.shape[0])

    def __len__(self) -> int:
        return len(self.terms)

    def lookup(self, term: str) -> int | None:
        """Column of ``term`` (matched by singular content tokens), or None."""
        key = _key(term)
        return self._index.get(key) if key else None

    def __contains__(self, term: object) -> bool:
        return isinstance(term, str) and self.lookup(term) is not None

    def logits(self, codes_unit: sp.csr_matrix | np.ndarray, term: str) -> np.ndarray:
        """(n,) float64 logits of ``term`` for unit-normalised codes (n, d)."""
        j = self.lookup(term)
        if j is None:
            raise SparsemmError(f"{term!r} has no detector in this model")
        if codes_unit.shape[1] != self.dim:
            raise SparsemmError(
                f"codes have {codes_unit.shape[1]} dims but the detectors {self.dim}"
            )
        z = codes_unit @ (self.weights[:, j] * self.config.scale)
        return np.asarray(z, dtype=np.float64).ravel() + float(self.bias[j])

    def column(self, term: str) -> tuple[np.ndarray, float, float]:
        """(weights (d,) already times ``scale``, bias, rate) of ``term``."""
        j = self.lookup(term)
        if j is None:
            raise SparsemmError(f"{term!r} has no detector in this model")
        return self.column_at(j)

    def column_at(self, j: int) -> tuple[np.ndarray, float, float]:
        """(weights (d,) already times ``scale``, bias, rate) of the ``j``-th term."""
        return self.weights[:, j] * self.config.scale, float(self.bias[j]), float(self.rate[j])

    # -- files ---------------------------------------------------------------------------
    def save(self, model_dir: str | Path) -> None:
        """Write ``detectors.safetensors`` then ``detectors.json`` (its hash) atomically."""
        from safetensors.numpy import save as save_bytes

        out = Path(model_dir)
        out.mkdir(parents=True, exist_ok=True)
        arrays = {"weights": self.weights, "bias": self.bias, "rate": self.rate}
        if self.calibration is not None:
            arrays["calibration"] = self.calibration
        if self.label_terms.any():
            arrays["label_terms"] = self.label_terms.astype(np.uint8)
        if self.term_codes is not None:
            arrays["term_codes"] = self.term_codes
        data = save_bytes(arrays)
        with atomic_open(out / WEIGHTS_FILE, "wb") as fh:
            fh.write(data)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "terms": self.terms,
            "counts": self.counts,
            "config": asdict(self.config),
            "sha256": hashlib.sha256(data).hexdigest(),
            "model_sha256": self.model_sha256,
            "wnids": self.wnids,
        }
        meta["meta_sha256"] = meta_digest(meta)
        write_json(out / META_FILE, meta)

    @classmethod
    def for_model(cls, model_dir: str | Path) -> ConceptDetectors:
        """The detectors of a model folder, refused when they were fitted on other weights
        (the model was retrained since): SparsemmError says how to refit them."""
        det = cls.load(model_dir)
        current = model_weights_sha256(model_dir)
        if det.model_sha256 is not None and current is not None and det.model_sha256 != current:
            raise SparsemmError(
                f"the concept detectors in {model_dir} were fitted on other weights of this "
                f"model (it was retrained since); refit them with `sparsemm train detectors "
                f"{model_dir} COLLECTION`"
            )
        return det

    @classmethod
    def load(cls, model_dir: str | Path) -> ConceptDetectors:
        """Read a model folder's detectors; SparsemmError names a damaged or missing file."""
        from safetensors.numpy import load as load_bytes

        d = Path(model_dir)
        meta_path, weights_path = d / META_FILE, d / WEIGHTS_FILE
        if not meta_path.is_file() or not weights_path.is_file():
            raise SparsemmError(
                f"{d} has no concept detectors; add them with `sparsemm train detectors {d} "
                "COLLECTION`"
            )
        try:
            meta = read_json(meta_path)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SparsemmError(
                f"{meta_path} is not valid JSON ({exc}); retrain the detectors"
            ) from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SparsemmError(f"{meta_path} is not a sparsemm detectors file")
        if meta.get("version") not in READABLE:
            raise SparsemmError(
                f"{meta_path} has version {meta.get('version')!r}; this sparsemm reads "
                f"{', '.join(map(str, READABLE))}"
            )
        recorded = meta.get("meta_sha256")
        if recorded is None:
            log.warning(
                "%s records no checksum of its terms (written by an older sparsemm): they are "
                "not verified; refit the detectors to add one",
                meta_path,
            )
        elif recorded != meta_digest(meta):
            raise SparsemmError(
                f"{meta_path} does not match its own checksum (its terms, counts or settings "
                "were edited or damaged); retrain the detectors"
            )
        if not isinstance(meta.get("terms"), list) or not all(
            isinstance(t, str) and t.strip() for t in meta["terms"]
        ):
            raise SparsemmError(f"{meta_path}: the terms must be a list of words; retrain them")
        data = weights_path.read_bytes()
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            raise SparsemmError(
                f"{weights_path} does not match its checksum in {META_FILE} (damaged or "
                "from another run); retrain the detectors"
            )
        try:
            arrays = load_bytes(data)
            terms = [str(t) for t in meta["terms"]]
            config = DetectorConfig(**meta.get("config", {}))
            return cls(
                terms,
                arrays["weights"],
                arrays["bias"],
                arrays["rate"],
                config,
                [int(c) for c in meta.get("counts", [0] * len(terms))],
                meta.get("model_sha256"),
                arrays.get("calibration"),
                meta.get("wnids"),
                arrays.get("label_terms"),
                arrays.get("term_codes"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SparsemmError(f"{d} holds malformed detectors ({exc}); retrain them") from exc

    def info(self) -> dict[str, Any]:
        return {"terms": len(self.terms), "dim": self.dim, "config": asdict(self.config)}


def fit_logistic(features: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Unregularised logistic regression (a few features, many rows): (weights, bias). The
    match calibrations (:mod:`sparsemm.train.detectors`) and the CLIP concept model's
    zero-shot temperature are fitted with it."""
    import torch

    from sparsemm.runtime import torch_threads

    with torch_threads(1):
        x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float64))
        t = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64))
        w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

        def closure() -> Any:
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, t)
            loss.backward()
            return loss

        opt.step(closure)
        return w.detach().numpy(), float(b.detach()[0])


def meta_digest(meta: dict[str, Any]) -> str:
    """SHA-256 of what ``detectors.json`` says besides its own checksum (terms, counts,
    settings, the weights' checksum), in a canonical JSON form."""
    return json_sha256({k: v for k, v in meta.items() if k != "meta_sha256"})


def model_weights_sha256(model_dir: str | Path) -> str | None:
    """SHA-256 of a model folder's current ``model.safetensors`` (None when absent)."""
    from sparsemm.models.base import WEIGHTS_FILE as MODEL_WEIGHTS
    from sparsemm.models.base import pair_dir

    path = pair_dir(model_dir) / MODEL_WEIGHTS
    if not path.is_file():
        return None
    return sha256_file(path)


def has_detectors(model_dir: str | Path) -> bool:
    d = Path(model_dir)
    return (d / META_FILE).is_file() and (d / WEIGHTS_FILE).is_file()
