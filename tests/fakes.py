"""Tiny deterministic fakes shared by the tests.

A keyword one-hot text/image encoder, a locally built tiny BERT, a tiny LexLIP config and a
synthetic COCO-format annotation file. torch/transformers/sparsemm.models are imported inside
the helpers that need them, so tests without torch can still import this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sparsemm.errors import SparsemmError

if TYPE_CHECKING:
    from sparsemm.words.vectors import WordVectors
    from sparsemm_experiments.models.lexlip import LexLIPConfig

BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def keyword_vectors(texts: Sequence[str], keywords: Sequence[str]) -> np.ndarray:
    """(n, len(keywords)) counts of words starting with each keyword, L2-normalised."""
    out = np.zeros((len(texts), len(keywords)), dtype=np.float32)
    for i, text in enumerate(texts):
        words = text.lower().replace(".", " ").replace("/", " ").split()
        for j, kw in enumerate(keywords):
            out[i, j] = sum(w.startswith(kw) for w in words)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


def term_word_encoder(
    words: Sequence[str], name: str = "keyword", fallback: bool = False, register: bool = False
) -> type:
    """A fake text encoder class: one dimension per word, 1 when the text's term tokens
    (:func:`sparsemm.query.strategies.term_tokens`) contain it, rows L2-normalised.

    ``fallback`` puts texts with none of the words on the last dimension (never an all-zero
    embedding); ``register`` registers the class under ``name`` so collections can name it.
    """
    from sparsemm.encoders.base import register_encoder
    from sparsemm.query.strategies import term_tokens

    vocab = {w: j for j, w in enumerate(words)}

    class TermWordEncoder:
        modalities = ("text",)

        def __init__(self, model: str | None = None) -> None:
            pass

        def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
            out = np.zeros((len(texts), len(vocab)), dtype=np.float32)
            for i, t in enumerate(texts):
                for tok in term_tokens(t):
                    if tok in vocab:
                        out[i, vocab[tok]] = 1.0
            if fallback:
                out[out.sum(axis=1) == 0, -1] = 1.0
            if not normalize:
                return out
            return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

    TermWordEncoder.name = name  # type: ignore[attr-defined]
    TermWordEncoder.dim = len(vocab)  # type: ignore[attr-defined]
    return register_encoder(name)(TermWordEncoder) if register else TermWordEncoder


class KeywordEncoder:
    """Fake encoder: text -> keyword counts; an image -> the keywords in its file name."""

    name = "kwfake"
    keywords: Sequence[str] = ("cat", "dog", "car", "red", "tree")
    calls = 0

    def __init__(
        self, model: str | None = None, images: bool = False, keywords: Sequence[str] | None = None
    ) -> None:
        if keywords is not None:
            self.keywords = tuple(keywords)
        self.dim = len(self.keywords)
        self.model_id = model or "keywords-v1"
        self.modalities = ("text", "image") if images else ("text",)

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False) -> np.ndarray:
        KeywordEncoder.calls += 1
        return keyword_vectors(list(texts), self.keywords)

    def encode_image(self, images, batch_size=32, normalize=True, progress=False) -> np.ndarray:
        if "image" not in self.modalities:
            raise SparsemmError("text only")
        return keyword_vectors([Path(p).stem.replace("_", " ") for p in images], self.keywords)


def tiny_bert(
    folder: Path,
    words: Sequence[str],
    *,
    special: Sequence[str] = BERT_SPECIAL,
    hidden: int = 16,
    seed: int = 0,
    max_positions: int = 32,
) -> Path:
    """A randomly initialised 2-layer BERT (``torch.manual_seed(seed)``) and its WordPiece
    tokenizer over the vocabulary ``special + words``, saved in ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast  # type: ignore[attr-defined]

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join([*special, *words]) + "\n")
    BertTokenizerFast.from_pretrained(str(folder)).save_pretrained(str(folder))
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(special) + len(words),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_positions,
    )
    BertModel(cfg, add_pooling_layer=False).save_pretrained(str(folder))
    return folder


def tiny_lexlip_config(**kw: object) -> LexLIPConfig:
    """A LexLIPConfig with a random 2-layer, 32-wide text tower and 1-layer image tower;
    ``kw`` overrides any field (max_text_len, image_dim, queue_size, lexicon_size, ...)."""
    from sparsemm_experiments.models.lexlip import LexLIPConfig

    base = LexLIPConfig(
        text_init="random",
        hidden=32,
        text_layers=2,
        text_heads=2,
        text_intermediate=64,
        frozen_layers=1,
        image_hidden=16,
        image_heads=2,
        image_layers=1,
        dense_dim=8,
        decoder_heads=2,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def write_fake_coco(
    root: Path,
    objects: Sequence[str],
    captions: Callable[[list[str]], list[str]],
    *,
    n: int,
    first_id: int,
    n_objects: int | tuple[int, int] = 2,
    seed: int = 0,
) -> Path:
    """Write ``root/coco/val2017.json`` (image id -> file_name, split, labels, captions).

    Image ``first_id + i`` gets distinct labels drawn from ``objects`` (``n_objects`` of them,
    or ``rng.integers(*n_objects)`` when a range) and ``captions(labels)``; every 4th image is
    in the test split. Returns ``root``.
    """
    rng = np.random.default_rng(seed)
    data = {}
    for i in range(n):
        k = n_objects if isinstance(n_objects, int) else int(rng.integers(*n_objects))
        objs = [str(o) for o in rng.choice(list(objects), size=k, replace=False)]
        data[str(first_id + i)] = {
            "file_name": f"{first_id + i}.jpg",
            "split": "test" if i % 4 == 0 else "train",
            "labels": objs,
            "captions": captions(objs),
        }
    (root / "coco").mkdir(parents=True)
    (root / "coco" / "val2017.json").write_text(json.dumps(data))
    return root


FASHION_WORDS = ("sneaker", "bag", "dress", "sandal", "shirt")


class FashionWords(KeywordEncoder):
    name = "apifashion"
    keywords = FASHION_WORDS


# item -> garments in it; captions mention them (fashion_collection)
FASHION_ITEMS = {
    "s1": ["sneaker"],
    "s2": ["sneaker", "shirt"],
    "s3": ["sneaker", "dress"],
    "sb1": ["sneaker", "bag"],
    "sb2": ["sneaker", "bag", "shirt"],
    "b1": ["bag"],
    "b2": ["bag", "dress"],
    "d1": ["dress"],
    "d2": ["dress", "sandal"],
    "a1": ["sandal"],
    "t1": ["shirt"],
    "t2": ["shirt", "sandal"],
}


def keyword_collection(
    folder: Path, encoder: KeywordEncoder, objects: dict[str, list[str]]
) -> Path:
    """Write a collection of ``objects`` (item id -> the object words in it), all in split
    train: captions "a and b" and "a photo of a with b", labels = the objects, image
    embedding = ``encoder``'s vector of the object words. Returns the folder."""
    from sparsemm.data.collection import write_collection

    items, texts = [], []
    for i, (iid, objs) in enumerate(objects.items()):
        caps = [" and ".join(objs), "a photo of " + " with ".join(objs)]
        items.append({"id": iid, "captions": caps, "labels": objs, "split": "train"})
        texts += [{"item": i, "text": c} for c in caps]
    col = write_collection(
        folder,
        items,
        {"name": encoder.name, "dim": encoder.dim},
        image_emb=encoder.encode_text([" ".join(objs) for objs in objects.values()]),
        text_emb=encoder.encode_text([t["text"] for t in texts]),
        texts=texts,
    )
    return col.root


def identity_sr(folder: Path, d: int, top_k: int = 3) -> Path:
    """Save an SR whose code is its d-dim input itself (dim j = keyword j): a hand-made
    model with known answers. Returns the folder."""
    import torch

    from sparsemm.models.sr import SRConfig, SRModel

    model = SRModel(SRConfig(text_dim=d, image_dim=d, latent_dim=d, top_k=top_k))
    with torch.no_grad():
        model.enc_text.weight.copy_(torch.eye(d))
        model.enc_text.bias.zero_()
    model.save_pretrained(folder)
    return folder


def fashion_collection(tmp_path: Path) -> Path:
    """A 12-item collection (FASHION_ITEMS) indexed with an identity SR, through the names
    exported from ``sparsemm``; the encoder is registered as "apifashion"."""
    import sparsemm
    from sparsemm.encoders.base import register_encoder

    register_encoder(FashionWords.name)(FashionWords)
    col = keyword_collection(tmp_path / "collection", FashionWords(), FASHION_ITEMS)
    sparsemm.build_index(col, identity_sr(tmp_path / "sr", len(FASHION_WORDS)))
    return col


TINY_CLIP_WORDS = (
    "[PAD] [UNK] [CLS] [SEP] a photo of cat dog red blue car tree on the person bus tabby".split()
)


def tiny_clip(folder: Path, kind: str = "clip", proj: int = 24, seed: int = 0) -> Path:
    """A randomly initialised CLIP (or SigLIP) with a word-level tokenizer and an image
    processor, saved to ``folder`` like a hub checkpoint (loads with ``from_pretrained``)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {w: i for i, w in enumerate(TINY_CLIP_WORDS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tk.save(str(folder / "tokenizer-src.json"))
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer-src.json"),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        model_max_length=16,
    )
    text = dict(
        vocab_size=len(TINY_CLIP_WORDS),
        hidden_size=proj if kind == "siglip" else 32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    vision = dict(
        hidden_size=proj if kind == "siglip" else 32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    torch.manual_seed(seed)
    if kind == "siglip":
        model = transformers.SiglipModel(
            transformers.SiglipConfig(text_config=text, vision_config=vision)
        )
        ip = transformers.SiglipImageProcessor(size={"height": 32, "width": 32})
    else:
        model = transformers.CLIPModel(
            transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=proj)
        )
        ip = transformers.CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        )
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    ip.save_pretrained(folder)
    return folder


# -- the match scorer: hashed texts and calibrated SR detectors --------------------------


class HashTexts:
    """Text embeddings that are a deterministic function of the text."""

    name, dim, model_id = "minilm", 16, "fake"

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        out = np.stack(
            [
                np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(
                    size=self.dim
                )
                for t in texts
            ]
        ).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


SR_TERMS = ["dog", "cat", "car", "bus", "vehicle", "person", "puppy"]


def sr_detectors(d: int, seed: int = 0) -> Any:
    """Calibrated detectors (version 2) of SR_TERMS over d-dim codes, placed in WordNet."""
    from sparsemm.concepts.wordnet import wordnet
    from sparsemm.models.detectors import ConceptDetectors

    rng = np.random.default_rng(seed)
    wn = wordnet()
    wnids = [wn.wnid(wn.lookup(t)[0]) for t in SR_TERMS]
    wnids[SR_TERMS.index("person")] = "n00007846"
    return ConceptDetectors(
        SR_TERMS,
        rng.normal(size=(d, len(SR_TERMS))).astype(np.float32),
        rng.normal(size=len(SR_TERMS)).astype(np.float32) - 1.0,
        np.ones(len(SR_TERMS), np.float32),
        calibration=np.asarray([0.9, 2.0, -0.5, 30.0, -20.0, 0.8, 3.0, -1.0], np.float32),
        wnids=wnids,
        label_terms=np.asarray([t in ("dog", "car", "bus", "person") for t in SR_TERMS]),
    )


def sr_context(codes: Any, det: Any) -> Any:
    """A context over ``codes`` whose query coder is a deterministic function of the text."""
    import scipy.sparse as sp

    from sparsemm.query.strategies import ExclusionContext

    d = codes.shape[1]

    def coder(emb: Any, texts: Sequence[str]) -> Any:
        out = np.stack(
            [
                np.maximum(
                    np.random.default_rng(
                        int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)
                    ).normal(size=d),
                    0.0,
                )
                for t in texts
            ]
        )
        return sp.csr_matrix(out.astype(np.float32))

    return ExclusionContext(
        items_codes=codes, text_encoder=HashTexts(), query_coder=coder, detectors=det
    )


def sr_codes(n: int, d: int, seed: int = 0) -> Any:
    """Random non-negative unit codes, about 30% of the dims active."""
    import scipy.sparse as sp

    from sparsemm.linalg import normalize_rows

    rng = np.random.default_rng(seed)
    x = np.maximum(rng.normal(size=(n, d)), 0.0) * (rng.random((n, d)) < 0.3)
    x[:, 0] += 1e-3  # no empty row
    return sp.csr_matrix(normalize_rows(x.astype(np.float32)))


TINY_PHOTO_CLASSES = ["tabby, tabby cat", "coffee mug", "space shuttle"]
TINY_PHOTO_WNIDS = ["n02123045", "n03063599", "n04266014"]


class _FakeMiniLM:
    """Stands in for MiniLM when the tiny photo model embeds its class names (no 10 s load)."""

    name = "minilm"
    dim = 384
    model_id = "all-MiniLM-L6-v2"

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        rng = np.random.default_rng(len(texts))
        out = rng.normal(size=(len(texts), self.dim)).astype(np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def save_tiny_photo_model(folder: Path) -> Path:
    """Save a 3-class photo concept model (version 2, face unit) on EfficientNet's 1280
    features, recorded as trained on EfficientNet-Lite0 + MiniLM: what `sparsemm up` finds
    at ``$SPARSEMM_CACHE/imagenet-concepts-v2``. Returns the folder."""
    from sparsemm.models.concepts import ImageNetConceptModel
    from sparsemm.pipeline.up import minilm_info

    rng = np.random.default_rng(0)
    model = ImageNetConceptModel.build(
        TINY_PHOTO_CLASSES,
        rng.normal(size=(3, 1280)).astype(np.float32) * 0.1,
        rng.normal(size=3).astype(np.float32),
        _FakeMiniLM(),
        version=2,
        face_unit=True,
        class_wnids=TINY_PHOTO_WNIDS,
    )
    model.training_info = {
        "image_encoder": {"name": "efficientnet", "dim": 1280, "model": "efficientnet-lite0"},
        "text_encoder": minilm_info(),
    }
    model.save_pretrained(folder)
    return folder


def noise_photo(path: Path, seed: int) -> None:
    """Write a 64x48 noise picture (a band inverted by ``seed``) to ``path``."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    arr = (rng.random((48, 64, 3)) * 255).astype(np.uint8)
    arr[:, : 8 * (seed + 1)] = 255 - arr[:, : 8 * (seed + 1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


CLUSTERS = (
    "animal",
    "food",
    "sport",
    "room",
    "color",
    "vehicle",
    "music",
    "weather",
    "tool",
    "plant",
)


def toy_word_vectors(dim: int = 16, per_cluster: int = 20, seed: int = 0) -> WordVectors:
    """10 clusters x 20 words; word 0 of a cluster is the cluster name, the others are the
    name plus a letter suffix ("animalb", ...). Letters only, so the tokenizer keeps them."""
    from sparsemm.words.vectors import WordVectors

    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, (len(CLUSTERS), dim)) * 2.0
    words: list[str] = []
    rows: list[np.ndarray] = []
    for c, name in enumerate(CLUSTERS):
        for i in range(per_cluster):
            words.append(name if i == 0 else name + chr(ord("a") + i))
            rows.append(centers[c] + 0.3 * rng.normal(0.0, 1.0, dim))
    return WordVectors(words, np.asarray(rows, dtype=np.float32))


# -- toy corpora shared by test files of the library and of the research package ----------

# A collection of labelled, captioned items: labels from CAPTION_LABELS, captions that
# mention most of them in a CAPTION_FILLER place.
CAPTION_LABELS = ["dog", "cat", "car", "tree", "person", "ball", "bench", "kite"]
CAPTION_FILLER = ["park", "street", "grass", "sky"]


def labelled_caption_collection(
    path: Path, encoder: Any, n_train: int = 60, n_test: int = 40
) -> Any:
    """Items with 1-3 labels; three captions each mention most labels (some are left
    unmentioned); an item's image view is the mean of its captions' ``encoder`` embeddings
    (the caption proxy). Written under ``encoder``'s name."""
    from sparsemm.data.collection import write_collection

    rng = np.random.default_rng(0)
    items: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for i in range(n_train + n_test):
        size = int(rng.integers(1, 4))
        labels = sorted(rng.choice(CAPTION_LABELS, size=size, replace=False).tolist())
        caps = []
        for _ in range(3):
            said = [w for w in labels if rng.random() < 0.8] or labels[:1]
            caps.append(f"a {' and a '.join(said)} in the {rng.choice(CAPTION_FILLER)}")
        split = "train" if i < n_train else "test"
        items.append({"id": str(i), "labels": labels, "captions": caps, "split": split})
        texts += [{"item": i, "text": c} for c in caps]
    text_emb = encoder.encode_text([t["text"] for t in texts])
    owner = np.array([t["item"] for t in texts])
    views = np.stack([text_emb[owner == i].mean(axis=0) for i in range(len(items))])
    views /= np.linalg.norm(views, axis=1, keepdims=True)
    return write_collection(
        path,
        items,
        {"name": encoder.name, "dim": int(encoder.dim)},
        image_emb=views,
        text_emb=text_emb,
        texts=texts,
    )


# SpLiCE's concept vocabulary for the decomposer tests, and random unit embeddings of it.
SPLICE_CONCEPTS = ["dog", "cat", "car", "tree", "person", "ball", "bench", "kite"]


def splice_concept_embeddings(k: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(len(SPLICE_CONCEPTS), k)).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


# Items as keyword weights (dims: dog, cat, car, tree), for the exclusion strategies' worked
# examples: the codes are the keyword weights and a query's code its keyword one-hot.
TOY_WORDS = ["dog", "cat", "car", "tree"]
TOY_ITEMS = np.array(
    [
        [1.0, 0.0, 0.0, 0.0],  # 0: dog
        [1.0, 0.8, 0.0, 0.0],  # 1: dog + cat
        [0.0, 1.0, 0.0, 0.0],  # 2: cat
        [0.0, 0.0, 1.0, 0.0],  # 3: car
        [0.9, 0.0, 0.0, 0.5],  # 4: dog + tree
        [0.0, 1.0, 0.0, 0.4],  # 5: cat + tree
    ],
    dtype=np.float32,
)


def identity_coder(emb: np.ndarray, texts: Sequence[str]) -> Any:
    """Query codes = the keyword one-hot itself (codes share the keyword dimensions)."""
    import scipy.sparse as sp

    return sp.csr_matrix(np.maximum(emb, 0.0))


def toy_context() -> Any:
    """An ExclusionContext over TOY_ITEMS (dense and codes) with the keyword text encoder."""
    import scipy.sparse as sp

    from sparsemm.query.strategies import ExclusionContext

    return ExclusionContext(
        items_dense=TOY_ITEMS,
        items_codes=sp.csr_matrix(TOY_ITEMS),
        text_encoder=term_word_encoder(TOY_WORDS)(),
        query_coder=identity_coder,
    )


# Dimension naming: 8 items whose captions share the template "a grid of photos"; dim 0 =
# dogs, dim 1 = cats, dim 2 = nothing active.
NAMING_CAPTIONS = [
    ["a grid of photos with a dog"],
    ["a grid of photos with two dogs"],
    ["a grid of photos with a dog and a ball"],
    ["a grid of photos with a cat"],
    ["a grid of photos with a cat and a ball"],
    ["a grid of photos with cats"],
    ["a grid of photos with a hot dog"],
    ["a grid of photos with a ball"],
]
NAMING_LABELS = [["dog"], ["dog"], ["dog", "ball"], ["cat"], ["cat", "ball"], ["cat"], [], ["ball"]]
NAMING_CODES = np.array(
    [
        [0.9, 0.0, 0.0],
        [0.8, 0.0, 0.0],
        [0.7, 0.1, 0.0],
        [0.0, 0.9, 0.0],
        [0.1, 0.8, 0.0],
        [0.0, 0.7, 0.0],
        [0.6, 0.0, 0.0],  # a hot dog item, high on the dog dim: a naming trap
        [0.0, 0.0, 0.0],
    ],
    np.float32,
)
NAMING_TERMS = ["dog", "cat", "ball", "grid", "photo", "hot dog"]


class ColourEncoder:
    """Embeds an image as its mean colour (plus a constant); records what it read."""

    name, dim = "colours", 4

    def __init__(self) -> None:
        self.read: list[str] = []

    def encode_image(self, images, batch_size=32, normalize=True, progress=False):  # type: ignore[no-untyped-def]
        from sparsemm.encoders.hf import load_image

        rows = []
        for img in images:
            self.read.append(Path(img).name)
            rows.append([*np.asarray(load_image(img), np.float32).mean(axis=(0, 1)), 1.0])
        out = np.asarray(rows, np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True) if normalize else out


class FlatText:
    """A 4-d text encoder giving every text the same vector (photo folders without captions)."""

    name, dim, model_id = "minilm", 4, None

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):  # type: ignore[no-untyped-def]
        return np.tile(np.asarray([[0.5, 0.5, 0.5, 0.5]], np.float32), (len(texts), 1))
