"""`sparsemm search`, `index` and the server record take the folder `sparsemm up` wrote
(OUT, holding OUT/collection) or the photo folder (PHOTOS/.sparsemm/collection) for the
collection inside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakes import fashion_collection
from sparsemm.cli.main import main
from sparsemm.pipeline import running

QUERY = "a sneaker but not a bag"


def test_search_takes_the_output_folder_for_its_collection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    col = fashion_collection(tmp_path / "out")
    assert col == tmp_path / "out" / "collection"
    answers = []
    for given in (col, tmp_path / "out"):
        assert main(["search", str(given), QUERY, "-k", "4", "--no-server", "-f"]) == 0
        answers.append(capsys.readouterr().out)
    assert answers[0] == answers[1] and answers[0].strip()
    assert main(["index", str(tmp_path / "out"), "--model", str(tmp_path / "out" / "sr")]) == 0
    assert (col / "index" / "manifest.json").is_file()
    assert not (tmp_path / "out" / "index").exists()


def test_a_server_of_the_collection_is_found_from_its_photo_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARSEMM_RUNTIME_DIR", str(tmp_path / "run"))
    photos = tmp_path / "photos"
    col = fashion_collection(photos / ".sparsemm")
    with running.announce(col, "127.0.0.1", 8123) as record:
        assert record is not None
        monkeypatch.setattr(running, "_alive", lambda pid: pid == os.getpid())
        for given in (photos, photos / ".sparsemm", col):
            assert running.find_server(given) == "http://127.0.0.1:8123"
    assert running.find_server(photos) is None
