"""Probes of a red-team pass that found things going wrong in silence: malformed manifest
counts, edited model settings, a benchmark on a collection of photos, changed or truncated
segment files under a running server, forms of many parts and uploads just under the cap."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reltools import index_version

from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.query.searcher import Searcher


@pytest.fixture()
def index_root(tmp_path: Path) -> Path:
    codes, ids = index_version(1, 500)
    InvertedIndex.build(tmp_path / "idx", codes, ids, meta={"top_k": 8, "model": "m"})
    return tmp_path / "idx"


@pytest.mark.parametrize("count", [None, [1], math.nan, "500", -1, True])
def test_a_manifest_count_that_is_not_a_count_is_one_error(index_root: Path, count: Any) -> None:
    manifest = json.loads((index_root / "manifest.json").read_text())
    manifest["count"] = count
    (index_root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SparsemmError, match=r"manifest\.json has no valid item count"):
        InvertedIndex.open(index_root)


def test_edited_model_settings_are_refused(toy_root: Path, tmp_path: Path) -> None:
    """The index records the checksum of its model's settings (config.json without the
    weights checksum): an edit after indexing is named, not served."""
    from webtoy import WebKeywordEncoder

    root = tmp_path / "toy"
    shutil.copytree(toy_root, root, symlinks=True)
    from sparsemm.query.indexing import build_index

    build_index(root / "col", root / "sr", overwrite=True)  # the model at its new place
    Searcher(root / "col", encoder=WebKeywordEncoder())
    config = root / "sr" / "config.json"
    cfg = json.loads(config.read_text())
    config.write_text(json.dumps({**cfg, "top_k": cfg["top_k"] + 1}))
    with pytest.raises(SparsemmError, match=r"config\.json changed since the index"):
        Searcher(root / "col", encoder=WebKeywordEncoder())
    config.write_text(json.dumps(cfg, indent=1))  # the same settings, written otherwise
    Searcher(root / "col", encoder=WebKeywordEncoder())


def test_the_model_loader_checks_the_settings_an_index_recorded(toy_root: Path) -> None:
    """load_code_model refuses, itself, a model whose settings changed since an index
    recorded them, saying what to do: every caller that opens a model for an index gets
    the check (its refusal of other encoders is
    tests/query/test_searcher.py::test_models_trained_on_other_encoders_are_refused)."""
    from sparsemm.models.base import config_digest
    from sparsemm.query.code_models import SettingsChanged, load_code_model

    model = toy_root / "sr"
    load_code_model(model, config_sha256=config_digest(model))
    with pytest.raises(SettingsChanged, match=r"config\.json changed since the index.*restore"):
        load_code_model(model, config_sha256="0" * 64)


def test_the_load_benchmark_queries_a_collection_without_labels_or_captions(
    tmp_path: Path,
) -> None:
    """`benchmarks/load.py` on a `sparsemm up` collection once failed with "need at least
    two terms": it now queries the index's concept names."""
    from load import collection_terms, search_paths

    from sparsemm.data.collection import write_collection

    items = [{"id": f"p{i}"} for i in range(6)]
    write_collection(tmp_path / "col", items, {"name": "e", "dim": 3},
                     image_emb=np.eye(6, 3, dtype=np.float32) + 0.1)  # fmt: skip
    codes = np.zeros((6, 3), np.float32)
    codes[:4, 0] = codes[2:, 1] = codes[5, 2] = 1.0
    labels = {"data": [["tabby"], ["coffee mug"], ["person (face)"]], "spine": []}
    import scipy.sparse as sp

    InvertedIndex.build(tmp_path / "col" / "index", sp.csr_matrix(codes),
                        [f"p{i}" for i in range(6)], meta={"labels": labels})  # fmt: skip
    terms = collection_terms(tmp_path / "col")
    assert terms == ["tabby", "coffee mug"]
    assert len(search_paths(terms, n=4)) == 4


def _segment_file(root: Path, name: str) -> Path:
    return next(p for p in root.iterdir() if p.name.startswith("seg-")) / name


def test_a_same_size_overwrite_of_a_live_segment_is_503_until_restored(
    toy_root: Path, tmp_path: Path
) -> None:
    """row_vals.npy overwritten in place with shuffled (or NaN) values of the same size once
    gave 200 with wrong hits and health "ok" while a fresh process refused the index."""
    from fastapi.testclient import TestClient
    from webtoy import WebKeywordEncoder

    from sparsemm.web.app import create_app

    col = tmp_path / "col"
    shutil.copytree(toy_root / "col", col)
    app = create_app(searcher=Searcher(col, encoder=WebKeywordEncoder()))
    app.state.service.check_every = 0.0
    target = _segment_file(col / "index", "row_vals.npy")
    original = target.read_bytes()
    values = np.load(target)
    header = len(original) - values.nbytes
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        first = client.get("/api/search", params={"q": "dog"})
        assert first.status_code == 200
        for bad in (values[::-1].copy(), np.full_like(values, np.nan)):
            with target.open("r+b") as fh:  # in place, as `cp` or `rsync --inplace` would
                fh.seek(header)
                fh.write(bad.tobytes())
            assert target.stat().st_size == len(original)
            r = client.get("/api/search", params={"q": "dog"})
            assert r.status_code == 503, r.text
            assert "row_vals.npy" in r.json()["error"] and "checksum" in r.json()["error"]
            assert client.get("/api/health").status_code == 503
        target.write_bytes(original)  # restored byte for byte: served again
        again = client.get("/api/search", params={"q": "dog"})
        assert again.status_code == 200 and again.json()["hits"] == first.json()["hits"]
        assert client.get("/api/health").json()["status"] == "ok"


_TRUNCATE_AND_SEARCH = """
import sys
import numpy as np
from pathlib import Path
from sparsemm.index import InvertedIndex

root = Path(sys.argv[1])
index = InvertedIndex.open(root, in_memory=sys.argv[2] == "memory")
seg = next(p for p in root.iterdir() if p.name.startswith("seg-"))
for f in sorted(seg.glob("*.npy")):
    with f.open("r+b") as fh:  # cut short in place while open, as another process might
        fh.truncate(128)
q = np.zeros(index.dim, np.float32)
q[:8] = 1.0
for _ in range(20):  # no check_files: a concurrent truncation right after a check
    index.search(q, k=10)
    index.codes(np.arange(len(index)))
print("alive")
"""


def test_segments_read_into_memory_survive_a_concurrent_truncation(tmp_path: Path) -> None:
    """A segment cut short in place between the server's check and its read once ended the
    server with SIGBUS (6 of 8 runs). The server reads segments into memory: a truncation
    cannot reach them. (Mapped, the same script dies of SIGBUS: the control.)"""
    import os
    import signal
    import subprocess
    import sys

    from reltools import SRC

    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for mode in ("memory", "mapped"):
        codes, ids = index_version(1, 3000)
        root = tmp_path / mode
        InvertedIndex.build(root, codes, ids)
        run = subprocess.run(
            [sys.executable, "-c", _TRUNCATE_AND_SEARCH, str(root), mode],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if mode == "memory":
            assert run.returncode == 0 and "alive" in run.stdout, run.stderr
        else:
            assert run.returncode == -signal.SIGBUS, (run.returncode, run.stderr[-500:])


def test_the_server_reads_its_segments_into_memory(toy_root: Path) -> None:
    from webtoy import WebKeywordEncoder

    from sparsemm.web.app import create_app

    searcher = Searcher(toy_root / "col", encoder=WebKeywordEncoder())
    assert not searcher.index.in_memory
    app = create_app(searcher=searcher)
    index = app.state.service.searcher.index
    assert index.in_memory
    for seg in index._segments:
        for arr in seg.stored:
            assert not isinstance(arr, np.memmap) and not isinstance(arr.base, np.memmap)


def _tiny_part_form(limit: int) -> tuple[bytes, int]:
    """A form of as many tiny text parts as fit in ``limit`` bytes (and the count)."""
    part = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n'
    n = (limit - 8) // len(part)
    return part * n + b"--b--\r\n", n


def test_a_form_of_many_tiny_parts_is_refused_at_once_and_health_stays_fast(
    toy_root: Path,
) -> None:
    """A form of 161,300 tiny parts (8 MiB) once held the event loop 70 s (/api/health took
    69.6 s): a form may hold 16 parts, and it is parsed off the event loop."""
    import http.client
    import threading
    import time

    from load import serve_in_thread
    from webtoy import WebKeywordEncoder

    from sparsemm.web import images
    from sparsemm.web.app import create_app

    body, n = _tiny_part_form(images.MAX_UPLOAD_BYTES)
    assert n > 160_000
    t0 = time.perf_counter()
    with pytest.raises(SparsemmError, match="more than 16 parts"):
        images.upload_bytes(body, "multipart/form-data; boundary=b")
    assert time.perf_counter() - t0 < 0.5
    app = create_app(searcher=Searcher(toy_root / "col", encoder=WebKeywordEncoder()))
    with serve_in_thread(app) as port:
        answers: list[int] = []

        def post() -> None:
            for _ in range(4):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                form = {"content-type": "multipart/form-data; boundary=b"}
                conn.request("POST", "/api/search/image", body=body, headers=form)
                answers.append(conn.getresponse().status)
                conn.close()

        poster = threading.Thread(target=post)
        poster.start()
        slowest = 0.0
        while poster.is_alive():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            t0 = time.perf_counter()
            conn.request("GET", "/api/health")
            assert conn.getresponse().status == 200
            slowest = max(slowest, time.perf_counter() - t0)
            conn.close()
        poster.join()
    assert answers == [400] * 4
    assert slowest < 1.0, slowest
