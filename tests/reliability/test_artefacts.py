"""Artefact safety: no pickle anywhere, ``weights_only=True`` wherever torch loads, and
versioned manifests that name the version problem.

The source scan walks the syntax tree of every module under src/sparsemm and benchmarks/,
so a new ``import pickle`` or a bare ``torch.load`` fails this test the day it is written.
"""

from __future__ import annotations

import ast
import json
import pickle  # only to write the hostile files these tests feed to the readers
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sparsemm.errors import SparsemmError
from sparsemm.io import load_csr, load_npy, save_npy
from sparsemm.words.spine import SparseWordVectors
from sparsemm.words.vectors import WordVectors, load_word_vectors, save_word_vectors

REPO = Path(__file__).resolve().parents[2]
SCANNED = [REPO / "src" / "sparsemm", REPO / "benchmarks"]
PICKLING_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "shelve"}
PICKLING_CALLS = {"to_pickle", "read_pickle"}


def dotted(node: ast.AST) -> str:
    """'torch.load' for ``torch.load``; '' when the callee is not a plain dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def keyword(call: ast.Call, name: str) -> Any:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else "<expr>"
    return "<missing>"


def violations(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    rel = path.relative_to(root)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom | ast.Call):
            continue
        where = f"{rel}:{node.lineno}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            module = getattr(node, "module", None) or ""
            bad = {n.split(".")[0] for n in [*names, module]} & PICKLING_MODULES
            if bad:
                found.append(f"{where}: imports {sorted(bad)}")
            if module == "torch" and {a.name for a in node.names} & {"load", "save"}:
                found.append(f"{where}: imports torch.load/save by name (unchecked calls)")
        elif isinstance(node, ast.Call):
            name = dotted(node.func)
            if name == "torch.load":
                if keyword(node, "weights_only") is not True:
                    found.append(f"{where}: torch.load without weights_only=True")
            elif name in ("torch.save", "torch.jit.save"):
                found.append(f"{where}: {name} writes a pickle; use safetensors")
            elif name.rsplit(".", 1)[-1] in PICKLING_CALLS:
                found.append(f"{where}: {name}")
            if keyword(node, "allow_pickle") not in ("<missing>", False):
                found.append(f"{where}: allow_pickle is not False")
    return found


def test_no_pickle_in_the_source() -> None:
    files = [p for root in SCANNED for p in sorted(root.rglob("*.py"))]
    assert len(files) > 40
    found = [v for f in files for v in violations(f)]
    assert not found, "\n".join(found)


def test_the_scan_catches_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nfrom joblib import dump\nimport torch, numpy as np\n"
        "torch.load('x')\ntorch.load('x', weights_only=False)\ntorch.save({}, 'x')\n"
        "np.load('x', allow_pickle=True)\ndf.to_pickle('x')\n"
        "torch.load('x', weights_only=True)\nnp.load('x', allow_pickle=False)\n"
        "from torch import load\n"
    )
    found = violations(bad, root=tmp_path)
    assert len(found) == 8, found


class Hostile:
    """Unpickling this object would create ``marker``: the payload must never run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (self.marker,))


def test_readers_refuse_pickled_payloads(tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    np.save(tmp_path / "obj.npy", np.array([Hostile(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(SparsemmError, match=r"not a plain \.npy array"):
        load_npy(tmp_path / "obj.npy")
    np.savez(tmp_path / "obj.npz", data=np.array([Hostile(marker)], dtype=object))
    with pytest.raises(SparsemmError, match=r"not a sparse-matrix \.npz"):
        load_csr(tmp_path / "obj.npz")
    (tmp_path / "raw.npy").write_bytes(pickle.dumps(Hostile(marker)))
    with pytest.raises(SparsemmError):
        load_npy(tmp_path / "raw.npy")
    torch.save({"weight": Hostile(marker)}, tmp_path / "weights.pth")
    from sparsemm.encoders.efficientnet_lite import load_state_dict

    with pytest.raises(SparsemmError, match="cannot load EfficientNet weights"):
        load_state_dict(tmp_path / "weights.pth")
    assert not marker.exists()
    with pytest.raises(SparsemmError, match="object array"):
        save_npy(tmp_path / "w.npy", np.array([object()], dtype=object))


def test_word_vector_manifests_are_versioned(tmp_path: Path) -> None:
    words = WordVectors(["a", "b"], np.eye(2, 3, dtype=np.float32))
    out = save_word_vectors(words, tmp_path / "wv")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(SparsemmError, match="newer sparsemm; upgrade"):
        load_word_vectors(out)
    (out / "manifest.json").write_text(json.dumps({**manifest, "format": "other"}))
    with pytest.raises(SparsemmError, match="not a saved word-vector folder"):
        load_word_vectors(out)

    import scipy.sparse as sp

    sparse = SparseWordVectors(["a", "b"], sp.csr_matrix(np.eye(2, 4, dtype=np.float32)))
    out = sparse.save(tmp_path / "spine")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(SparsemmError, match="newer sparsemm; upgrade"):
        SparseWordVectors.load(out)
