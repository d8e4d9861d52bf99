"""`sparsemm search` forwards to a running `sparsemm serve` of the same collection
(sparsemm.pipeline.running): same output, no local model load; local search when none answers."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes import fashion_collection
from sparsemm.cli.main import main
from sparsemm.pipeline import running

uvicorn = pytest.importorskip("uvicorn", reason="the web extra (uvicorn) is not installed")

QUERY = "a sneaker but not a bag"


@pytest.fixture()
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPARSEMM_RUNTIME_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


@pytest.fixture()
def collection(tmp_path: Path) -> Path:
    return fashion_collection(tmp_path)


@pytest.fixture()
def served(collection: Path, runtime: Path) -> Iterator[tuple[Path, int]]:
    """uvicorn serving ``collection`` on a free 127.0.0.1 port, announced as `serve` does."""
    from sparsemm.web.app import create_app

    app = create_app(collection)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        with running.announce(collection, "127.0.0.1", port) as record:
            assert record is not None and record.is_file()
            yield collection, port
        assert not record.exists()  # removed when the server stops
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _search(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["search", *argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_search_is_answered_by_the_running_server_with_the_same_output(
    served: tuple[Path, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    collection, _ = served
    status, local, _ = _search(capsys, str(collection), QUERY, "-k", "4", "--no-server")
    assert status == 0 and "s1" in local and "[hybrid]" in local
    # From here on a local search would fail: only the server can answer.
    import sparsemm.query.searcher

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("searched locally")

    monkeypatch.setattr(sparsemm.query.searcher.Searcher, "__init__", refuse)
    status, forwarded, err = _search(capsys, str(collection), QUERY, "-k", "4")
    assert status == 0 and err == ""
    assert forwarded == local


@pytest.mark.parametrize(
    "mode",
    [
        ["--explain"],
        ["--json"],
        ["-f"],
        ["-f", "-z"],
        ["--json", "--offset", "2", "-k", "3"],
        ["--like", "s1", "--json"],
        ["--like", "s1", "--explain"],
        ["--strategy", "filter", "--explain"],
    ],
)
def test_every_output_mode_is_answered_by_the_server_as_locally(
    served: tuple[Path, int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    mode: list[str],
) -> None:
    """--explain, --json, -f and --like cost a cold process seconds of model loading: a
    running server answers them, printed exactly as a local search prints them."""
    collection, _ = served
    query = "but not a bag" if "--like" in mode else QUERY
    local = _search(capsys, str(collection), query, *mode, "--no-server")
    assert local[0] == 0 and local[1]
    import sparsemm.query.searcher

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("searched locally")

    monkeypatch.setattr(sparsemm.query.searcher.Searcher, "__init__", refuse)
    assert _search(capsys, str(collection), query, *mode) == local


def test_a_servers_match_count_is_printed_only_when_asked_for(
    served: tuple[Path, int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server counts matches for its page on every search; the CLI prints the count
    (and --json carries it) only with --min-score, as a local search does."""
    collection, _ = served
    real = running.forward_search

    def counted(*args: object, **kwargs: object) -> dict:
        out = real(*args, **kwargs)
        assert isinstance(out, dict)
        return {**out, "threshold": 0.5, "matches": 3}

    monkeypatch.setattr(running, "forward_search", counted)
    status, out, _ = _search(capsys, str(collection), QUERY, "--json")
    assert status == 0
    body = json.loads(out)
    assert body["threshold"] is None and body["matches"] is None
    status, out, _ = _search(capsys, str(collection), QUERY)
    assert status == 0 and "items match at" not in out


def test_min_score_is_refused_by_the_server_as_locally(
    served: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    collection, _ = served
    args = (str(collection), QUERY, "--min-score", "60%", "--strategy", "filter")
    local = _search(capsys, *args, "--no-server")
    assert local[0] == 2 and "not probabilities" in local[2]
    assert _search(capsys, *args) == local
    # with the default scorer, "use the default scorer" would be no help
    args = (str(collection), QUERY, "--min-score", "60%")
    local = _search(capsys, *args, "--no-server")
    assert local[0] == 2 and "this collection's model gives none" in local[2]
    assert "use the default" not in local[2] and local[2].count("\n") == 1
    assert _search(capsys, *args) == local


def test_an_unknown_like_item_is_named_by_the_server_as_locally(
    served: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    collection, _ = served
    args = (str(collection), "--like", "no-such-item", "but not a bag")
    local = _search(capsys, *args, "--no-server")
    assert local[0] == 2 and "no item 'no-such-item'" in local[2]
    assert _search(capsys, *args) == local


def test_a_picture_is_sent_to_the_servers_upload_search(
    served: tuple[Path, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--like photo.jpg` posts the file to /api/search/image (the server has the image
    encoder loaded); a file over the upload limit is searched locally."""
    collection, _ = served
    sent: list[tuple[str, str]] = []

    def fake(url: str, image: str, *args: object, **kwargs: object) -> dict:
        sent.append((url, str(image)))
        return {
            "query": {"include": [], "exclude": ["bag"], "text": "-bag"}, "strategy": "match",
            "probabilistic": True, "hits": [], "total": 12,
        }  # fmt: skip

    from sparsemm.web.images import MAX_UPLOAD_BYTES

    assert running.UPLOAD_LIMIT == MAX_UPLOAD_BYTES
    real = running.forward_image
    monkeypatch.setattr(running, "forward_image", fake)
    photo = collection.parent / "photo.png"
    photo.write_bytes(b"\x89PNG not really")
    status, out, _ = _search(capsys, str(collection), "--like", str(photo), "but not a bag")
    assert status == 0 and len(sent) == 1 and sent[0][1] == str(photo)
    assert out.startswith(f"query: like {photo}  but not: bag")
    monkeypatch.setattr(running, "forward_image", real)
    monkeypatch.setattr(running, "UPLOAD_LIMIT", 4)
    url = running.find_server(collection)
    assert url and running.forward_image(url, photo, "", ["bag"], 3, 0, None) is None


def test_bad_query_is_refused_by_the_server_like_locally(
    served: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    collection, _ = served
    bad = "sneaker but not sneaker"
    local = _search(capsys, str(collection), bad, "--no-server")
    forwarded = _search(capsys, str(collection), bad)
    assert local[0] == forwarded[0] == 2
    assert forwarded[2].startswith("error: ") and forwarded[2].count("\n") == 1


def test_stale_or_silent_server_means_a_local_search(
    collection: Path, runtime: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = _search(capsys, str(collection), QUERY, "--no-server")
    record = running.record_path(collection)
    record.parent.mkdir(parents=True)
    # a server that died without removing its record: the record is dropped
    dead = {"url": "http://127.0.0.1:9", "pid": 2**22 + 12345, "collection": str(collection)}
    record.write_text(json.dumps(dead))
    assert running.find_server(collection) is None and not record.exists()
    # a live process whose port does not answer: the search runs locally
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    record.write_text(json.dumps({**dead, "url": f"http://127.0.0.1:{port}", "pid": os.getpid()}))
    assert running.find_server(collection) == f"http://127.0.0.1:{port}"
    assert _search(capsys, str(collection), QUERY) == expected


def test_searches_past_the_servers_limits_run_locally(
    served: tuple[Path, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparsemm.query import request as app  # the one set of limits, the API's too

    collection, _ = served
    calls: list[str] = []
    monkeypatch.setattr(running, "forward_search", lambda url, *a, **kw: calls.append(url))
    status, out, _ = _search(capsys, str(collection), QUERY, "-k", str(app.MAX_K + 1))
    assert status == 0 and "s1" in out and calls == []  # answered locally, never sent
    _search(capsys, str(collection), QUERY, "-k", str(app.MAX_K))
    assert len(calls) == 1


def test_server_url_for_wildcard_and_ipv6_binds() -> None:
    assert running.server_url("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert running.server_url("::", 8000) == "http://[::1]:8000"
    assert running.server_url("127.0.0.1", 80) == "http://127.0.0.1:80"


def test_serve_announces_itself_while_it_runs(
    collection: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    seen: dict[str, object] = {}

    def fake_run(app: object, **kwargs: object) -> None:
        seen["url"] = running.find_server(collection)
        seen["sigterm"] = signal.getsignal(signal.SIGTERM)

    monkeypatch.setattr(uvicorn, "run", fake_run)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["serve", str(collection), "--port", "8124"]) == 0
    assert seen["url"] == "http://127.0.0.1:8124"
    assert seen["sigterm"] is not before  # exits through Python, so the record goes
    assert running.find_server(collection) is None
    assert signal.getsignal(signal.SIGTERM) == before


def test_explain_names_what_in_the_photo_carries_each_term(capsys) -> None:
    """--explain prints, per term with some evidence, the words of the dimensions that
    carry it ("'dogs' from: silky terrier (in part of the photo)"): why a photo with no
    dog in its main classes can still be judged as possibly showing one."""
    from sparsemm.cli.search import print_hits

    ev = [
        {"term": "people", "side": "include", "kind": "classifier", "value": 1.0,
         "dims": [1000], "words": ["person (face)"], "read_as": ["person"]},
        {"term": "dogs", "side": "exclude", "kind": "classifier", "value": 0.59,
         "dims": [1202], "words": ["silky terrier (in part of the photo)"], "read_as": ["dog"]},
        {"term": "cats", "side": "exclude", "kind": "classifier", "value": 0.0,
         "dims": [], "words": [], "read_as": ["cat"]},
    ]  # fmt: skip
    hit = {"rank": 1, "id": "beach.jpg", "score": 0.4, "caption": "", "matched": [],
           "excluded": [], "evidence": ev}  # fmt: skip
    print_hits([hit], explain=True, probabilistic=True)
    out = capsys.readouterr().out.splitlines()
    assert "       'people' from: person (face)" in out
    assert "       'dogs' from: silky terrier (in part of the photo)" in out
    assert not any("'cats' from" in line for line in out)  # nothing carries it


def test_json_output_puts_each_list_of_numbers_on_one_line() -> None:
    """`search --json` printed a hit's dimension lists one number a line (hundreds of lines
    for "no animals"); the JSON is the same, each list of numbers is now one line, and text
    that looks like a list or a placeholder stays as it was."""
    import json

    from sparsemm.cli.search import json_text

    value = {
        "hits": [
            {"caption": '[1,  2] "x"', "dims": list(range(300)), "words": ["a", "b"],
             "excluded": [{"dims": [3, 4.5], "flags": [True, False], "none": []}]},
        ],
        "total": 3,
    }  # fmt: skip
    text = json_text(value)
    assert json.loads(text) == value
    assert any(json.dumps(list(range(300))) in line for line in text.splitlines())
    assert '"dims": [3, 4.5]' in text and '"caption": "[1,  2] \\"x\\""' in text
    assert len(text.splitlines()) < 40 < len(json.dumps(value, indent=1).splitlines())
