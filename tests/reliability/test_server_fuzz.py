"""Fuzzing the HTTP API and its inputs; structured errors; bounded per-query memory.

* schemathesis generates requests from the app's own OpenAPI schema (valid and invalid
  parameters, a bounded number per operation) and checks every answer: never a 5xx, status
  codes and bodies as documented, JSON content type, response headers.
* hypothesis feeds arbitrary text and term lists to ``build_query``: a Query or a
  SparsemmError, nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from webtoy import WebKeywordEncoder

import sparsemm.web.service as web_service
from sparsemm.errors import SparsemmError
from sparsemm.query.parse import MAX_QUERY_CHARS
from sparsemm.query.request import build_query
from sparsemm.query.searcher import Searcher
from sparsemm.web.app import create_app

pytestmark = pytest.mark.slow  # schema and property fuzzing of the API (CONTRIBUTING.md)

LOCAL = {"host": "127.0.0.1"}


@pytest.fixture(scope="module")
def app(toy_collection: Path) -> FastAPI:
    return create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()))


def test_api_against_its_openapi_schema(app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", app, headers=LOCAL)
    operations = [op.ok() for op in schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in operations} == {
        ("GET", "/api/health"),
        ("GET", "/api/search"),
        ("POST", "/api/search"),
        ("POST", "/api/search/image"),
        ("GET", "/api/items/{item_id}/explain"),
        ("GET", "/api/dims/{dim}"),
    }
    statuses: Counter[int] = Counter()
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if mode is GenerationMode.NEGATIVE and op.path == "/api/health":
                continue  # no parameters to get wrong

            @settings(
                max_examples=10,
                deadline=None,
                derandomize=True,  # the same requests every run
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def check(case: Any) -> None:
                # positive_data_acceptance is left out: the schema cannot say that a query
                # needs an include term or that a term must mean something to the model, so
                # some schema-valid requests are rightly refused with a documented 400.
                response = case.call_and_validate(
                    headers=LOCAL,
                    excluded_checks=[schemathesis.checks.positive_data_acceptance],
                )
                statuses[response.status_code] += 1

            check()
    assert statuses[200] and statuses[400] and statuses[404], statuses
    assert not [code for code in statuses if code >= 500], statuses


def test_schema_documents_the_error_responses(app: FastAPI) -> None:
    spec = app.openapi()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert "422" not in codes, (method, path)
            assert {"200", "400", "404", "413", "500"} <= codes, (method, path)
            ref = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorOut")


@settings(max_examples=300, deadline=None)
@given(
    q=st.text(max_size=MAX_QUERY_CHARS + 20),
    include=st.lists(st.text(max_size=40), max_size=20),
    exclude=st.lists(st.text(max_size=40), max_size=20),
)
def test_build_query_gives_a_query_or_a_sparsemm_error(
    q: str, include: list[str], exclude: list[str]
) -> None:
    try:
        query = build_query(q, include, exclude)
    except SparsemmError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert query.include or query.exclude
        assert not set(query.include) & set(query.exclude)
        assert len(query.include) <= 16 and len(query.exclude) <= 16


# --------------------------------------------------------------------- structured errors


@pytest.fixture()
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def test_unexpected_failures_are_json_500_without_details(
    app: FastAPI, client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(app.state.service.searcher, "answer", boom)
    resp = client.get("/api/search", params={"q": "dog"})
    assert resp.status_code == 500
    assert resp.json() == {"error": "internal server error; see the server log"}
    assert resp.headers["content-type"] == "application/json"
    assert "secret" not in resp.text
    assert any("secret internal detail" in r.exc_text for r in caplog.records if r.exc_text)


def test_query_caches_stay_bounded(
    app: FastAPI, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of distinct queries (an attacker's, or a busy site's) cannot grow the
    strategy context's per-text caches without bound."""
    monkeypatch.setattr(web_service, "MAX_CACHE_BYTES", 20_000)
    monkeypatch.setattr(web_service, "CACHE_CHECK_EVERY", 5)
    ctx = app.state.service.searcher.context
    sizes = []
    for i in range(60):
        resp = client.get("/api/search", params={"q": f"dog {i} but not cat {i}"})
        assert resp.status_code == 200, resp.text
        sizes.append(sum(web_service._nbytes(c) for c in ctx.query_caches()))
    assert max(sizes) < 20_000 + 6 * max(sizes[:4])  # budget + at most one check interval
    assert min(sizes[10:]) < sizes[3]  # it was cleared, more than once
    hits = client.get("/api/search", params={"q": "dog but not cat"}).json()["hits"]
    assert hits and hits[0]["id"] in ("d1", "d2")  # still answering right after clearing
