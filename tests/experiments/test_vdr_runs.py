from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fakes import KeywordEncoder, keyword_vectors, tiny_bert  # noqa: E402
from sparsemm.data.collection import Collection, write_collection  # noqa: E402
from sparsemm.errors import SparsemmError  # noqa: E402
from sparsemm_experiments.data.patches import proxy_patches  # noqa: E402
from sparsemm_experiments.models.vdr import VDRModel  # noqa: E402
from sparsemm_experiments.train.vdr import adapter_ridge_init, cross_modal_data, ridge_map  # noqa: E402
from sparsemm_experiments.vdr_runs import (  # noqa: E402
    VDRCodes,
    VDRRunConfig,
    laziness_stats,
    run_vdr_bench,
)

WORDS = "a photo of cat dog car tree red blue on the with and".split()
KEYWORDS = ("cat", "dog", "car", "tree", "red")
THINGS = ["cat", "dog", "car", "tree"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"), WORDS)


def tiny_collection(folder: Path, n: int = 32) -> Collection:
    """Items with two or three objects, captions naming them, labels = the objects."""
    items, texts = [], []
    for i in range(n):
        objs = [THINGS[i % 4], THINGS[(i // 4) % 4]]
        if i % 3 == 0:
            objs.append(THINGS[(i + 1) % 4])
        objs = list(dict.fromkeys(objs))
        caps = [f"a photo of a {' and a '.join(objs)}", f"{' with '.join(objs)}"]
        if i % 2:
            caps.append(f"a red {objs[0]}")
        items.append(
            {
                "id": f"i{i}",
                "captions": caps,
                "labels": objs,
                "split": "train" if i < n * 5 // 8 else "test",
            }
        )
        texts += [{"item": i, "text": c} for c in caps]
    text_emb = keyword_vectors([t["text"] for t in texts], KEYWORDS)
    owner = np.array([t["item"] for t in texts])
    views = np.stack([text_emb[owner == i].mean(axis=0) for i in range(n)])
    views /= np.linalg.norm(views, axis=1, keepdims=True)
    return write_collection(
        folder,
        items,
        {"name": "kwfake", "dim": len(KEYWORDS)},
        image_emb=views,
        text_emb=text_emb,
        texts=texts,
        extra={"image_kind": "caption_view"},
    )


def test_proxy_patches_group_captions(tmp_path: Path) -> None:
    col = tiny_collection(tmp_path / "c", 8)
    patches, mask = proxy_patches(col)
    owner = col.text_item_index()
    assert patches.shape == (8, 3, len(KEYWORDS))
    assert mask.sum(axis=1).tolist() == np.bincount(owner).tolist()
    te = col.text_embeddings()
    np.testing.assert_allclose(patches[1, : mask[1].sum()], te[owner == 1])
    assert not patches[~mask].any()


def test_leave_one_out_hides_the_pairs_own_caption(tmp_path: Path) -> None:

    col = tiny_collection(tmp_path / "c", 8)
    patches, mask = proxy_patches(col)
    data = cross_modal_data(col, "train", patches, mask, leave_one_out=True)
    rows, _ = col.caption_rows(col.split_mask("train"))
    te = col.text_embeddings()
    assert data.hide_patch is not None
    for j, r in enumerate(rows):
        np.testing.assert_allclose(data.patches[data.pair_item[j], data.hide_patch[j]], te[r])
    assert cross_modal_data(col, "train", patches, mask).hide_patch is None


def test_ridge_map_recovers_a_linear_map() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6))
    w, b = rng.normal(size=(6, 3)), rng.normal(size=3)
    w_hat, b_hat = ridge_map(x, x @ w + b, l2=1e-6)
    np.testing.assert_allclose(w_hat, w, atol=1e-4)
    np.testing.assert_allclose(b_hat, b, atol=1e-4)


class FakeSpatial:
    """Stands in for EfficientNet: 'spatial features' derived from the image path."""

    calls = 0

    def encode_spatial(self, images: list[str], progress: bool = False) -> np.ndarray:
        FakeSpatial.calls += 1
        return np.stack([np.full((4, 6), float(len(str(p)) % 7)) for p in images])


def test_collage_patches_cached_per_collection(tmp_path: Path) -> None:
    from sparsemm_experiments.data.patches import collage_patches

    items = [
        {
            "id": f"x{i}",
            "image": f"img/{'a' * i}.png",
            "split": "train" if i < 6 else "test",
            "captions": [f"a cat {i}"],
        }
        for i in range(8)
    ]
    texts = [{"item": i, "text": f"a cat {i}"} for i in range(8)]
    emb = keyword_vectors([t["text"] for t in texts], KEYWORDS)
    col = write_collection(tmp_path / "c", items, {"name": "kw", "dim": 5}, emb, emb, texts)
    FakeSpatial.calls = 0
    a = collage_patches(col, tmp_path / "cache", encoder=FakeSpatial())
    b = collage_patches(col, tmp_path / "cache", encoder=FakeSpatial())
    assert FakeSpatial.calls == 1 and a.dtype == np.float16 and a.shape == (8, 4, 6)
    np.testing.assert_array_equal(a, b)
    w, bias = adapter_ridge_init(col, a)
    assert w.shape == (6, 5) and bias.shape == (5,)
    bad = write_collection(
        tmp_path / "d", [{"id": "y", "split": "train"}], {"name": "kw", "dim": 5}, emb[:1]
    )
    with pytest.raises(SparsemmError, match="image"):
        collage_patches(bad, tmp_path / "cache2", encoder=FakeSpatial())


def test_laziness_stats_hand_made() -> None:
    tokens = ["the", "cat", "dog", "car"]
    codes = sp.csr_matrix(
        np.array([[0.5, 0.4, 0.0, 0.0], [0.5, 0.0, 0.3, 0.0], [0.5, 0.0, 0, 0.2]])
    )
    caps = sp.csr_matrix(np.array([[0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]], dtype=np.float32))
    st = laziness_stats(codes, tokens, caps, top=2)
    assert st["top_tokens"] == ["the", "cat"]
    assert st["top_means"] == pytest.approx([0.5, 0.4 / 3])
    assert st["mean_items_active_top100"] == pytest.approx((1.0 + 1 / 3) / 2)
    # grounded mass: 0.4/0.9, 0.3/0.8, 0.5/0.7
    assert st["grounding_mass_share"] == pytest.approx(np.mean([0.4 / 0.9, 0.3 / 0.8, 0.5 / 0.7]))
    assert st["distinct_active_tokens"] == 4
    assert st["top_values"].shape == (3, 2)


def test_cached_codes_equal_direct_encoding(bert_dir: Path) -> None:
    model = VDRModel.from_bert(bert_dir, image_dim=5, text_top_k=8, image_top_k=8)
    codes = VDRCodes(model, 8)
    texts = ["a photo of a cat and a dog", "red car", "the tree with a blue car"]
    for k in (2, 5, 8):
        direct = model.encode_text(texts, top_k=k)
        assert (codes.texts(texts, k) != direct).nnz == 0
    patches = np.random.default_rng(0).normal(size=(6, 3, 5)).astype(np.float32)
    codes.encode_items(patches, None)
    assert (codes.items(3) != model.encode_image(patches, top_k=3)).nnz == 0
    part = VDRCodes(model, 8)
    part.encode_items(patches, None, rows=np.array([1, 4]))
    full = codes.items(8).toarray()
    assert np.allclose(part.items(8).toarray()[[1, 4]], full[[1, 4]])
    assert part.items(8)[[0, 2, 3, 5]].nnz == 0


@pytest.mark.slow  # trains and benchmarks VDR end to end (CONTRIBUTING.md)
def test_run_vdr_bench_end_to_end(bert_dir: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    col = tiny_collection(tmp_path / "col")
    patches, mask = proxy_patches(col)
    cfg = VDRRunConfig(
        steps=2,
        batch_size=4,
        ks=(3, 6),
        top_k=6,
        max_grid=1,
        calibration_size=8,
        methods=("avg_emb_0.5", "code_a", "paper"),
        bf16=False,
        init=str(bert_dir),
    )
    spec = {
        "collection": col,
        "text_encoder": KeywordEncoder(keywords=KEYWORDS),
        "patches": patches,
        "patch_mask": mask,
        "examples": ["a cat and a dog"],
    }
    out = tmp_path / "out"
    metrics = run_vdr_bench(out, {"proxy": spec}, cfg)
    res = metrics["datasets"]["proxy"]
    assert set(res["k_ablation"]) == {"3", "6"}
    assert res["k_ablation"]["3"]["sparse_retrieval"]["nnz_image"] <= 3
    assert {"vdr", "vdr_nobow"} == set(res["laziness"])
    assert (
        "code_a" in res["main"]["means"]["all"]
        and "paper_vdr_main" in res["zero_shot"]["means"]["all"]
    )
    assert res["training"]["vdr"]["calibration"]["text"] != 0
    for st in res["laziness"].values():
        assert (out / "proxy" / st["plots"]["cloud"]).is_file()
        assert (out / "proxy" / st["plots"]["box"]).is_file()
    hits = res["examples"][0]["hits"]
    assert hits and all(h["max_abs_gap"] < 1e-5 for h in hits)
    report = (out / "report.md").read_text()
    assert "Effectiveness vs active dimensions" in report and "VDR: `paper`" in report
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["datasets"]["proxy"]["k_ablation"]["6"]["means"] == json.loads(
        json.dumps(res["k_ablation"]["6"]["means"])
    )
    # a second run reuses the trained model (its final checkpoint) instead of training again
    from sparsemm_experiments.vdr_runs import train_or_load

    data = cross_modal_data(col, "train", patches, mask)
    model, info = train_or_load(out / "proxy" / "vdr", data, cfg, bow=True)
    saved_model = VDRModel.from_pretrained(out / "proxy" / "vdr")
    assert info["calibration"] == res["training"]["vdr"]["calibration"]
    for k, v in saved_model.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k


def test_cli_registration_and_train(bert_dir: Path, tmp_path: Path) -> None:
    from sparsemm_experiments.cli.bench_vdr import register_bench
    from sparsemm_experiments.cli.train_vdr import register_model

    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers(dest="verb")
    register_model(verbs.add_parser("train").add_subparsers(dest="model"))
    register_bench(verbs.add_parser("bench").add_subparsers(dest="benchmark"))
    col = tiny_collection(tmp_path / "col", 16)
    args = parser.parse_args(
        [
            "train",
            "vdr",
            str(tmp_path / "col"),
            "-o",
            str(tmp_path / "m"),
            "--init",
            str(bert_dir),
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--top-k",
            "6",
            "--image-input",
            "captions",
            "--no-progress",
        ]
    )
    assert args.func(args) == 0
    model = VDRModel.from_pretrained(tmp_path / "m")
    assert model.config.image_dim == col.text_dim and model.config.text_top_k == 6
    args = parser.parse_args(
        ["bench", "vdr", "-o", str(tmp_path / "b"), "--no-proxy", "--no-collages"]
    )
    with pytest.raises(SparsemmError, match="no collection"):
        args.func(args)
    args = parser.parse_args(["bench", "vdr", "-o", str(tmp_path / "b"), "--proxy", str(tmp_path)])
    with pytest.raises(SparsemmError, match="not a collection"):
        args.func(args)
