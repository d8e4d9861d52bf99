"""CLIP and BLIP dual encoders through Hugging Face transformers.

- CLIP (Radford et al., 2021): text = projection of the EOS-token state of a causal text
  transformer, image = projection of the ViT's pooled CLS state; both ``projection_dim``-d.
- BLIP (Li et al., 2022): the image-text *contrastive* (ITC) embeddings of the retrieval
  model: ``vision_proj`` / ``text_proj`` of the CLS states of the ViT and the unimodal BERT
  text encoder; ``image_text_hidden_size``-d (256 for the public checkpoints).
- SigLIP (Zhai et al., 2023): the pooled outputs of both towers (the text tower's last
  token through its head, the image tower's attention-pooling head). Trained with a
  sigmoid loss, it scores a pair as ``sigmoid(logit_scale.exp() cos + logit_bias)``, which
  :meth:`SigLIPEncoder.pair_logit` exposes; texts are padded to the training length.

Both are loaded from a hub name or a local folder holding ``config.json`` + weights, a
tokenizer and an image processor (``preprocessor_config.json``). transformers and torch are
imported only when an encoder is built.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
from tqdm.auto import tqdm

from sparsemm.encoders.base import ImageInput, l2_normalize, register_encoder
from sparsemm.errors import SparsemmError, require_extra

if TYPE_CHECKING:
    import torch
    from PIL import Image

logger = logging.getLogger(__name__)

DEFAULT_CLIP = "openai/clip-vit-base-patch32"
DEFAULT_BLIP = "Salesforce/blip-itm-base-coco"
DEFAULT_SIGLIP = "google/siglip-base-patch16-224"

_E = TypeVar("_E", bound="_HFDualEncoder")


HUB_CHECK_TIMEOUT_S = 3.0  # how long a connection to the hub may take before "offline"


class WeightsUnavailable(SparsemmError):
    """A hub model is neither a local folder, nor in the Hugging Face cache, nor reachable.
    ``flag``: the command-line option that gives a local folder (``--model`` of `encode`;
    `up` names its ``--encoder-model``)."""

    def __init__(self, encoder: str, source: str, why: str, flag: str = "--model") -> None:
        self.encoder, self.source, self.why = encoder, source, why
        super().__init__(self.line(flag))

    def line(self, flag: str) -> str:
        return (
            f"cannot load the {self.encoder} weights {self.source!r}: {self.why}; pass a "
            f"local folder of them (config.json, weights, tokenizer, "
            f"preprocessor_config.json) with {flag} DIR, or connect to the internet"
        )


def hub_unreachable(timeout: float = HUB_CHECK_TIMEOUT_S) -> str | None:
    """Why the Hugging Face hub cannot be reached (None: it can): HF_HUB_OFFLINE or
    TRANSFORMERS_OFFLINE set, or no TCP connection to its host within ``timeout`` seconds.
    Asked before a download, so an offline machine gets one line at once instead of the
    hub client's half a minute of retries and warnings."""
    import os
    import socket
    from urllib.parse import urlsplit

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var} is set"
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError:
        return f"not in the local cache and {host} cannot be reached (offline?)"


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds ``repo_id``'s config (it was downloaded)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except (ValueError, OSError):  # not a valid repo id
        return False


def _transformers(extra: str) -> Any:
    try:
        import transformers
    except ImportError:
        require_extra("transformers", extra)
    return transformers


# Largest image decoded, in pixels: 120 megapixels holds the biggest camera photos (about
# 100 MP) and costs 360 MB as RGB; anything larger is refused before it is decoded (a
# "decompression bomb" can declare 10^10 pixels in a few kilobytes).
MAX_IMAGE_PIXELS = 120_000_000


def load_image(image: ImageInput, max_side: int | None = None) -> Image.Image:
    """An RGB PIL image from a PIL image or a file path.

    ``max_side``: a JPEG file may be decoded at a power-of-two reduction that keeps its
    longer side at least this many pixels (libjpeg's draft mode: a 4000-pixel photo needed
    at 800 decodes 4-16x faster); other images are decoded whole.

    The image is turned upright as its EXIF orientation says (:func:`upright`: a phone
    stores a portrait photo as landscape pixels plus an orientation tag), a file's and a
    given PIL image's alike.

    Raises SparsemmError naming the file when it is missing, not an image, truncated or
    corrupt, in a format Pillow cannot read, or larger than :data:`MAX_IMAGE_PIXELS`.
    16-bit greyscale is scaled to 8 bits (a plain conversion would clip it to white).
    """
    import re
    import struct
    import warnings

    from PIL import Image

    if isinstance(image, Image.Image):
        return _to_rgb(upright(image))
    if not isinstance(image, str | Path):
        raise SparsemmError(f"images must be PIL images or file paths, got {type(image).__name__}")
    path = Path(image).expanduser()
    try:
        with warnings.catch_warnings():
            # The size limit below replaces Pillow's own decompression-bomb warning.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                w, h = img.size  # read from the header; nothing decoded yet
                if w * h > MAX_IMAGE_PIXELS:
                    raise _too_large(path, f"{w}x{h} pixels")
                if max_side and img.format == "JPEG" and max(w, h) > 2 * max_side:
                    # the stored (unrotated) size: a quarter turn swaps the sides, not the scale
                    f = max_side / max(w, h)
                    img.draft("RGB", (max(1, int(w * f)), max(1, int(h * f))))
                return _to_rgb(upright(img))
    except Image.DecompressionBombError as exc:  # Pillow's own check, at twice its limit
        # its message names its own limit, not sparsemm's: only the size is kept
        found = re.search(r"\((\d+) pixels\)", str(exc))
        raise _too_large(path, f"{int(found[1]):,} pixels" if found else "by its header") from exc
    except FileNotFoundError as exc:
        raise SparsemmError(f"image file not found: {path}") from exc
    except IsADirectoryError as exc:
        raise SparsemmError(f"{path} is a folder, not an image file") from exc
    except (
        OSError,  # UnidentifiedImageError, truncated data, decoder errors
        ValueError,
        SyntaxError,  # some Pillow plugins report malformed headers this way
        EOFError,
        IndexError,
        struct.error,
    ) as exc:
        raise SparsemmError(f"cannot read image {path} ({exc}); fix or remove this file") from exc


ORIENTATION_TAG = 0x0112  # EXIF Orientation: 1 upright, 3 half turn, 6 / 8 quarter turns, ...


def exif_orientation(img: Image.Image) -> int:
    """The EXIF orientation (1-8) of an opened image; 1 when it has none or an invalid
    one (a broken EXIF block is no reason to refuse a photo)."""
    try:
        value = img.getexif().get(ORIENTATION_TAG, 1)
    except Exception:  # Pillow raises several types on a malformed EXIF block
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def upright(img: Image.Image) -> Image.Image:
    """``img`` as it is meant to be seen: turned and mirrored as its EXIF orientation says
    (``PIL.ImageOps.exif_transpose``; the result's tag says upright, so a second call
    changes nothing); ``img`` itself when it is upright already. Works on a draft-decoded
    JPEG (the draft reduces both sides alike)."""
    orientation = exif_orientation(img)
    if orientation == 1:
        return img
    from PIL import Image, ImageOps

    try:
        return ImageOps.exif_transpose(img)
    except Exception:  # an EXIF block Pillow reads but cannot write back: turn it by hand
        turned = img.transpose(Image.Transpose(_TRANSPOSE[orientation]))
        turned.info.pop("exif", None)
        return turned


_TRANSPOSE = {  # as PIL.ImageOps.exif_transpose reads the tag
    2: 0,  # Image.Transpose.FLIP_LEFT_RIGHT
    3: 3,  # ROTATE_180
    4: 1,  # FLIP_TOP_BOTTOM
    5: 5,  # TRANSPOSE
    6: 4,  # ROTATE_270
    7: 6,  # TRANSVERSE
    8: 2,  # ROTATE_90
}


def _too_large(path: Path, size: str) -> SparsemmError:
    return SparsemmError(
        f"image {path} is larger than the {MAX_IMAGE_PIXELS // 1_000_000} megapixels "
        f"sparsemm decodes ({size}); downscale it or remove it"
    )


def _to_rgb(img: Image.Image) -> Image.Image:
    """Decode ``img`` fully and return it as RGB (16-bit greyscale scaled to 8 bits)."""
    from PIL import Image

    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        arr = np.asarray(img, dtype=np.float64)
        if arr.max(initial=0) > 255:  # a 16-bit range
            arr = arr / 257.0
        img = Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8))  # mode L
    return img.convert("RGB")


def _batches(n: int, batch_size: int) -> Iterator[range]:
    step = max(1, int(batch_size))
    for start in range(0, n, step):
        yield range(start, min(n, start + step))


class _HFDualEncoder:
    """Shared batching/normalisation for transformers dual encoders.

    Build from components (``model``, ``tokenizer``, ``image_processor``) or with
    :meth:`from_pretrained`. Subclasses implement ``_text_features`` / ``_image_features``
    returning un-normalised ``(b, dim)`` tensors.
    """

    name: str = ""
    default_model: ClassVar[str] = ""
    extra: ClassVar[str] = ""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        image_processor: Any,
        device: str | None = None,
        model_id: str | None = None,
    ) -> None:
        import torch

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model_ = model.to(self.device).eval()
        self.tokenizer_ = tokenizer
        self.image_processor_ = image_processor
        self.model_id = model_id or str(getattr(model.config, "_name_or_path", "") or self.name)
        self.dim = self._config_dim(model.config)
        self.max_length = self._max_length(model.config, tokenizer)

    @staticmethod
    def _config_dim(config: Any) -> int:
        raise NotImplementedError

    @staticmethod
    def _model_class(transformers: Any) -> Any:
        raise NotImplementedError

    @staticmethod
    def _max_length(config: Any, tokenizer: Any) -> int:
        limit = int(getattr(config.text_config, "max_position_embeddings", 512))
        tok_max = getattr(tokenizer, "model_max_length", None)
        if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
            limit = min(limit, tok_max)
        return limit

    @classmethod
    def from_pretrained(
        cls: type[_E], name_or_path: str | Path | None = None, device: str | None = None
    ) -> _E:
        """Load model, tokenizer and image processor from a hub name or a local folder."""
        source = str(name_or_path or cls.default_model)
        local = Path(source).expanduser()
        is_local = local.is_dir()
        if not is_local and source.startswith((".", "/", "~")):
            raise SparsemmError(f"{cls.name} model folder not found: {source}")
        where = str(local) if is_local else source
        # Weights neither in a folder nor in the cache must be downloaded: asked first,
        # before importing the model code (tens of seconds on a busy machine), so that an
        # offline machine gets one line at once instead of the hub client's retries.
        cached = is_local or _in_hub_cache(source)
        if not cached:
            why = hub_unreachable()
            if why is not None:
                raise WeightsUnavailable(cls.name, source, why)
        transformers = _transformers(cls.extra)
        try:
            model, tokenizer, image_processor = cls._load_parts(
                transformers, where, local_only=cached
            )
        except (OSError, ValueError) as exc:
            if is_local:
                raise SparsemmError(
                    f"could not load {cls.name} model {source!r} ({exc}); the folder needs "
                    "config.json, weights, tokenizer and preprocessor_config.json"
                ) from exc
            raise WeightsUnavailable(cls.name, source, f"loading failed ({exc})") from exc
        logger.info("loaded %s model %s", cls.name, source)
        return cls(model, tokenizer, image_processor, device=device, model_id=source)

    @classmethod
    def _load_parts(cls, transformers: Any, where: str, local_only: bool) -> tuple[Any, Any, Any]:
        """Model, tokenizer and image processor (``local_only``: from a folder or the
        Hugging Face cache, never the network)."""
        model = cls._model_class(transformers).from_pretrained(where, local_files_only=local_only)
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, local_files_only=local_only)
        image_processor = transformers.AutoImageProcessor.from_pretrained(
            where, local_files_only=local_only
        )
        return model, tokenizer, image_processor

    # -- features (subclasses) ------------------------------------------------------------

    def _text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        raise NotImplementedError

    def _image_features(self, pixel_values: torch.Tensor) -> Any:
        raise NotImplementedError

    # -- public API -----------------------------------------------------------------------

    padding: ClassVar[str | bool] = True  # how a batch of texts is padded

    def pair_logit(self) -> tuple[float, float] | None:
        """(scale, bias) such that sigmoid(scale cos + bias) is the model's own probability
        that an image and a text belong together, for models trained that way (SigLIP);
        None otherwise (CLIP's softmax temperature says nothing about a single pair)."""
        return None

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        """Embed ``texts`` -> float32 ``(len(texts), dim)``; rows unit-length if ``normalize``."""
        import torch

        texts = list(texts)
        if any(not isinstance(t, str) for t in texts):
            raise SparsemmError("encode_text expects a list of strings")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Longest first: batches hold similar lengths, so little padding is computed.
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batches = list(_batches(len(texts), batch_size))
        for rows in tqdm(batches, desc=f"{self.name} text", disable=not progress, unit="batch"):
            idx = [order[i] for i in rows]
            enc = self.tokenizer_(
                [texts[i] for i in idx],
                padding=self.padding,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            mask = enc.get("attention_mask")
            if mask is None:  # SigLIP's tokenizer returns none: it attends to the padding
                mask = torch.ones_like(enc["input_ids"])
            with torch.inference_mode():
                feats = self._text_features(enc["input_ids"].to(self.device), mask.to(self.device))
            out[idx] = feats.float().cpu().numpy()
        return l2_normalize(out) if normalize else out

    def encode_image(
        self,
        images: Sequence[ImageInput],
        batch_size: int = 32,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        """Embed images (PIL or paths) -> float32 ``(len(images), dim)``."""
        import torch

        images = list(images)
        out = np.zeros((len(images), self.dim), dtype=np.float32)
        batches = list(_batches(len(images), batch_size))
        for rows in tqdm(batches, desc=f"{self.name} image", disable=not progress, unit="batch"):
            # Opened per batch so a large folder never sits in memory at once.
            pil = [load_image(images[i]) for i in rows]
            pixel_values = self.image_processor_(images=pil, return_tensors="pt")["pixel_values"]
            with torch.inference_mode():
                feats = self._image_features(pixel_values.to(self.device))
            out[rows.start : rows.stop] = feats.float().cpu().numpy()
        return l2_normalize(out) if normalize else out


class CLIPEncoder(_HFDualEncoder):
    """CLIP image/text encoder (``projection_dim``-d, e.g. 512 for ViT-B/32)."""

    name = "clip"
    default_model = DEFAULT_CLIP
    extra = "clip"

    @staticmethod
    def _config_dim(config: Any) -> int:
        return int(config.projection_dim)

    @staticmethod
    def _model_class(transformers: Any) -> Any:
        return transformers.CLIPModel

    def _text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        # Called through the sub-modules, not get_text_features, whose return type
        # changed between transformers 4 (tensor) and 5 (output object).
        pooled = self.model_.text_model(
            input_ids=input_ids, attention_mask=attention_mask
        ).pooler_output  # (b, text hidden): state at the EOS token
        return self.model_.text_projection(pooled)  # (b, projection_dim)

    def _image_features(self, pixel_values: torch.Tensor) -> Any:
        pooled = self.model_.vision_model(pixel_values=pixel_values).pooler_output
        return self.model_.visual_projection(pooled)  # (b, projection_dim)


class BLIPEncoder(_HFDualEncoder):
    """BLIP retrieval model's ITC embeddings (``image_text_hidden_size``-d, 256 public)."""

    name = "blip"
    default_model = DEFAULT_BLIP
    extra = "blip"

    @staticmethod
    def _config_dim(config: Any) -> int:
        return int(config.image_text_hidden_size)

    @staticmethod
    def _model_class(transformers: Any) -> Any:
        return transformers.BlipForImageTextRetrieval

    def _text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        # Unimodal text encoder (no cross-attention to an image), CLS state -> text_proj,
        # exactly the ITC branch of BlipForImageTextRetrieval.forward(use_itm_head=False).
        hidden = self.model_.text_encoder(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state  # (b, L, text hidden)
        return self.model_.text_proj(hidden[:, 0, :])

    def _image_features(self, pixel_values: torch.Tensor) -> Any:
        hidden = self.model_.vision_model(pixel_values=pixel_values).last_hidden_state
        return self.model_.vision_proj(hidden[:, 0, :])  # (b, image_text_hidden_size)


class SigLIPEncoder(_HFDualEncoder):
    """SigLIP image/text encoder (``text_config.hidden_size``-d, 768 for base)."""

    name = "siglip"
    default_model = DEFAULT_SIGLIP
    extra = "clip"
    padding = "max_length"  # SigLIP was trained on texts padded to 64 tokens

    @staticmethod
    def _config_dim(config: Any) -> int:
        return int(config.text_config.hidden_size)

    @staticmethod
    def _model_class(transformers: Any) -> Any:
        return transformers.SiglipModel

    def _text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        # SigLIP attends to every position (its pooled output is the last token through the
        # head), so the mask is not passed, as in SiglipModel.get_text_features
        return self.model_.text_model(input_ids=input_ids).pooler_output

    def _image_features(self, pixel_values: torch.Tensor) -> Any:
        return self.model_.vision_model(pixel_values=pixel_values).pooler_output

    def pair_logit(self) -> tuple[float, float] | None:
        scale = float(self.model_.logit_scale.detach().exp().cpu())
        bias = float(self.model_.logit_bias.detach().cpu())
        return scale, bias


@register_encoder("clip")
def _make_clip(model: str | Path | None = None, device: str | None = None) -> CLIPEncoder:
    """Registry factory: ``model`` is a hub name or local folder (default: DEFAULT_CLIP)."""
    return CLIPEncoder.from_pretrained(model, device=device)


@register_encoder("blip")
def _make_blip(model: str | Path | None = None, device: str | None = None) -> BLIPEncoder:
    """Registry factory: ``model`` is a hub name or local folder (default: DEFAULT_BLIP)."""
    return BLIPEncoder.from_pretrained(model, device=device)


@register_encoder("siglip")
def _make_siglip(model: str | Path | None = None, device: str | None = None) -> SigLIPEncoder:
    """Registry factory: ``model`` is a hub name or local folder (default: DEFAULT_SIGLIP)."""
    return SigLIPEncoder.from_pretrained(model, device=device)
