"""Probes of the issue-32 red-team pass, each refused in one line or answered right: index
metadata covered by a checksum, malformed manifests, a live segment cut short in place, a
server that reloads on any commit and says when searches fail, malformed source rows."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from reltools import index_version

from sparsemm.data.sources import read_captions_jsonl
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.query.searcher import Searcher


@pytest.fixture()
def index_root(tmp_path: Path) -> Path:
    codes, ids = index_version(1, 500)
    InvertedIndex.build(tmp_path / "idx", codes, ids, meta={"top_k": 8, "model": "m"})
    return tmp_path / "idx"


def _edit(root: Path, change: Any) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_edited_index_metadata_is_refused(index_root: Path, caplog: Any) -> None:
    _edit(index_root, lambda m: m["meta"].update(top_k=64))  # once changed results silently
    with pytest.raises(SparsemmError, match="does not match its checksum"):
        InvertedIndex.open(index_root)
    _edit(index_root, lambda m: m.pop("meta_sha256"))  # as an older sparsemm wrote it
    with caplog.at_level(logging.WARNING):
        assert InvertedIndex.open(index_root).meta["top_k"] == 64
    assert "records no checksum of its metadata" in caplog.text


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["segments"][0].update(count="many"),
        lambda m: m["segments"][0].pop("name"),
        lambda m: m["segments"][0].update(name=".."),
        lambda m: m["segments"].append(7),
        lambda m: m.update(meta=[1, 2]),
    ],
)
def test_malformed_manifests_are_one_error(index_root: Path, change: Any) -> None:
    _edit(index_root, change)
    with pytest.raises(SparsemmError, match=r"manifest\.json"):
        InvertedIndex.open(index_root)


def test_a_live_segment_cut_short_is_noticed_before_a_mapped_read(index_root: Path) -> None:
    index = InvertedIndex.open(index_root)
    index.check_files()  # intact
    seg = next(p for p in index_root.iterdir() if p.name.startswith("seg-"))
    target = seg / "row_vals.npy"
    data = target.read_bytes()
    with target.open("r+b") as fh:  # in place, as `cp` or `rsync --inplace` would
        fh.truncate(len(data) // 2)
    with pytest.raises(SparsemmError, match="changed size on disk while open"):
        index.check_files()


def test_malformed_dimension_labels_are_refused(toy_root: Path, tmp_path: Path) -> None:
    col = tmp_path / "col"
    shutil.copytree(toy_root / "col", col)
    from sparsemm.index.manifest import meta_digest

    def bad_labels(m: dict) -> None:
        m["meta"]["labels"] = {"data": "oops", "spine": []}
        m["meta_sha256"] = meta_digest(m["meta"])  # a writer's bug, not damage

    _edit(col / "index", bad_labels)
    with pytest.raises(SparsemmError, match="malformed dimension labels"):
        Searcher(col)


def test_the_server_reloads_on_any_commit_and_health_says_when_searches_fail(
    toy_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once: unreadable manifest (503), bad labels (500), original restored: still 500 while
    health said ok. Now the bad labels are refused (503) and the restored one is served."""
    from fastapi.testclient import TestClient
    from webtoy import WebKeywordEncoder

    from sparsemm.index.manifest import meta_digest
    from sparsemm.web.app import create_app

    col = tmp_path / "col"
    shutil.copytree(toy_root / "col", col)
    searcher = Searcher(col, encoder=WebKeywordEncoder())
    app = create_app(searcher=searcher)
    app.state.service.check_every = 0.0
    manifest = col / "index" / "manifest.json"
    original = manifest.read_bytes()
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        assert client.get("/api/search", params={"q": "dog"}).status_code == 200
        manifest.write_text("{not json")
        assert client.get("/api/search", params={"q": "dog"}).status_code == 503

        def bad(m: dict) -> None:
            m["meta"]["labels"] = {"data": 5}
            m["meta_sha256"] = meta_digest(m["meta"])

        m = json.loads(original)
        bad(m)
        manifest.write_text(json.dumps(m))
        assert client.get("/api/search", params={"q": "dog"}).status_code == 503
        manifest.write_bytes(original)  # restored byte for byte
        assert client.get("/api/search", params={"q": "dog"}).status_code == 200
        assert client.get("/api/health").json()["status"] == "ok"
        # a search failing for no fault of the request: health says so until one succeeds
        service = app.state.service

        def boom(*a: Any, **kw: Any) -> Any:
            raise RuntimeError("inside")

        monkeypatch.setattr(service.searcher, "answer", boom)
        assert client.get("/api/search", params={"q": "dog"}).status_code == 500
        health = client.get("/api/health").json()
        assert health["status"] == "failing" and "searches fail" in health["error"]
        monkeypatch.undo()
        assert client.get("/api/search", params={"q": "dog"}).status_code == 200
        assert client.get("/api/health").json()["status"] == "ok"
        # a live segment file cut short in place: 503 naming it, not a bus error
        seg = next(p for p in (col / "index").iterdir() if p.name.startswith("seg-"))
        target = seg / "row_vals.npy"
        size = target.stat().st_size
        with target.open("r+b") as fh:
            fh.truncate(size // 2)
        r = client.get("/api/search", params={"q": "dog"})
        assert r.status_code == 503 and "changed size on disk" in r.json()["error"]


def test_the_menu_offers_only_what_the_collection_runs(toy_root: Path) -> None:
    from webtoy import WebKeywordEncoder

    from sparsemm.query.strategies import available_strategies, get_spec

    s = Searcher(toy_root / "col", encoder=WebKeywordEncoder())
    offered = s.strategies()
    assert offered and set(offered) <= set(available_strategies())
    for name in offered:  # every one offered runs
        if get_spec(name).kind == "sparse" or s.dense is not None:
            s.search("dog but not cat", k=2, strategy=name)


def test_malformed_source_rows_are_one_error(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text('{"id": "a", "caption": "x", "deep": ' + "[" * 50_000 + "]" * 50_000 + "}\n")
    with pytest.raises(SparsemmError, match=r"c\.jsonl:1: JSON nested too deeply"):
        read_captions_jsonl(f)
    f.write_text('{"id": ' + "9" * 5000 + ', "caption": "x"}\n')
    with pytest.raises(SparsemmError, match=r"c\.jsonl:1: not valid JSON"):
        read_captions_jsonl(f)
    f.write_text('{"id": "a\\ud800", "caption": "x"}\n')
    with pytest.raises(SparsemmError, match="lone surrogate"):
        read_captions_jsonl(f)
    f.write_text(json.dumps({"id": "a", "caption": "word " * 4000}) + "\n")
    with pytest.raises(SparsemmError, match="the limit is 10,000"):
        read_captions_jsonl(f)
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "caption": "a dog"}).encode() + b"\n")
    assert read_captions_jsonl(f)[0]["captions"] == ["a dog"]  # a BOM, as a CSV may have


def test_deep_json_in_a_manifest_is_one_error(index_root: Path) -> None:
    (index_root / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SparsemmError, match="nested too deeply"):
        InvertedIndex.open(index_root)


def test_a_query_of_common_words_only_is_refused(toy_collection: Path, cli: Any) -> None:
    cli("search", str(toy_collection), "it is", "--no-server").one_line_error("only common words")
    emoji = cli("search", str(toy_collection), "\U0001f436 but not \U0001f431", "--no-server")
    emoji.one_line_error("no words, only symbols or emoji")


def test_paths_can_end_with_nul(toy_collection: Path, cli: Any) -> None:
    res = cli("search", str(toy_collection), "dog", "-f", "-z", "--no-server")
    assert res.code == 0 and res.out.endswith("\0") and "\n" not in res.out
    cli("search", str(toy_collection), "dog", "-z", "--no-server").one_line_error("with -f")
    np.testing.assert_equal(len(res.out.split("\0")) > 1, True)


def test_a_collection_without_checksums_says_it_is_not_verified(
    toy_root: Path, tmp_path: Path, caplog: Any
) -> None:
    from sparsemm.data.collection import open_collection

    col = tmp_path / "col"
    shutil.copytree(toy_root / "col", col)
    _edit(col, lambda m: m.pop("checksums"))
    with caplog.at_level(logging.WARNING):
        open_collection(col)
    assert "records no checksums" in caplog.text


def test_a_quote_glued_to_a_word_is_part_of_it() -> None:
    from sparsemm.query.parse import parse_query

    q = parse_query('dress but not t-"shirt"')  # once excluded "t" and searched "shirt"
    assert (q.include, q.exclude) == (("dress",), ("t-shirt",))
