"""The JSON API on the toy collection (webtoy): search, explain, dims, images, errors."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from PIL import Image
from webtoy import (
    COLOURS,
    ITEMS,
    MISSING_IMAGE,
    NO_IMAGE,
    NOT_AN_IMAGE,
    SECRET,
    WORDS,
    WebKeywordEncoder,
    dim_of,
    make_collection,
)

from sparsemm.errors import SparsemmError
from sparsemm.query.request import build_query
from sparsemm.query.searcher import Searcher
from sparsemm.web.app import create_app


def ids(resp) -> list[str]:
    assert resp.status_code == 200, resp.text
    return [h["id"] for h in resp.json()["hits"]]


def with_(*objs: str, without: tuple[str, ...] = ()) -> set[str]:
    """The toy items holding all of ``objs`` and none of ``without``."""
    return {i for i, o in ITEMS.items() if set(objs) <= set(o) and not set(without) & set(o)}


def test_health_and_page(client: TestClient) -> None:
    info = client.get("/api/health").json()
    assert info["status"] == "ok" and info["items"] == len(ITEMS) and info["dims"] == len(WORDS)
    assert info["images"] == len(ITEMS) - len(NO_IMAGE) - 2  # minus the txt and missing file
    assert "filter" in info["strategies"] and info["default_strategy"] == "hybrid"
    # the page's placeholder: a query this collection answers
    assert info["example"] and ids(client.get("/api/search", params={"q": info["example"]}))
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="include"' in page.text and 'id="exclude"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert client.get("/static/style.css").status_code == 200


def test_search_excludes_and_explains(client: TestClient) -> None:
    resp = client.get("/api/search", params={"q": "dog but not cat", "k": 20, "strategy": "filter"})
    dog_items = with_("dog", without=("cat",))
    got = ids(resp)
    assert dog_items <= set(got) and not with_("cat") & set(got)
    assert got[0] in {"d1", "d2"}  # the purest dog codes rank first
    body = resp.json()
    assert body["query"] == {"include": ["dog"], "exclude": ["cat"], "text": "dog -cat"}
    hit = next(h for h in body["hits"] if h["id"] == "db1")
    assert hit["image"] == "/images/db1" and hit["caption"] == "dog and ball"
    assert hit["labels"] == ["dog", "ball"] and hit["score"] > 0
    matched = {c["dim"]: c for c in hit["matched"]}
    assert matched[dim_of("dog")]["words"][0] == "dog"
    assert matched[dim_of("ball")]["words"][0] == "ball"  # the co-activated concept
    assert matched[dim_of("dog")]["weight"] > matched[dim_of("ball")]["weight"] > 0
    (check,) = hit["excluded"]
    assert check["term"] == "cat" and dim_of("cat") in check["dims"]
    assert check["item_mass"] == 0.0 and "cat" in check["words"]


def test_post_with_term_lists(client: TestClient) -> None:
    f = {"strategy": "filter"}  # the hard filter: exact sets
    resp = client.post("/api/search", json={"q": "dog", "exclude": ["cat, ball"], "k": 20, **f})
    assert set(ids(resp)) == with_("dog", without=("cat", "ball"))
    resp = client.post("/api/search", json={"include": ["pizza"], "exclude": ["car"], **f})
    assert set(ids(resp)) == with_("pizza", without=("car",))
    # The default scorer (soft) ranks a clean item first and demotes the others.
    got = ids(client.post("/api/search", json={"q": "dog", "exclude": ["cat, ball"], "k": 20}))
    clean = with_("dog", without=("cat", "ball"))
    assert got[0] in clean and got.index("dc1") > max(got.index(c) for c in clean)
    # the same through GET with repeated list parameters
    resp = client.get(
        "/api/search",
        params=[("q", "dog"), ("exclude", "cat"), ("exclude", "ball"), ("strategy", "filter")],
    )
    assert set(ids(resp)) == with_("dog", without=("cat", "ball"))
    assert resp.json()["query"]["exclude"] == ["cat", "ball"]


def test_paging_and_caption_cards(client: TestClient) -> None:
    first = client.get("/api/search", params={"q": "tree", "k": 3}).json()
    second = client.get("/api/search", params={"q": "tree", "k": 3, "offset": 3}).json()
    assert first["next_offset"] == 3 and [h["rank"] for h in second["hits"]] == [4, 5, 6]
    assert not {h["id"] for h in first["hits"]} & {h["id"] for h in second["hits"]}
    every = client.get("/api/search", params={"q": "tree", "k": 100}).json()
    assert {h["id"] for h in every["hits"]} >= with_("tree") and every["next_offset"] is None
    images = {h["id"]: h["image"] for h in every["hits"]}
    assert images["t2"] is None and "t2" in NO_IMAGE  # no image field
    assert images[MISSING_IMAGE] is None  # referenced file is missing
    assert images["t1"] == "/images/t1"


def test_images_are_served(client: TestClient) -> None:
    resp = client.get("/images/db1")
    assert resp.status_code == 200 and resp.headers["content-type"] == "image/png"
    img = Image.open(io.BytesIO(resp.content)).convert("RGB")
    assert img.getpixel((2, 2)) == COLOURS["dog"] and img.getpixel((45, 2)) == COLOURS["ball"]


@pytest.mark.parametrize(
    "path",
    [
        "/images/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/images/..%2F..%2F..%2Fetc%2Fpasswd",
        "/images/%2Fetc%2Fpasswd",
        "/images/..%2Fsecret.txt",
        "/images/%2e%2e/secret.txt",
        "/images/col%2F..%2F..%2Fsecret.txt",
        "/images/",
        "/images/nope",
        f"/images/{NOT_AN_IMAGE}",  # referenced, but a text file
        f"/images/{MISSING_IMAGE}",  # referenced, but missing
        f"/images/{NO_IMAGE[0]}",
        "/static/..%2F..%2Fapp.py",
        "/static/%2e%2e/app.py",
    ],
)
def test_image_path_traversal_is_404(client: TestClient, path: str) -> None:
    resp = client.get(path)
    assert resp.status_code == 404, path
    assert SECRET not in resp.text and "root:" not in resp.text
    if path.startswith("/images/"):
        assert resp.json() == {"error": "no such image"}


def test_image_by_file_path_is_404(client: TestClient, web_root: Path) -> None:
    real = next((web_root / "pictures").glob("d1_*.png"))
    assert client.get(f"/images/{quote(str(real), safe='')}").status_code == 404
    assert client.get(f"/images/{quote(real.name, safe='')}").status_code == 404


def test_explain_endpoint(client: TestClient) -> None:
    resp = client.get("/api/items/db1/explain", params={"q": "dog", "exclude": "cat"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["item"]["id"] == "db1" and body["item"]["captions"][1].startswith("a photo")
    assert [c["dim"] for c in body["matched"]] == [dim_of("dog"), dim_of("ball")]
    assert body["excluded"][0]["term"] == "cat" and body["excluded"][0]["item_mass"] == 0.0
    assert {c["dim"] for c in body["concepts"]} == {dim_of("dog"), dim_of("ball")}
    # an item carrying the excluded concept shows its mass on it
    dc1 = client.get("/api/items/dc1/explain", params={"q": "dog but not cat"}).json()
    assert dc1["excluded"][0]["item_mass"] > 0.5 and dc1["excluded"][0]["item_peak"] > 0.5
    assert body["excluded"][0]["item_peak"] == 0.0
    missing = client.get("/api/items/nope/explain", params={"q": "dog"})
    assert missing.status_code == 404 and "unknown item" in missing.json()["error"]


def test_dims_endpoint(client: TestClient) -> None:
    body = client.get(f"/api/dims/{dim_of('ball')}", params={"n": 4}).json()
    assert body["words"][0] == "ball" and body["data_words"] == body["words"]
    assert len(body["items"]) == 4 and body["items"][0]["id"] == "b1"
    values = [it["value"] for it in body["items"]]
    assert values == sorted(values, reverse=True)
    assert all("ball" in ITEMS[it["id"]] for it in body["items"])
    for bad in ("6", "-1", "99999"):
        resp = client.get(f"/api/dims/{bad}")
        assert resp.status_code == 404 and "dimension" in resp.json()["error"]
    resp = client.get("/api/dims/abc")
    assert resp.status_code == 400 and resp.json()["error"].startswith("dim:")
    assert client.get("/api/dims/0", params={"n": 1000}).status_code == 400


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"q": ""}, "type what to search for"),
        ({"q": "   "}, "type what to search for"),
        ({"q": "x" * 513}, "512"),
        ({"q": "but not"}, "'but not' is not followed"),
        ({"q": "dog -dog"}, "both included and excluded"),
        ({"q": 'dog -"'}, "must be followed"),
        ({"q": "dog", "k": 0}, "k:"),
        ({"q": "dog", "k": 101}, "k:"),
        ({"q": "dog", "k": "many"}, "k:"),
        ({"q": "dog", "offset": -1}, "offset:"),
        ({"q": "dog", "strategy": "nope"}, "unknown strategy"),
        ({"q": "dog", "exclude": "cat but not ball"}, "excludes something itself"),
        ({"q": "dog", "exclude": "dog"}, "both included and excluded"),
        ({"q": "dog", "surprise": "1"}, "surprise:"),
    ],
)
def test_bad_search_input_is_400(client: TestClient, params: dict, message: str) -> None:
    for resp in (client.get("/api/search", params=params), client.post("/api/search", json=params)):
        assert resp.status_code == 400, (params, resp.text)
        assert message in resp.json()["error"]


def test_bad_bodies_and_limits(client: TestClient) -> None:
    resp = client.post(
        "/api/search", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]
    resp = client.post("/api/search", json={"q": "dog", "exclude": [f"w{i}" for i in range(17)]})
    assert resp.status_code == 400 and "at most 16" in resp.json()["error"]
    resp = client.post("/api/search", json={"q": "dog", "exclude": [1, 2]})
    assert resp.status_code == 400 and "exclude" in resp.json()["error"]
    resp = client.post("/api/search", content=b"x" * 70_000)
    assert resp.status_code == 413 and "too large" in resp.json()["error"]
    resp = client.delete("/api/search")
    assert resp.status_code == 405 and resp.json()["error"]
    resp = client.get("/api/nothing-here")
    assert resp.status_code == 404 and resp.json()["error"]


def test_host_check_and_cors(web_app, web_collection: Path) -> None:
    # DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends Host: evil.example
    with TestClient(web_app, base_url="http://evil.example") as other:
        resp = other.get("/api/health")
        assert resp.status_code == 400 and "host" in resp.json()["error"]
    for host in ("localhost:8000", "127.0.0.1:1234", "[::1]:80"):
        with TestClient(web_app, base_url="http://127.0.0.1") as c:
            assert c.get("/api/health", headers={"host": host}).status_code == 200
    with TestClient(web_app, base_url="http://127.0.0.1") as c:
        resp = c.get("/api/health", headers={"origin": "http://evil.example"})
        assert "access-control-allow-origin" not in resp.headers  # CORS off by default
    searcher = Searcher(web_collection, encoder=WebKeywordEncoder())
    app = create_app(searcher=searcher, cors_origins=["http://localhost:3000"])
    with TestClient(app, base_url="http://127.0.0.1") as c:
        resp = c.get("/api/health", headers={"origin": "http://localhost:3000"})
        assert resp.headers["access-control-allow-origin"] == "http://localhost:3000"
        resp = c.get("/api/health", headers={"origin": "http://evil.example"})
        assert "access-control-allow-origin" not in resp.headers


def test_warm_app_builds_the_served_paths_memory(web_collection: Path) -> None:
    """``warm`` (as ``sparsemm serve`` runs it) builds the index's one-byte impacts of the
    served path's candidate searches before the first query; a cold app leaves them to
    the first query that needs them."""
    for warm in (True, False):
        searcher = Searcher(web_collection, encoder=WebKeywordEncoder())
        app = create_app(searcher=searcher, warm=warm)
        segs = searcher.index._segments
        assert segs and all((s._impacts is not None) == warm for s in segs)
        with TestClient(app, base_url="http://127.0.0.1") as c:
            assert c.get("/api/search", params={"q": "dog but not cat"}).status_code == 200


def test_warm_app_runs_one_search_before_the_first_request(
    web_collection: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``warm`` searches once through the default path, so the first request finds the text
    encoder and the scorer's readings loaded; a model that cannot read the warm query still
    gets its server."""
    from sparsemm.web import app as app_module

    searched: list[str] = []
    real = Searcher.search

    def recording(self: Searcher, query: object, *a: object, **kw: object) -> object:
        searched.append(str(query))
        return real(self, query, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Searcher, "search", recording)
    create_app(searcher=Searcher(web_collection, encoder=WebKeywordEncoder()), warm=True)
    assert searched == [app_module.WARM_QUERY]
    searched.clear()
    create_app(searcher=Searcher(web_collection, encoder=WebKeywordEncoder()), warm=False)
    assert searched == []

    # with a store of texts seen before, the text model itself is built too, so the first
    # never-seen word does not wait for it
    from sparsemm.encoders.text_store import StoredTextEncoder, TextEmbeddingStore

    def stored() -> StoredTextEncoder:
        enc = WebKeywordEncoder()
        store = TextEmbeddingStore(tmp_path / "texts", {"name": "k", "dim": enc.dim})
        return StoredTextEncoder(lambda: enc, store, "k", enc.dim)

    monkeypatch.setattr(Searcher, "search", lambda self, *a, **kw: [])  # texts all stored
    for warm in (True, False):
        encoder = stored()
        create_app(searcher=Searcher(web_collection, encoder=encoder), warm=warm)
        assert encoder.loaded == warm

    def refusing(self: Searcher, query: object, *a: object, **kw: object) -> object:
        raise SparsemmError("'person' is not something this model can see")

    monkeypatch.setattr(Searcher, "search", refusing)
    app = create_app(searcher=Searcher(web_collection, encoder=WebKeywordEncoder()), warm=True)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.get("/api/health").status_code == 200


def test_create_app_needs_an_index(tmp_path: Path) -> None:
    col = make_collection(tmp_path)
    with pytest.raises(SparsemmError, match="no index"):
        create_app(col, encoder=WebKeywordEncoder())
    with pytest.raises(SparsemmError, match="collection folder"):
        create_app()


def test_build_query_merges_lists() -> None:
    q = build_query("dog but not cat", include=["a photo of a tree"], exclude=["ball, car", "cat"])
    assert q.include == ("dog", "tree") and q.exclude == ("cat", "ball", "car")
    assert build_query("dog", exclude=["", "  "]).exclude == ()
    q = build_query("", include=["pizza -car"])
    assert q.include == ("pizza",) and q.exclude == ("car",)
    with pytest.raises(SparsemmError, match="list of terms"):
        build_query("dog", exclude="cat")


def test_sentences_and_exclusion_only_queries(client: TestClient) -> None:
    body = client.get("/api/search", params={"q": "A dog on the grass, but there is no cat"}).json()
    assert body["query"]["exclude"] == ["cat"] and body["strategy"] == "hybrid"
    assert body["hits"][0]["id"] in with_("dog", without=("cat",))
    # Nothing to include: items are ranked by absence, every cat item after the others.
    body = client.get("/api/search", params={"q": "no cat", "k": 100}).json()
    assert body["query"] == {"include": [], "exclude": ["cat"], "text": "-cat"}
    got = [h["id"] for h in body["hits"]]
    cats = [got.index(i) for i in with_("cat") if i in got]
    assert cats and min(cats) > max(got.index(i) for i in got if i not in with_("cat"))


def test_hits_say_how_each_term_was_scored_as_the_cli_does(client: TestClient) -> None:
    """`search --explain` prints "scored: 'dog' by ..." from a running server too: the API's
    hits carry the scorer's per-term source (Hit.scored_by)."""
    body = client.get("/api/search", params={"q": "dog but not cat", "k": 3}).json()
    assert body["hits"] and all(
        h["scored_by"] == {"dog": "code similarity", "cat": "code similarity"} for h in body["hits"]
    )
    # codes that are not class probabilities: every concept the page is given may show
    assert client.get("/api/health").json()["concept_floor"] == 0.0


def test_a_hit_that_likely_shows_a_left_out_term_is_marked(web_app: Any) -> None:
    """A photo folder has no labels: an upload of a cat "but not cat" lists the cats when
    nothing else looks like it (at a low match); the card says they show one."""
    from sparsemm.query.hits import Hit, TermEvidence

    service = web_app.state.service
    row = service.row("d1")

    def hit(p_cat: float, kind: str = "classifier") -> Hit:
        ev = [TermEvidence("cat", "exclude", kind, p_cat)]
        return Hit(rank=1, row=row, id="d1", score=0.1, caption="", labels=[], evidence=ev)

    assert service._hit(hit(0.89), "", ["cat"]).violations == ["cat"]
    assert service._hit(hit(0.2), "", ["cat"]).violations == []
    assert service._hit(hit(0.89, "code similarity"), "", ["cat"]).violations == []


def test_query_bytes_that_are_not_utf8_are_400_not_dropped(client: TestClient) -> None:
    """A URL's query string with bytes that are not UTF-8 (caf%E9 from a Latin-1 page)
    arrives with U+FFFD in their place; the parser dropped it and searched for "caf"."""
    resp = client.get("/api/search?q=caf%E9")
    assert resp.status_code == 400, resp.text
    assert "not UTF-8 text (character 4)" in resp.json()["error"]
    resp = client.post("/api/search", json={"q": "dog", "exclude": ["caf\ufffd"]})
    assert resp.status_code == 400 and "not UTF-8" in resp.json()["error"]
