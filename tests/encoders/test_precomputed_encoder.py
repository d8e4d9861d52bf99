"""PrecomputedEncoder: row lookup by id in a .npy table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparsemm.encoders.base import get_encoder
from sparsemm.encoders.precomputed import PrecomputedEncoder
from sparsemm.errors import SparsemmError

IDS = ["a", "b", "c", "d"]


@pytest.fixture
def table() -> np.ndarray:
    return np.arange(12, dtype=np.float32).reshape(4, 3) + 1.0


def test_lookup_from_files(tmp_path, table) -> None:
    np.save(tmp_path / "emb.npy", table)
    (tmp_path / "ids.txt").write_text("\n".join(IDS) + "\n")
    (tmp_path / "ids.json").write_text(json.dumps(IDS))
    for ids_file in ("ids.txt", "ids.json"):
        enc = PrecomputedEncoder(tmp_path / "emb.npy", tmp_path / ids_file)
        assert enc.dim == 3 and enc.name == "precomputed"
        raw = enc.encode_text(["c", "a"], normalize=False)
        np.testing.assert_array_equal(raw, table[[2, 0]])
        assert raw.dtype == np.float32
        unit = enc.encode_image(["d"])
        np.testing.assert_allclose(unit, table[[3]] / np.linalg.norm(table[3]), rtol=1e-6)
        assert enc.encode_text([]).shape == (0, 3)


def test_from_array_and_registry(tmp_path, table) -> None:
    enc = PrecomputedEncoder(table, IDS)
    np.testing.assert_array_equal(enc.encode_text(["b"], normalize=False), table[[1]])
    np.save(tmp_path / "vec.npy", table)
    (tmp_path / "vec.ids.txt").write_text("\n".join(IDS))
    reg = get_encoder("precomputed", model=str(tmp_path / "vec.npy"))
    np.testing.assert_array_equal(reg.encode_image(["a", "d"]), enc.encode_image(["a", "d"]))
    with pytest.raises(SparsemmError, match="needs an embeddings"):
        get_encoder("precomputed")


def test_unknown_ids_listed(table) -> None:
    enc = PrecomputedEncoder(table, IDS)
    with pytest.raises(SparsemmError, match=r"3 id\(s\) not in .*'x', 'y', 'z'"):
        enc.encode_text(["a", "x", "y", "z"])


def test_validation(tmp_path, table) -> None:
    bad = table.copy()
    bad[1, 2] = np.nan
    with pytest.raises(SparsemmError, match="NaN"):
        PrecomputedEncoder(bad, IDS)
    with pytest.raises(SparsemmError, match="2-D"):
        PrecomputedEncoder(table[0], ["a"])
    with pytest.raises(SparsemmError, match="3 ids for 4 rows"):
        PrecomputedEncoder(table, IDS[:3])
    with pytest.raises(SparsemmError, match="duplicate ids"):
        PrecomputedEncoder(table, ["a", "b", "a", "c"])
    np.save(tmp_path / "lonely.npy", table)
    with pytest.raises(SparsemmError, match="no ids given"):
        PrecomputedEncoder(tmp_path / "lonely.npy")
    with pytest.raises(SparsemmError, match="not found"):
        PrecomputedEncoder(tmp_path / "missing.npy", IDS)
    enc = PrecomputedEncoder(table, IDS, modalities=("image",))
    with pytest.raises(SparsemmError, match="image only"):
        enc.encode_text(["a"])
