"""The persistent store of query-text embeddings (sparsemm.encoders.text_store): a text seen
before, by this process or another, costs no encoder pass."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from fakes import FashionWords, fashion_collection
from sparsemm.encoders import text_store
from sparsemm.encoders.text_store import StoredTextEncoder, TextEmbeddingStore

RECORD = {"name": "minilm", "dim": 4, "model": "all-MiniLM-L6-v2"}


def unit_rows(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Counting:
    name, dim = "minilm", 4

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):  # type: ignore[no-untyped-def]
        self.seen.append(list(texts))
        return np.stack([unit_rows(1, seed=len(t))[0] for t in texts])


def test_a_new_store_reads_what_another_wrote(tmp_path: Path) -> None:
    emb = unit_rows(3)
    TextEmbeddingStore(tmp_path, RECORD).put(["a", "b", "c"], emb)
    other = TextEmbeddingStore(tmp_path, RECORD)
    got = other.get(["c", "x", "a"])
    assert set(got) == {"a", "c"}
    np.testing.assert_array_equal(got["a"], emb[0])
    np.testing.assert_array_equal(got["c"], emb[2])
    # atomic writes leave no temp file; chunks are plain .npy (no pickle)
    assert not list(tmp_path.glob(".*tmp"))
    for f in tmp_path.glob("chunk-*.npy"):
        np.load(f, allow_pickle=False)


def test_the_store_keeps_only_the_most_recently_used(tmp_path: Path) -> None:
    store = TextEmbeddingStore(tmp_path, RECORD, max_entries=2)
    store.put(["a"], unit_rows(1, 1))
    store.put(["b"], unit_rows(1, 2))
    store.get(["a"])  # "a" is now newer than "b"
    store.put(["c"], unit_rows(1, 3))
    again = TextEmbeddingStore(tmp_path, RECORD, max_entries=2)
    assert set(again.get(["a", "b", "c"])) == {"a", "c"}
    assert len(again) == 2


@pytest.mark.parametrize("damage", ["index", "chunk", "other_encoder", "journal_other_encoder"])
def test_a_damaged_store_is_ignored_with_a_warning_and_rebuilt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if damage in ("index", "other_encoder"):  # each put writes the index, not the journal
        monkeypatch.setattr(text_store, "COMPACT_LINES", 0)
    TextEmbeddingStore(tmp_path, RECORD).put(["a", "b"], unit_rows(2))
    if damage == "index":
        (tmp_path / "index.json").write_text("{not json", encoding="utf-8")
    elif damage == "chunk":
        next(tmp_path.glob("chunk-*.npy")).write_bytes(b"junk")
    elif damage == "other_encoder":
        raw = json.loads((tmp_path / "index.json").read_text(encoding="utf-8"))
        raw["encoder"]["dim"] = 8
        (tmp_path / "index.json").write_text(json.dumps(raw), encoding="utf-8")
    else:
        lines = (tmp_path / "journal.jsonl").read_text(encoding="utf-8").splitlines()
        head = json.loads(lines[0])
        head["encoder"]["dim"] = 8
        lines[0] = json.dumps(head)
        (tmp_path / "journal.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    enc = Counting()
    stored = StoredTextEncoder(lambda: enc, TextEmbeddingStore(tmp_path, RECORD), "minilm", 4)
    with caplog.at_level(logging.WARNING, logger="sparsemm.encoders.text_store"):
        out = stored.encode_text(["a", "b"])
    assert "damaged" in caplog.text
    assert enc.seen == [["a", "b"]] and out.shape == (2, 4)
    # rebuilt: a fresh reader finds both texts again
    assert set(TextEmbeddingStore(tmp_path, RECORD).get(["a", "b"])) == {"a", "b"}


def test_stored_encoder_builds_the_encoder_only_for_unseen_texts(tmp_path: Path) -> None:
    built: list[Counting] = []

    def factory() -> Counting:
        built.append(Counting())
        return built[-1]

    first = StoredTextEncoder(factory, TextEmbeddingStore(tmp_path, RECORD), "minilm", 4)
    a = first.encode_text(["a dog", "a cat", "a dog"])
    assert len(built) == 1 and built[0].seen == [["a dog", "a cat"]]
    second = StoredTextEncoder(factory, TextEmbeddingStore(tmp_path, RECORD), "minilm", 4)
    b = second.encode_text(["a cat", "a dog"])
    assert not second.loaded and len(built) == 1  # no encoder built at all
    np.testing.assert_array_equal(b, a[[1, 0]])
    second.encode_text(["a cat", "a bird"])
    assert built[1].seen == [["a bird"]]  # only the new text is embedded


def test_store_key_follows_the_encoder_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSEMM_TEXT_STORE", "/x")
    a = TextEmbeddingStore.for_encoder(RECORD)
    b = TextEmbeddingStore.for_encoder({**RECORD, "model": "paraphrase-MiniLM-L3-v2"})
    assert a is not None and b is not None and a.root != b.root
    assert TextEmbeddingStore.for_encoder({"name": "kwfake", "dim": 4}) is None
    monkeypatch.setenv("SPARSEMM_TEXT_STORE", "off")
    assert TextEmbeddingStore.for_encoder(RECORD) is None


def test_a_second_searcher_answers_seen_terms_without_its_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sparsemm

    monkeypatch.setattr(
        text_store, "STORED_ENCODERS", text_store.STORED_ENCODERS | {FashionWords.name}
    )
    monkeypatch.setenv("SPARSEMM_TEXT_STORE", str(tmp_path / "store"))
    col = fashion_collection(tmp_path)
    first = sparsemm.Searcher(col)
    want = [h.id for h in first.search("a sneaker but not a bag", k=5)]
    before = FashionWords.calls
    # a new searcher (as a new process would) ranks the same texts from the store
    second = sparsemm.Searcher(col)
    got = [h.id for h in second.search("a sneaker but not a bag", k=5)]
    assert got == want
    assert FashionWords.calls == before
    assert not second.encoder.loaded


def test_an_attribute_error_while_building_the_encoder_is_raised_not_recursed(
    tmp_path: Path,
) -> None:
    def factory() -> Counting:
        raise AttributeError("no text_dim")

    stored = StoredTextEncoder(factory, TextEmbeddingStore(tmp_path, RECORD), "minilm", 4)
    with pytest.raises(AttributeError):
        stored.encode_text(["a never seen text"])


def test_a_new_text_is_an_append_and_the_index_is_written_every_so_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(text_store, "COMPACT_LINES", 3)
    store = TextEmbeddingStore(tmp_path, RECORD)
    store.put(["a"], unit_rows(1, 1))
    store.put(["b", "c"], unit_rows(2, 2))
    assert not (tmp_path / "index.json").exists()  # appends only, so far
    assert len((tmp_path / "journal.jsonl").read_text(encoding="utf-8").splitlines()) == 4
    store.put(["d"], unit_rows(1, 3))  # the journal reached 3 texts: the index is written
    assert (tmp_path / "index.json").exists() and not (tmp_path / "journal.jsonl").exists()
    store.put(["e"], unit_rows(1, 4))
    again = TextEmbeddingStore(tmp_path, RECORD)  # reads the index, then the journal
    assert set(again.get(list("abcdex"))) == set("abcde")
    np.testing.assert_array_equal(again.get(["c"])["c"], unit_rows(2, 2)[1])


def test_a_journal_line_cut_short_is_skipped(tmp_path: Path) -> None:
    TextEmbeddingStore(tmp_path, RECORD).put(["a", "b"], unit_rows(2))
    with open(tmp_path / "journal.jsonl", "a", encoding="utf-8") as fh:
        fh.write('["c","chunk-')  # a crash in the middle of a write
    store = TextEmbeddingStore(tmp_path, RECORD)
    assert set(store.get(["c"])) == set()
    store.put(["d"], unit_rows(1, 5))  # a later append is read (the cut line stays skipped)
    assert set(TextEmbeddingStore(tmp_path, RECORD).get(["a", "b", "c", "d"])) == {"a", "b", "d"}


def test_a_full_store_drops_to_nine_tenths_so_new_texts_stay_appends(tmp_path: Path) -> None:
    store = TextEmbeddingStore(tmp_path, RECORD, max_entries=10)
    for i in range(10):
        store.put([f"t{i}"], unit_rows(1, i))
    assert not (tmp_path / "index.json").exists()
    store.put(["t10"], unit_rows(1, 10))  # 11 > 10: the 2 oldest go, the index is written
    assert len(store) == 9 and (tmp_path / "index.json").exists()
    store.put(["t11"], unit_rows(1, 11))  # room again: an append
    assert (tmp_path / "journal.jsonl").exists()
    again = TextEmbeddingStore(tmp_path, RECORD, max_entries=10)
    kept = set(again.get([f"t{i}" for i in range(12)]))
    assert kept == {f"t{i}" for i in range(2, 12)}


def _age_chunks(root: Path, seconds: float = 120.0) -> None:
    """Make every chunk look older than the minute a compaction leaves young chunks alone."""
    import os
    import time

    old = time.time() - seconds
    for f in root.glob("chunk-*.npy"):
        os.utime(f, (old, old))


def test_a_text_another_process_dropped_is_not_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A long-running process (a server) holds the store as it read it; another process
    dropped one of its texts (least recently used there) with its chunk. Reading that text
    goes back to the store on disk and finds it gone, where it called the store damaged and
    deleted every text of every process."""
    server = TextEmbeddingStore(tmp_path, RECORD, max_entries=2)
    server.put(["a"], unit_rows(1, 1))
    server.put(["b"], unit_rows(1, 2))
    assert set(server.get(["a", "b"])) == {"a", "b"}
    _age_chunks(tmp_path)
    cli = TextEmbeddingStore(tmp_path, RECORD, max_entries=2)
    cli.get(["b"])  # "b" is newer than "a" there
    cli.put(["c"], unit_rows(1, 3))  # full: "a" goes, with its chunk
    with caplog.at_level(logging.WARNING, logger="sparsemm.encoders.text_store"):
        got = server.get(["a", "b", "c"])
    assert "damaged" not in caplog.text
    assert set(got) == {"b", "c"}
    assert set(TextEmbeddingStore(tmp_path, RECORD).get(["a", "b", "c"])) == {"b", "c"}


def test_a_compaction_keeps_what_other_processes_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that read the store long ago and writes its index (its journal grew long
    enough) first reads what others added since: their texts stay, and so do their chunks
    once they are older than a minute."""
    monkeypatch.setattr(text_store, "COMPACT_LINES", 3)
    server = TextEmbeddingStore(tmp_path, RECORD)
    server.put(["a"], unit_rows(1, 1))
    assert set(server.get(["a"])) == {"a"}  # read: its view of the store is now fixed
    TextEmbeddingStore(tmp_path, RECORD).put(["x", "y"], unit_rows(2, 9))  # another process
    _age_chunks(tmp_path)
    server.put(["b"], unit_rows(1, 2))
    assert not (tmp_path / "index.json").exists()
    server.put(["c"], unit_rows(1, 3))  # its journal reached 3 lines: the index is written
    assert (tmp_path / "index.json").exists()
    fresh = TextEmbeddingStore(tmp_path, RECORD)
    assert set(fresh.get(["a", "b", "c", "x", "y"])) == {"a", "b", "c", "x", "y"}
    np.testing.assert_array_equal(fresh.get(["y"])["y"], unit_rows(2, 9)[1])


def test_a_compaction_over_a_damaged_index_keeps_this_processes_texts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The index on disk damaged after this process read it: writing the index again (a
    compaction) keeps what this process holds and has just added, where reading the damaged
    index deleted every chunk, the new one too."""
    store = TextEmbeddingStore(tmp_path, RECORD, max_entries=4)
    store.put(["a", "b", "c"], unit_rows(3, 1))
    (tmp_path / "index.json").write_text("{broken", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="sparsemm.encoders.text_store"):
        store.put(["d", "e"], unit_rows(2, 2))  # 5 > 4: a compaction
    assert "unreadable" in caplog.text
    kept = TextEmbeddingStore(tmp_path, RECORD, max_entries=4).get(list("abcde"))
    assert {"d", "e"} <= set(kept) and len(kept) >= 3
    np.testing.assert_array_equal(kept["e"], unit_rows(2, 2)[1])
