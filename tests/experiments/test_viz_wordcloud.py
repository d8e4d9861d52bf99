"""Word clouds: PNG written atomically, deterministic for a seed, clear errors on bad weights."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sparsemm.errors import SparsemmError
from sparsemm_experiments.viz.wordcloud import check_weights, concept_cloud, dimension_cloud

WEIGHTS = {"sneaker": 3.0, "shoe": 2.0, "running": 1.5, "lace": 1.0, "sole": 0.8, "trainer": 0.5}


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_concept_cloud_writes_png_of_the_requested_size(tmp_path: Path) -> None:
    out = concept_cloud(WEIGHTS, tmp_path / "sub" / "c.png", width=200, height=120)
    assert out == tmp_path / "sub" / "c.png"
    with Image.open(out) as im:
        assert im.format == "PNG"
        assert im.size == (200, 120)
    px = pixels(out)
    ink = (px < 200).any(axis=2).mean()  # share of non-background (white) pixels
    assert 0.02 < ink < 0.9
    assert sorted(p.name for p in out.parent.iterdir()) == ["c.png"]  # no temp file left


def test_concept_cloud_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    a = concept_cloud(WEIGHTS, tmp_path / "a.png", seed=3)
    b = concept_cloud(dict(WEIGHTS), tmp_path / "b.png", seed=3)
    c = concept_cloud(WEIGHTS, tmp_path / "c.png", seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert not np.array_equal(pixels(a), pixels(c))  # the seed drives layout and colours


@pytest.mark.parametrize(
    ("weights", "needle"),
    [
        ({}, "empty"),
        ({"bag": -1.0}, "'bag'"),
        ({"bag": 1.0, "tote": 0.0}, "'tote'"),
        ({"bag": math.nan}, "positive and finite"),
        ({"bag": math.inf}, "positive and finite"),
        ({"  ": 1.0}, "blank"),
    ],
)
def test_bad_weights_raise_a_clear_error(
    tmp_path: Path, weights: dict[str, float], needle: str
) -> None:
    with pytest.raises(SparsemmError, match=needle):
        concept_cloud(weights, tmp_path / "bad.png")
    assert not any(tmp_path.iterdir())  # nothing written, no temp file left


def test_check_weights_strips_and_merges() -> None:
    assert check_weights([(" bag ", 1.0), ("bag", 2.0), ("tote", 0.5)]) == {"bag": 2.0, "tote": 0.5}


def test_bad_size_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SparsemmError, match="size"):
        concept_cloud(WEIGHTS, tmp_path / "x.png", width=2, height=200)


def test_dimension_cloud_by_rank_and_by_score(tmp_path: Path) -> None:
    words = ["bag", "handbag", "purse", "tote", "strap"]
    ranked = dimension_cloud(words, None, tmp_path / "r.png", width=160, height=100)
    with Image.open(ranked) as im:
        assert im.size == (160, 100)
    scored = dimension_cloud(words, [5, 4, 3, 2, 1], tmp_path / "s.png", width=160, height=100)
    # Scores (5..1)/5 equal the rank weights, so both clouds are the same picture.
    assert np.array_equal(pixels(ranked), pixels(scored))
    with pytest.raises(SparsemmError, match="5 words but 2 scores"):
        dimension_cloud(words, [1.0, 2.0], tmp_path / "m.png")
    with pytest.raises(SparsemmError, match="'tote'"):
        dimension_cloud(words, [5, 4, 3, -2, 1], tmp_path / "n.png")
    with pytest.raises(SparsemmError, match="at least one word"):
        dimension_cloud([], None, tmp_path / "e.png")
