"""The web tests' toy collection with PNG images (data and builders; fixtures in conftest).

Six keywords, each drawn as a coloured stripe; an item's image holds the stripes of the
objects in it and its file is named after them. The SR model is hand-made: item codes are
the keyword vectors themselves (dim j = keyword j), and the text side maps "dog" to the dog
dimension plus 0.4 on the ball dimension, the kind of co-activation a trained SR learns from
dogs photographed with balls. So the query "dog" matches the ball concept on ball images and
offers it as a chip to exclude.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from fakes import KeywordEncoder
from sparsemm.data.collection import write_collection
from sparsemm.encoders.base import register_encoder
from sparsemm.models.sr import SRConfig, SRModel

WORDS = ("dog", "cat", "ball", "tree", "car", "pizza")
COLOURS = {
    "dog": (230, 140, 40),
    "cat": (140, 70, 200),
    "ball": (220, 40, 40),
    "tree": (40, 160, 60),
    "car": (40, 90, 220),
    "pizza": (240, 210, 50),
}
# item -> objects in it; every keyword is in >= 5 items so the data-derived dimension labels
# (min_df 5) name each dimension after its keyword.
ITEMS: dict[str, list[str]] = {
    "d1": ["dog"],
    "d2": ["dog"],
    "d3": ["dog", "tree"],
    "db1": ["dog", "ball"],
    "db2": ["dog", "ball"],
    "db3": ["dog", "ball", "tree"],
    "dc1": ["dog", "cat"],
    "dc2": ["dog", "cat", "tree"],
    "c1": ["cat"],
    "c2": ["cat"],
    "c3": ["cat", "tree"],
    "cb1": ["cat", "ball"],
    "b1": ["ball"],
    "b2": ["ball", "tree"],
    "t1": ["tree"],
    "t2": ["tree"],
    "r1": ["car"],
    "r2": ["car", "tree"],
    "r3": ["car"],
    "rp1": ["car", "pizza"],
    "p1": ["pizza"],
    "p2": ["pizza"],
    "p3": ["pizza"],
    "p4": ["pizza", "car"],
}
NO_IMAGE = ("d2", "t2")  # no "image" field: shown as caption cards
NOT_AN_IMAGE = "r3"  # references a text file next to the collection: never served
MISSING_IMAGE = "c3"  # references a file that does not exist
SECRET = "top secret, not an image"


class WebKeywordEncoder(KeywordEncoder):
    name = "webkw"
    keywords = WORDS


register_encoder("webkw")(WebKeywordEncoder)


def dim_of(word: str) -> int:
    return WORDS.index(word)


def draw(objs: list[str], path: Path, size: int = 48) -> None:
    """A square of vertical stripes, one per object, in the objects' colours."""
    img = Image.new("RGB", (size, size))
    width = size // len(objs)
    for i, obj in enumerate(objs):
        img.paste(
            COLOURS[obj], (i * width, 0, size if i == len(objs) - 1 else (i + 1) * width, size)
        )
    img.save(path, format="PNG")


def make_collection(root: Path) -> Path:
    """Write the pictures, a decoy text file and the collection; return the collection."""
    pictures = root / "pictures"
    pictures.mkdir(parents=True)
    (root / "secret.txt").write_text(SECRET)
    enc = WebKeywordEncoder()
    items, texts = [], []
    for i, (iid, objs) in enumerate(ITEMS.items()):
        caps = [" and ".join(objs), "a photo of " + " with ".join(objs)]
        item: dict[str, object] = {"id": iid, "captions": caps, "labels": objs}
        if iid == NOT_AN_IMAGE:
            item["image"] = "../secret.txt"  # relative to the collection folder
        elif iid == MISSING_IMAGE:
            item["image"] = str(pictures / "missing.png")
        elif iid not in NO_IMAGE:
            path = pictures / f"{iid}_{'_'.join(objs)}.png"
            draw(objs, path)
            item["image"] = str(path)
        if iid == "d1":
            item["also"] = ["backup/d1.png"]  # a photo folder's copy of it
        items.append(item)
        texts += [{"item": i, "text": c} for c in caps]
    col = root / "col"
    write_collection(
        col,
        items,
        {"name": "webkw", "dim": len(WORDS)},
        image_emb=enc.encode_text([" ".join(objs) for objs in ITEMS.values()]),
        text_emb=enc.encode_text([t["text"] for t in texts]),
        texts=texts,
    )
    return col


def make_sr(root: Path) -> Path:
    d = len(WORDS)
    model = SRModel(SRConfig(text_dim=d, image_dim=d, latent_dim=d, shared=False, top_k=3))
    text_w = torch.eye(d)
    text_w[dim_of("ball"), dim_of("dog")] = 0.4  # "dog" queries co-activate the ball concept
    with torch.no_grad():
        model.enc_text.weight.copy_(text_w)
        model.enc_text.bias.zero_()
        assert model.enc_image is not None
        model.enc_image.weight.copy_(torch.eye(d))
        model.enc_image.bias.zero_()
    model.save_pretrained(root / "sr")
    return root / "sr"


class StripeImageEncoder:
    """Toy image encoder for query images: the keywords whose stripe colours the picture
    holds (the inverse of :func:`draw`), as the keyword encoder's vectors."""

    name = "webkw"
    dim = len(WORDS)
    modalities = ("image",)

    def encode_image(self, images, batch_size=32, normalize=True, progress=False):
        import numpy as np

        out = np.zeros((len(images), self.dim), dtype=np.float32)
        for i, img in enumerate(images):
            pic = img if isinstance(img, Image.Image) else Image.open(img)
            colours = {c for _, c in pic.convert("RGB").getcolors(maxcolors=4096) or []}
            for word, rgb in COLOURS.items():
                out[i, dim_of(word)] = float(rgb in colours)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12) if normalize else out
