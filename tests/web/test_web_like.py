"""Image queries ("more like this, but not X"), thumbnails and violation marks on the toy
collection (webtoy): the API, the Searcher and the CLI's --like."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image
from webtoy import ITEMS, NO_IMAGE, StripeImageEncoder, WebKeywordEncoder, draw

from sparsemm.cli.main import main
from sparsemm.errors import SparsemmError
from sparsemm.query.searcher import Searcher
from sparsemm.web.app import create_app
from sparsemm.web.images import MAX_UPLOAD_BYTES
from sparsemm.web.service import violations


@pytest.fixture(scope="module")
def searcher(web_collection: Path) -> Searcher:
    return Searcher(web_collection, encoder=WebKeywordEncoder(), image_encoder=StripeImageEncoder())


@pytest.fixture()
def client(searcher: Searcher) -> Iterator[TestClient]:
    with TestClient(create_app(searcher=searcher), base_url="http://127.0.0.1") as c:
        yield c


def png(objs: list[str], tmp_path: Path) -> bytes:
    path = tmp_path / "query.png"
    draw(objs, path)
    return path.read_bytes()


def test_search_like_item_ranks_by_its_code_with_exclusions(searcher: Searcher) -> None:
    hits = searcher.search_like("dc1", k=24, strategy="filter")
    assert hits[0].id in {"dc1", "dc2"}  # the item itself (or its twin) first
    # filter drops every item carrying cat; the rest share the dog concept
    left = searcher.search_like("dc1", exclude=("cat",), k=24, strategy="filter")
    assert left and all("cat" not in ITEMS[h.id] for h in left)
    assert {h.id for h in left[:3]} <= {i for i, o in ITEMS.items() if "dog" in o}
    # the served default scores the same pseudo term: the item itself on top
    assert searcher.search_like("db1", k=3)[0].id in {"db1", "db2"}
    # the code does not stay behind for typed queries
    codes = searcher.text_context.query_caches()[1]
    assert not any(t.startswith("a photo of a like") for t in codes)


def test_search_like_errors(searcher: Searcher, tmp_path: Path) -> None:
    with pytest.raises(SparsemmError, match="no item 'nope'"):
        searcher.search_like("nope")
    with pytest.raises(SparsemmError, match="dense"):
        searcher.search_like("d1", strategy="dense_a")
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(SparsemmError, match="could not read the query image"):
        searcher.search_like(str(bad))


def test_api_like_item_and_violation_marks(client: TestClient) -> None:
    r = client.get("/api/search", params={"like": "db1", "q": "but not cat", "strategy": "filter"})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["like"] == "item db1" and data["query"]["exclude"] == ["cat"]
    assert data["total"] == len(ITEMS)
    assert not {h["id"] for h in data["hits"]} & {i for i, o in ITEMS.items() if "cat" in o}
    # the soft default may keep an item carrying an excluded term: it is marked
    r = client.get("/api/search", params={"q": "dog", "exclude": "ball", "strategy": "code_a"})
    marked = {h["id"]: h["violations"] for h in r.json()["hits"]}
    assert marked["db1"] == ["ball"] and marked["d1"] == []
    assert violations(["t-shirt", "Person"], ["t-shirts", "person", "dog"]) == [
        "t-shirts",
        "person",
    ]
    # the plurals the detectors and captions read (sparsemm.text.singular), not a bare 's'
    assert violations(["sky", "bus", "glass"], ["skies", "buses", "glasses", "dogs"]) == [
        "skies",
        "buses",
        "glasses",
    ]
    # more like an item, nothing left out
    r = client.get("/api/search", params={"like": "db1"})
    assert r.status_code == 200 and r.json()["hits"][0]["id"] in {"db1", "db2"}
    # errors: unknown id, an include term with like
    r = client.get("/api/search", params={"like": "nope"})
    assert r.status_code == 404 and r.json() == {"error": "unknown item id"}
    r = client.get("/api/search", params={"like": "d1", "q": "cat"})
    assert r.status_code == 400 and "only takes terms to leave out" in r.json()["error"]
    # the explanation of a like-query's hit: the concepts it shares with the item
    r = client.get("/api/items/d3/explain", params={"like": "db1", "exclude": "ball"})
    assert r.status_code == 200, r.text
    assert r.json()["matched"][0]["words"][0] == "dog"


def test_api_image_upload(client: TestClient, tmp_path: Path) -> None:
    body = png(["pizza", "car"], tmp_path)
    r = client.post(
        "/api/search/image", params={"exclude": "car", "strategy": "filter"}, content=body
    )
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["like"] == "uploaded image"
    got = [h["id"] for h in data["hits"]]
    assert got and set(got[:3]) <= {"p1", "p2", "p3"}  # pizza, never a car
    r = client.post("/api/search/image", content=b"hello, not an image")
    assert r.status_code == 400 and "not an image" in r.json()["error"]
    r = client.post("/api/search/image", content=b"")
    assert r.status_code == 400
    r = client.post("/api/search/image", content=b"\0" * (MAX_UPLOAD_BYTES + 1))
    assert r.status_code == 413
    # a small file that decodes to too many pixels
    out = io.BytesIO()
    Image.new("1", (8000, 6000)).save(out, format="PNG")
    r = client.post("/api/search/image", content=out.getvalue())
    assert r.status_code == 400 and "megapixels" in r.json()["error"]
    # the JSON search keeps its small body limit
    r = client.post("/api/search", content=b"{" + b" " * 70_000 + b"}")
    assert r.status_code == 413


def test_thumbnails(client: TestClient) -> None:
    hit = client.get("/api/search", params={"q": "dog", "k": 24}).json()["hits"]
    by_id = {h["id"]: h for h in hit}
    assert by_id["d1"]["thumb"] == "/thumbs/d1"
    assert by_id[NO_IMAGE[0]]["thumb"] is None
    r = client.get("/thumbs/d1")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    img = Image.open(io.BytesIO(r.content))
    assert max(img.size) <= 256
    assert client.get("/thumbs/d1").content == r.content  # cached
    assert client.get("/thumbs/nope").status_code == 404
    assert client.get("/thumbs/r3").status_code == 404  # references a text file


def test_cli_like(web_collection: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["search", "--like", "db1", str(web_collection), "but not ball", "--json"]
    assert main([*argv, "--strategy", "filter", "-k", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["like"] == "db1" and out["query"]["exclude"] == ["ball"]
    assert out["hits"] and all("ball" not in h["labels"] for h in out["hits"])
    # --like anywhere: after the collection, or after the query
    for argv in (
        ["search", str(web_collection), "--like", "db1", "but not ball", "--json"],
        ["search", str(web_collection), "but not ball", "--like", "db1", "--json"],
    ):
        assert main([*argv, "--strategy", "filter", "-k", "5"]) == 0
        assert json.loads(capsys.readouterr().out)["hits"] == out["hits"]
    # more like an item with nothing left out: no query text at all
    assert main(["search", str(web_collection), "--like", "db1", "--json", "-k", "3"]) == 0
    bare = json.loads(capsys.readouterr().out)
    assert bare["query"]["exclude"] == [] and bare["hits"][0]["id"] in {"db1", "db2"}
    with pytest.raises(SystemExit):  # a third positional is still an error
        main(["search", str(web_collection), "--like", "db1", "no ball", "extra"])
    capsys.readouterr()
    assert main(["search", "--like", "nope", str(web_collection)]) != 0
    err = capsys.readouterr().err
    assert "no item 'nope'" in err and "no picture file at that path" in err
    assert main(["search", "--like", "d1", str(web_collection), "cat"]) != 0
    assert "only takes terms to leave out" in capsys.readouterr().err  # the API's message


def test_like_an_item_but_not_what_it_carries_leaves_the_item_out(searcher: Searcher) -> None:
    """It used to rank first: its own code matches itself best, whatever it carries."""
    hits = searcher.search_like("db1", exclude=("ball",), k=5)
    assert hits and "db1" not in [h.id for h in hits]
    # a full page at consecutive ranks, and the next page follows on
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    more = searcher.search_like("db1", exclude=("ball",), k=3, offset=2)
    assert [h.rank for h in more] == [3, 4, 5][: len(more)]
    assert [h.id for h in more[:3]] == [h.id for h in hits[2:5]]
    # without the exclusion, or excluding what it does not carry, it stays
    assert searcher.search_like("db1", k=5)[0].id in {"db1", "db2"}
    assert "db1" in [h.id for h in searcher.search_like("db1", exclude=("car",), k=5)]
