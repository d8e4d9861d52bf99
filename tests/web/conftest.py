"""Fixtures for the web tests: the toy collection of :mod:`webtoy`, indexed, and an app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from webtoy import WebKeywordEncoder, make_collection, make_sr

from sparsemm.query.indexing import build_index
from sparsemm.query.searcher import Searcher

pytest.importorskip("fastapi", reason="the web extra (fastapi) is not installed")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx")

from fastapi import FastAPI
from fastapi.testclient import TestClient

from sparsemm.web.app import create_app


@pytest.fixture(scope="session")
def web_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("web")
    col = make_collection(root)
    build_index(col, make_sr(root))
    return root


@pytest.fixture(scope="session")
def web_collection(web_root: Path) -> Path:
    return web_root / "col"


@pytest.fixture(scope="session")
def web_app(web_collection: Path) -> FastAPI:
    return create_app(searcher=Searcher(web_collection, encoder=WebKeywordEncoder()))


@pytest.fixture()
def client(web_app: FastAPI) -> Iterator[TestClient]:
    # A loopback Host header: the app refuses other host names.
    with TestClient(web_app, base_url="http://127.0.0.1") as c:
        yield c
