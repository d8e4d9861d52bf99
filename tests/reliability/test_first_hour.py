"""What a new user met in the first hour with a folder of photos (docs/reliability.md, "The
first hour"): evidence that reads as what it is, readable concept names, ..."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparsemm.models.concepts import dimension_names
from sparsemm.query.hits import TermEvidence
from sparsemm.query.request import evidence_text


def test_an_excluded_term_reads_as_the_chance_the_item_shows_it() -> None:
    """ "not dogs 0.00" read as "no chance of no dog"; the value is P(dog | item)."""
    assert TermEvidence("dogs", "exclude", "classifier", 0.0).text == "dogs 0% (left out)"
    assert TermEvidence("cat", "exclude", "classifier", 0.891).text == "cat 89% (left out)"
    assert TermEvidence("dog", "include", "detector", 0.934).text == "dog 93%"
    assert TermEvidence("cat", "exclude", "detector", 0.004).text == "cat <1% (left out)"
    # no probability for the word: a code similarity keeps its own scale
    assert evidence_text("zebra", "include", "code similarity", 0.4219) == "zebra 0.42"
    # a "more like this" picture's similarity
    assert evidence_text("like: image x.jpg", "include", "picture similarity", 0.48) == (
        "like it 48%"
    )


def test_imagenets_two_cranes_have_readable_names() -> None:
    names = dimension_names(
        ["crane", "crane", "maillot", "maillot, tank suit", "tabby, tabby cat"],
        ["n02012849", "n03126707", "n03710637", "n03710721", "n02123045"],
    )
    assert names == ["crane (bird)", "crane (machine)", "maillot (tights)",
                     "maillot (tank suit)", "tabby"]  # fmt: skip
    assert not any("class" in n for n in names)


def _photos(folder: Path, n: int = 2) -> Path:
    from PIL import Image

    folder.mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (32, 32), (40 * i, 90, 200)).save(folder / f"p{i}.png")
    return folder


def test_up_with_clip_and_no_weights_fails_at_once_naming_its_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Offline with no cached CLIP: one line at once (not 32 s of the hub client's retries,
    each warning twice), naming `up`'s own flag --encoder-model (not --model, which `up`
    refuses with --encoder clip)."""
    pytest.importorskip("transformers")
    from sparsemm.cli.main import main

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    photos = _photos(tmp_path / "photos")
    t0 = time.perf_counter()
    argv = ["up", str(photos), "-o", str(tmp_path / "out"), "--encoder", "clip", "--no-serve"]
    status = main([*argv, "--no-progress"])
    took = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "--encoder-model DIR" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
    assert " --model" not in lines[0]
    assert took < 10, took  # asked before importing the model code; no download attempts


def test_the_hub_is_unreachable_without_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from sparsemm.encoders.hf import hub_unreachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example:8443")
    asked: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], timeout: float) -> None:
        asked.append(address)
        raise OSError("no route")

    monkeypatch.setattr(socket, "create_connection", refuse)
    why = hub_unreachable()
    assert why and "hub.example cannot be reached" in why and asked == [("hub.example", 8443)]
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub_unreachable() == "TRANSFORMERS_OFFLINE is set"
