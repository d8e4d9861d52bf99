"""Bad queries: empty, whitespace-only (including invisible characters), too long, malformed,
out-of-range k / offset, and terms the model knows nothing about, through the CLI (one line,
exit 2) and the HTTP API (400 with a JSON error)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from webtoy import ITEMS, WebKeywordEncoder

from sparsemm.query.searcher import Searcher
from sparsemm.web.app import create_app

CLI_CASES = [
    # (argv after the collection, what the error says)
    ([""], "empty query"),
    (["  \t "], "empty query"),
    (["\u200b\u2060\u200b"], "empty query"),  # zero-width characters only
    (["x" * 600], "600 characters long; the limit is 512"),
    (["but not"], "'but not' is not followed"),
    (["dog -dog"], "'dog' is both included and excluded"),
    (['dog -"'], "must be followed by the term to exclude"),
    (["dog but not"], "'but not' is not followed by a term to exclude"),
    (["dog", "--exclude", " , "], "empty excluded term"),
    (["dog", "-k", "0"], "-k must be a whole number of at least 1"),
    (["dog", "-k", "-3"], "-k must be a whole number of at least 1"),
    (["dog", "--offset", "-1"], "--offset must be a whole number of 0 or more"),
    (["dog", "--strategy", "nope"], "unknown strategy 'nope'"),
]


@pytest.mark.parametrize(("argv", "message"), CLI_CASES)
def test_cli_refuses_bad_queries_on_one_line(
    toy_collection: Path, cli: Any, argv: list[str], message: str
) -> None:
    cli("search", str(toy_collection), *argv).one_line_error(message)


def test_cli_huge_k_and_control_characters_are_fine(toy_collection: Path, cli: Any) -> None:
    res = cli("search", str(toy_collection), "dog\x00 but not\x1b cat", "-k", str(10**9))
    assert res.code == 0, res.err
    assert res.out.startswith("query: dog  but not: cat")
    assert "\x1b" not in res.out and "\x00" not in res.out
    lines = [ln.split() for ln in res.out.splitlines()[1:]]
    hits = [w[1] for w in lines if w[0] != "also:"]  # a hit's other paths are its own line
    assert hits[0] in ("d1", "d2")
    # The default scorer ranks every item with a cat below every dog-only item.
    cats = [i for i, h in enumerate(hits) if "cat" in ITEMS[h]]
    dogs = [i for i, h in enumerate(hits) if "dog" in ITEMS[h] and "cat" not in ITEMS[h]]
    assert dogs and (not cats or max(dogs) < min(cats))


@pytest.mark.parametrize("query", ["qwerty", "dog but not qwerty"])
def test_cli_names_terms_the_model_does_not_know(
    toy_collection: Path, cli: Any, query: str
) -> None:
    cli("search", str(toy_collection), query).one_line_error("'qwerty' matches no concept")


# ------------------------------------------------------------------------------------ HTTP


@pytest.fixture(scope="module")
def client(toy_collection: Path) -> Iterator[TestClient]:
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"q": "qwerty"}, "'qwerty' matches no concept of this collection's model, so it "
                          "cannot search for anything; check the spelling"),
        ({"q": "dog but not qwerty"}, "'qwerty' matches no concept of this collection's model, "
                                      "so it cannot exclude anything"),
        ({"q": "dog", "exclude": "zzz"}, "'zzz' matches no concept"),
        ({"q": "dog, blorp"}, "'blorp' matches no concept"),
        ({"q": "qwerty", "strategy": "dense_a"}, "'qwerty' matches no concept"),
        ({"q": "\u200b \u200b"}, "type what to search for"),
        ({"q": "\u202e"}, "type what to search for"),
    ],
)  # fmt: skip
def test_api_names_unknown_and_invisible_terms(
    client: TestClient, params: dict[str, Any], message: str
) -> None:
    for resp in (client.get("/api/search", params=params), client.post("/api/search", json=params)):
        assert resp.status_code == 400, resp.text
        assert resp.json() == {"error": resp.json()["error"]} and message in resp.json()["error"]


def test_api_known_terms_still_work(client: TestClient) -> None:
    for strategy in ("filter", "dense_a", "penalty"):
        resp = client.get("/api/search", params={"q": "dog\x00 but not cat", "strategy": strategy})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["query"] == {"include": ["dog"], "exclude": ["cat"], "text": "dog -cat"}
        assert body["hits"][0]["id"] in ("d1", "d2")
        if strategy == "filter":
            assert not [h for h in body["hits"] if "cat" in ITEMS[h["id"]]]


def test_cli_invalid_utf8_in_a_query_is_one_line_naming_it(toy_collection: Path, cli: Any) -> None:
    """Bytes that are not UTF-8 reach Python's argv as lone surrogates ('\\udcff'). A
    red-team pass found a traceback here; then they counted as spaces, which searched
    Latin-1 "caf\\xe9" as "caf". They are refused, named as their bytes."""
    res = cli("search", str(toy_collection), "dog\udcff but not\udcff cat", "-k", "3")
    res.one_line_error("not UTF-8 text", "dog\\xff but not")
    res = cli("search", str(toy_collection), "\udcff\udcfe")
    res.one_line_error("not UTF-8 text")


def test_exclusion_only_queries_and_stray_quotes_are_searched_as_documented(
    toy_collection: Path, cli: Any, client: TestClient
) -> None:
    """reliability.md once listed an exclusion-only query and an unbalanced quote among the
    refused queries; neither is. "no dog" ranks by absence (README); a stray double quote
    is dropped and the words are searched as written. The table now says so."""
    body = client.get("/api/search", params={"q": "no dog", "k": 24}).json()
    assert body["query"]["include"] == [] and body["query"]["exclude"] == ["dog"]
    assert body["hits"] and not [h for h in body["hits"][:5] if "dog" in ITEMS[h["id"]]]
    res = cli("search", str(toy_collection), "no dog", "-k", "3")
    assert res.code == 0 and res.out.strip(), res.err
    plain = client.get("/api/search", params={"q": "dog but not cat"}).json()
    for stray in ('dog but not "cat', '"dog but not cat', "dog but not cat\u201d"):
        got = client.get("/api/search", params={"q": stray})
        assert got.status_code == 200, got.text
        assert got.json()["query"] == plain["query"] and got.json()["hits"] == plain["hits"]
        res = cli("search", str(toy_collection), stray, "-k", "3")
        assert res.code == 0, res.err
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    refused = next(line for line in doc.splitlines() if line.startswith("| empty, whitespace"))
    assert "only-excluding" not in refused and "unbalanced quote" not in refused
    assert "| a query that only excludes" in doc and "| an unbalanced double quote" in doc


def test_a_query_starting_with_a_dash_says_how_to_pass_it(
    toy_collection: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse takes "-dog" for an option; the error says how to search it."""
    from sparsemm.cli.main import main

    with pytest.raises(SystemExit):
        main(["search", str(toy_collection), "-dog"])
    assert "'--' before a query that starts with '-'" in capsys.readouterr().err


@pytest.mark.parametrize(("k", "offset"), [("3", 0), (2.5, 0), (True, 0), (3, "1"), (3, -1)])
def test_the_python_api_refuses_a_page_of_the_wrong_type(
    toy_collection: Path, k: Any, offset: Any
) -> None:
    """`search(k="3")` raised a TypeError from deep inside; a QueryRequest built by hand too."""
    from sparsemm.errors import SparsemmError
    from sparsemm.query.parse import parse_query
    from sparsemm.query.request import QueryRequest

    searcher = Searcher(toy_collection, encoder=WebKeywordEncoder())
    try:
        with pytest.raises(SparsemmError, match="must be"):
            searcher.search("dog", k=k, offset=offset)
        with pytest.raises(SparsemmError, match="must be"):
            QueryRequest(parse_query("dog"), k, offset)
        assert len(searcher.search("dog", k=np.int64(2), offset=np.int64(0))) == 2  # numpy ints
    finally:
        searcher.close()
