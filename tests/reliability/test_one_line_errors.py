"""Inputs that used to end in a traceback or a silent wrong default, which a user cannot act on.

Each now ends in one ``error:`` line and exit 2 (the CLI error contract), or - for a symlink
loop as an item's image - in that item being skipped like any unreadable image.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
import test_bad_images  # noqa: F401  (registers the "relpix" pixel encoder)
from test_bad_images import png_bytes
from webtoy import make_collection, make_sr

from sparsemm.index.manifest import meta_digest
from sparsemm.query.indexing import build_index

# ------------------------------------------------------------------- text encodings, loops


@pytest.mark.parametrize(
    ("name", "data", "fragments"),
    [
        ("latin1.csv", "id,caption\n1,a dog\n2,café au lait\n".encode("latin-1"),
         ("latin1.csv:3: the file is not UTF-8 text", "Latin-1", "iconv -f LATIN1")),
        ("utf16.csv", "id,caption\n1,a dog\n".encode("utf-16"),
         ("utf16.csv:1: the file is not UTF-8 text", "UTF-16", "iconv -f UTF-16")),
        ("items.jsonl", '{"id": "1", "caption": "a dog"}\n{"id": "2", "caption": "caf\xe9"}\n'
         .encode("latin-1"), ("items.jsonl:2: the file is not UTF-8 text",)),
    ],
)  # fmt: skip
def test_cli_encode_of_a_file_that_is_not_utf8(
    tmp_path: Path, cli: Any, name: str, data: bytes, fragments: tuple[str, ...]
) -> None:
    (tmp_path / name).write_bytes(data)
    res = cli("encode", str(tmp_path / name), "-o", str(tmp_path / "col"), "--no-progress")
    res.one_line_error(*fragments)
    assert not (tmp_path / "col").exists()


def test_cli_encode_of_a_utf8_csv_with_a_bom_still_reads(tmp_path: Path) -> None:
    from sparsemm.data.sources import read_captions_csv, read_captions_jsonl

    (tmp_path / "bom.csv").write_bytes("\ufeffid,caption\n1,café\n".encode())
    assert read_captions_csv(tmp_path / "bom.csv")[0]["captions"] == ["café"]
    # a U+2028 inside a JSON string is not a line break of the JSONL file
    (tmp_path / "x.jsonl").write_text('{"id": "1", "caption": "a\u2028b"}\n', encoding="utf-8")
    assert read_captions_jsonl(tmp_path / "x.jsonl")[0]["captions"] == ["a\u2028b"]


def test_cli_encode_of_a_symlink_loop_source(tmp_path: Path, cli: Any) -> None:
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    res = cli("encode", str(tmp_path / "loop.jsonl"), "-o", str(tmp_path / "col"))
    res.one_line_error("loop.jsonl is a symbolic link loop")


def test_cli_encode_skips_an_image_that_is_a_symlink_loop(tmp_path: Path, cli: Any) -> None:
    (tmp_path / "ok.png").write_bytes(png_bytes())
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    rows = [{"id": "ok", "image": "ok.png"}, {"id": "loop", "image": "loop.png"}]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "col"
    res = cli(
        "encode", str(tmp_path / "items.jsonl"), "-o", str(out), "--encoder", "relpix",
        "--no-progress",
    )  # fmt: skip
    assert res.code == 0, res.err
    assert "skipped 1 item(s)" in res.out and "loop.png" in res.out
    assert (out / "skipped.jsonl").read_text().count("loop") >= 1


def test_cli_export_with_a_query_file_that_is_not_utf8(tmp_path: Path, cli: Any) -> None:
    (tmp_path / "q.txt").write_bytes("a dog\ncafé\n".encode("latin-1"))
    res = cli(
        "export", str(tmp_path / "model"), str(tmp_path / "col"), "-o", str(tmp_path / "out"),
        "--queries", str(tmp_path / "q.txt"),
    )  # fmt: skip
    res.one_line_error("q.txt:2: the file is not UTF-8 text")


# ----------------------------------------------------------------- models and the index


@pytest.fixture()
def toy(tmp_path: Path) -> tuple[Path, Path]:
    col = make_collection(tmp_path)
    model = make_sr(tmp_path)
    build_index(col, model)
    return col, model


def test_cli_model_config_that_is_a_list(toy: tuple[Path, Path], cli: Any) -> None:
    col, model = toy
    (model / "config.json").write_text("[1, 2]")
    cli("index", str(col), "--model", str(model)).one_line_error(
        "config.json is malformed (a JSON object was expected, got list)"
    )


@pytest.mark.parametrize("value", ["x", 0, None, 2.5])
def test_cli_index_manifest_with_a_bad_top_k(
    toy: tuple[Path, Path], cli: Any, value: object
) -> None:
    col, _ = toy
    path = col / "index" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["meta"]["top_k"] = value
    # a writer's bug, not an edit: the checksum agrees (an edit is refused by the checksum,
    # test_hardening.py::test_edited_index_metadata_is_refused)
    manifest["meta_sha256"] = meta_digest(manifest["meta"])
    path.write_text(json.dumps(manifest))
    cli("search", str(col), "dog").one_line_error("has no valid top_k", "sparsemm index")


def test_cli_moved_model_folder_is_named_not_train_one(
    toy: tuple[Path, Path], cli: Any, tmp_path: Path
) -> None:
    col, model = toy
    shutil.move(str(model), str(tmp_path / "moved"))
    line = cli("search", str(col), "dog").one_line_error(
        f"was built with the model {model}, which is no longer there (moved or deleted?)",
        "--model MODEL_DIR",
    )
    assert "train one" not in line


def test_cli_index_top_k_zero_is_refused(toy: tuple[Path, Path], cli: Any) -> None:
    col, model = toy
    before = (col / "index" / "manifest.json").read_bytes()
    cli("index", str(col), "--model", str(model), "--top-k", "0").one_line_error(
        "--top-k must be a positive number"
    )
    assert (col / "index" / "manifest.json").read_bytes() == before


def test_cli_too_many_excluded_terms_as_the_api(toy: tuple[Path, Path], cli: Any) -> None:
    from sparsemm.query.request import MAX_TERMS

    assert MAX_TERMS == 16  # one limit for the CLI and the API (sparsemm.query.request)
    col, _ = toy
    excluded = [f"--exclude=w{i}" for i in range(20)]
    cli("search", str(col), "dog", *excluded).one_line_error(
        "at most 16 include and 16 exclude terms (got 1 and 20)"
    )


def test_model_for_another_shape_is_one_short_line(tmp_path: Path, cli: Any, toy: Any) -> None:
    col, model = toy
    config = json.loads((model / "config.json").read_text())
    config["latent_dim"] += 1  # every tensor's shape now disagrees with the weights
    del config["weights_sha256"]
    (model / "config.json").write_text(json.dumps(config))
    line = cli("index", str(col), "--model", str(model)).one_line_error(
        "model.safetensors is corrupt or does not match config.json (size mismatch for"
    )
    assert "more)" in line and len(line) < 500


# --------------------------------------------------------------------------------- Qdrant


def _dead_url() -> str:
    with socket.socket() as s:  # a free loopback port: nothing listens on it
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_cli_qdrant_url_with_no_server(toy: tuple[Path, Path], cli: Any) -> None:
    pytest.importorskip("qdrant_client")
    col, model = toy
    url = _dead_url()
    before = (col / "index" / "manifest.json").read_bytes()
    for argv in (
        ("search", str(col), "dog", "--backend", "qdrant", "--url", url),
        ("index", str(col), "--model", str(model), "--backend", "qdrant", "--url", url),
    ):
        res = cli(*argv)
        res.one_line_error(f"cannot reach a Qdrant server at {url}", "check --url")
        assert "UserWarning" not in res.err
    # refused before the local index was rebuilt
    assert (col / "index" / "manifest.json").read_bytes() == before


# ------------------------------------------------------------------- terms that are no words


@pytest.mark.parametrize(("query", "side"), [("🐶", "search for"), ("dog but not 🐶🐱", "exclude")])
def test_emoji_terms_are_named_even_when_the_encoder_embeds_them(
    toy: tuple[Path, Path], query: str, side: str
) -> None:
    """A subword encoder embeds any text (MiniLM maps an emoji to [UNK]); the fallback fake
    does the same, so only the no-letter rule can name the term."""
    from webtoy import WORDS

    from fakes import term_word_encoder
    from sparsemm.errors import SparsemmError
    from sparsemm.query.parse import parse_query
    from sparsemm.query.searcher import Searcher

    col, _ = toy
    encoder = term_word_encoder(WORDS, name="webkw", fallback=True)()
    searcher = Searcher(col, encoder=encoder)
    parsed = parse_query(query)
    term = (parsed.include if side == "search for" else parsed.exclude)[0]
    assert searcher.context.term_code(term).any()  # the encoder gave it a code
    with pytest.raises(SparsemmError, match=f"matches no concept .* cannot {side} anything"):
        searcher.check_terms(parsed, "sparse")
    searcher.check_terms(parse_query("dog but not cat"), "sparse")  # words still pass
