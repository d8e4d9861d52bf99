"""A persistent store of query-text embeddings, shared by every process of one user.

A search embeds its query texts ("a photo of a dog") with the collection's text encoder:
loading MiniLM and one forward pass cost most of a cold ``sparsemm search --no-server``, and
a never-seen word costs a pass on a running server too. :class:`TextEmbeddingStore` keeps
every text embedded so far on disk, keyed by the encoder's identity (its name, model and
dimension as a collection manifest records them, plus the size and modification time of the
model's weights file when the encoder names one), so a text seen before costs a file read
and no encoder at all. :class:`StoredTextEncoder` puts the store in front of an encoder
that is built only on the first text the store does not hold.

On disk (``$SPARSEMM_TEXT_STORE/<key>/``, else ``text-embeddings/<key>/`` under
``$SPARSEMM_CACHE`` or ``~/.cache/sparsemm``; ``SPARSEMM_TEXT_STORE=off`` turns it off):
``index.json`` (the encoder record, and per text its chunk, row and last use),
``journal.jsonl`` (what came since: a first line naming the format and encoder as the
index does, then one ``[text, chunk, row, last use]`` line per new text or newly recorded
use, the last line of a text winning) and ``chunk-*.npy`` files, one per batch of texts
embedded together, float32 ``(n, dim)``, read with ``allow_pickle=False``.
A new text costs one chunk file (written atomically: temp file, then rename) and one append
to the journal, whatever the store holds; the index is written again (atomically) only when
the journal has grown to :data:`COMPACT_LINES` lines or the store passes ``max_entries``
texts, when the least recently used texts are dropped (down to nine-tenths of
``max_entries``) and chunks no text refers to are deleted. A use is recorded with the next
new text, or at once when the store is nine-tenths full (only then do uses choose what
goes). A damaged index or chunk is ignored with a warning and the store starts again empty;
a journal line that cannot be read (a write cut short) is skipped. A chunk another process
dropped (least recently used there) sends this one back to the store on disk, and a
compaction first reads what other processes added. Two processes writing at once lose at
most the other's newest texts; nothing is ever read half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.encoders.base import collection_encoder
from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open
from sparsemm.linalg import normalize_rows

logger = logging.getLogger(__name__)

FORMAT = "sparsemm.text-embeddings"
VERSION = 1
MAX_ENTRIES = 20_000  # ~30 MB of 384-d float32 rows; a JSON index of ~1.5 MB
INDEX = "index.json"
JOURNAL = "journal.jsonl"
# journal lines past which the index is written again and the journal emptied: a put costs
# an append, not a rewrite of the whole index (about 40 ms at 20,000 texts, with the GIL held)
COMPACT_LINES = 2_000
# Encoders whose record (name, model, dim) fixes their outputs: pretrained weights, not a
# table or a test's fake that another collection may fill differently under the same name.
STORED_ENCODERS = frozenset({"minilm", "clip", "blip", "siglip"})


def cache_root() -> Path | None:
    """Where stores live: ``$SPARSEMM_TEXT_STORE``, else ``text-embeddings`` under
    ``$SPARSEMM_CACHE`` (or ``$XDG_CACHE_HOME/sparsemm``, ``~/.cache/sparsemm``); None when
    ``SPARSEMM_TEXT_STORE`` is ``off``."""
    own = os.environ.get("SPARSEMM_TEXT_STORE")
    if own:
        return None if own.lower() in ("off", "0", "no") else Path(own).expanduser()
    base = os.environ.get("SPARSEMM_CACHE")
    if base:
        return Path(base).expanduser() / "text-embeddings"
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return root / "sparsemm" / "text-embeddings"


def weights_stamp(model: str | None) -> str:
    """Size and modification time of the weights under a local model folder (or of the
    packaged MiniLM's), so that new weights under the same name start a new store; empty
    when no local folder is known (a hub name)."""
    folder: Path | None = None
    if model and Path(model).is_dir():
        folder = Path(model)
    elif model in (None, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        try:
            from sparsemm.encoders.minilm import default_model_path

            folder = default_model_path()
        except (ImportError, SparsemmError, OSError):
            folder = None
    if folder is None or not folder.is_dir():
        return ""
    parts = []
    for f in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
    return ";".join(parts)


def encoder_key(record: dict[str, Any]) -> str:
    """A short digest naming one encoder: its manifest record (name, model, dim) and
    :func:`weights_stamp` of its model."""
    ident = {
        "name": str(record.get("name")),
        "model": record.get("model"),
        "dim": int(record.get("dim", 0)),
        "weights": weights_stamp(record.get("model")),
    }
    text = json.dumps(ident, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def _valid_line(e: Any) -> bool:
    """Whether ``e`` is ``[text, chunk file name, row, last use]`` as the store writes it."""
    return (
        isinstance(e, list)
        and len(e) == 4
        and isinstance(e[0], str)
        and isinstance(e[1], str)
        and isinstance(e[2], int)
        and not isinstance(e[2], bool)
        and isinstance(e[3], (int, float))
        and e[1].startswith("chunk-")
        and "/" not in e[1]
    )


class TextEmbeddingStore:
    """Texts -> float32 ``(dim,)`` unit embeddings of one encoder, kept on disk (see the
    module docstring). ``get`` reads, ``put`` adds and writes at once."""

    def __init__(
        self,
        root: str | Path,
        record: dict[str, Any],
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        if max_entries < 1:
            raise SparsemmError(f"the text store must hold at least 1 text, got {max_entries}")
        self.root = Path(root)
        self.record = {k: record.get(k) for k in ("name", "model", "dim")}
        self.dim = int(record["dim"])
        self.max_entries = max_entries
        self._lock = threading.RLock()
        self._entries: dict[str, list[Any]] | None = None  # text -> [chunk, row, last use]
        self._chunks: dict[str, np.ndarray] = {}
        self._journal_lines = 0  # lines in the journal as read or written by this process
        self._used: set[str] = set()  # texts whose new last use is not on disk yet

    @classmethod
    def for_encoder(
        cls, record: dict[str, Any], max_entries: int = MAX_ENTRIES
    ) -> TextEmbeddingStore | None:
        """The user's store of the encoder a manifest's ``text_encoder`` record names; None
        for an encoder this module does not know to be fixed by its record (only the
        built-in pretrained text encoders are) or with the store turned off."""
        root = cache_root()
        if root is None or str(record.get("name")) not in STORED_ENCODERS:
            return None
        return cls(root / encoder_key(record), record, max_entries)

    # -- reading ---------------------------------------------------------------------------
    def _load(self) -> dict[str, list[Any]]:
        if self._entries is not None:
            return self._entries
        self._entries = self._read(wipe=True)
        return self._entries

    def _read(self, wipe: bool) -> dict[str, list[Any]]:
        """The store's texts as on disk (the index, then the journal). A damaged index is
        deleted with the whole store when ``wipe`` (the first read); on a later read (what
        another process may have written meanwhile) it only counts as holding nothing."""
        path = self.root / INDEX
        entries: dict[str, list[Any]] = {}
        if path.is_file():
            try:
                raw = json.loads(path.read_text(encoding="utf-8"))
                if raw.get("format") != FORMAT or raw.get("version") != VERSION:
                    raise ValueError("unknown format")
                if raw.get("encoder") != self.record:
                    raise ValueError("written for another encoder")
                for text, e in raw["texts"].items():
                    if not (isinstance(e, list) and _valid_line([text, *e])):
                        raise ValueError(f"bad entry for {text!r}")
                    entries[text] = [e[0], e[1], float(e[2])]
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                if wipe:
                    self._damaged(f"{path}: {exc}")
                else:
                    logger.warning("text embedding store index unreadable (%s)", exc)
                entries = {}
        self._journal_lines = self._replay(entries, wipe)
        return entries

    def _merged(self, mine: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """What is on disk now, with this process's texts (``mine``) whose chunks are still
        there added, and their last uses where they are later."""
        disk = self._read(wipe=False)
        chunks = {f.name for f in self.root.glob("chunk-*.npy")}  # one listing, not a stat each
        for t, e in mine.items():
            there = disk.get(t)
            if there is None or (there[0] == e[0] and e[2] > there[2]):
                if e[0] in chunks:  # not dropped by another process since
                    disk[t] = e
        return disk

    def _replay(self, entries: dict[str, list[Any]], wipe: bool = True) -> int:
        """Apply the journal's lines to ``entries`` (a line that cannot be read, as the last
        one of a write cut short, is skipped); the number of lines."""
        try:
            with open(self.root / JOURNAL, "rb") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            logger.warning("could not read the text store's journal (%s); skipping it", exc)
            return 0
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and e != self._header():  # another store's journal
                if wipe:
                    self._damaged(f"{self.root / JOURNAL}: written for another encoder")
                entries.clear()
                return 0
            if _valid_line(e):
                entries[e[0]] = [e[1], e[2], float(e[3])]
        return len(lines)

    def _header(self) -> dict[str, Any]:
        """The first line of a journal (and the head of the index): format and encoder."""
        return {"format": FORMAT, "version": VERSION, "encoder": self.record}

    def _chunk(self, name: str) -> np.ndarray:
        arr = self._chunks.get(name)
        if arr is None:
            arr = np.load(self.root / name, allow_pickle=False)
            if arr.dtype != np.float32 or arr.ndim != 2 or arr.shape[1] != self.dim:
                raise ValueError(f"{name} holds {arr.dtype} {arr.shape}, not (n, {self.dim})")
            self._chunks[name] = arr
        return arr

    def _damaged(self, what: str) -> None:
        logger.warning("text embedding store damaged (%s); starting it again", what)
        self._entries = {}
        self._chunks = {}
        if self.root.is_dir():
            for f in self.root.iterdir():
                if f.name in (INDEX, JOURNAL) or f.name.startswith("chunk-"):
                    f.unlink(missing_ok=True)

    def get(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The stored embeddings of those of ``texts`` the store holds (their last use is
        updated in memory; :meth:`put` or :meth:`touch` writes it)."""
        with self._lock:
            entries = self._load()
            out: dict[str, np.ndarray] = {}
            now = time.time()
            for t in texts:
                e = entries.get(t)
                if e is not None and not (self.root / e[0]).is_file():
                    # another process dropped it (least recently used there) since this one
                    # read the store: read it again; a text gone there too is not stored
                    entries = self._entries = self._merged(entries)
                    e = entries.get(t)
                if e is None:
                    continue
                try:
                    out[t] = np.array(self._chunk(e[0])[e[1]], dtype=np.float32)
                except (OSError, ValueError, IndexError) as exc:
                    self._damaged(f"{self.root / e[0]}: {exc}")
                    return {}
                e[2] = now
                self._used.add(t)
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._load())

    # -- writing ---------------------------------------------------------------------------
    def put(self, texts: Sequence[str], emb: np.ndarray) -> None:
        """Add ``texts`` with their ``(len(texts), dim)`` embeddings and write the store;
        a failed write (read-only or full disk) is logged and leaves the store as it was."""
        emb = np.asarray(emb, dtype=np.float32)
        if emb.shape != (len(texts), self.dim):
            raise SparsemmError(
                f"the text store holds {self.dim}-d rows; got {emb.shape} for {len(texts)} texts"
            )
        if not texts:
            return
        with self._lock:
            entries = self._load()
            name = f"chunk-{uuid.uuid4().hex}.npy"
            now = time.time()
            try:
                with atomic_open(self.root / name, "wb") as fh:
                    np.save(fh, np.ascontiguousarray(emb), allow_pickle=False)
            except SparsemmError as exc:
                logger.warning("could not write the text embedding store: %s", exc)
                return
            self._chunks[name] = emb
            for i, t in enumerate(texts):
                entries[t] = [name, i, now]
                self._used.discard(t)
            if len(entries) > self.max_entries or self._journal_lines >= COMPACT_LINES:
                self._compact()
            else:
                self._append([*self._used, *texts])

    def touch(self) -> None:
        """Record the last uses :meth:`get` updated, once the store is nine-tenths full (only
        then do they choose what goes; below that a hit costs no write)."""
        with self._lock:
            if self._used and self._entries and len(self._entries) >= 0.9 * self.max_entries:
                self._append(list(self._used))

    def _append(self, texts: list[str]) -> None:
        """Add a journal line for each of ``texts`` (their chunk, row and last use), in one
        append."""
        entries = self._load()
        lines = [
            json.dumps([t, *entries[t]], ensure_ascii=False, separators=(",", ":"))
            for t in dict.fromkeys(texts)
            if t in entries
        ]
        if not lines:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            path, flags = self.root / JOURNAL, os.O_RDWR | os.O_APPEND | os.O_CREAT
            try:  # a new journal starts with the header
                fd = os.open(path, flags | os.O_EXCL, 0o644)
                lines.insert(0, json.dumps(self._header(), separators=(",", ":")))
            except FileExistsError:
                fd = os.open(path, flags, 0o644)
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":  # a write cut short
                    lines.insert(0, "")
            try:
                os.write(fd, ("\n".join(lines) + "\n").encode("utf-8"))
            finally:
                os.close(fd)
        except OSError as exc:
            logger.warning("could not write the text embedding store: %s", exc)
            return
        self._used.clear()
        self._journal_lines += len(lines)

    def _compact(self) -> None:
        """Drop the least recently used texts past ``max_entries``, write the index and empty
        the journal (its lines are in the index now), and delete unreferenced chunks. What
        other processes added since this one read the store is read first and kept: a
        long-running process (a server) compacting its own old view would drop their texts
        and delete their chunks."""
        self._entries = self._merged(self._load())
        self._evict()
        self._write()

    def _evict(self) -> None:
        entries = self._load()
        if len(entries) > self.max_entries:
            # down to nine-tenths, so that the next new texts are appends, not rewrites
            keep = self.max_entries - self.max_entries // 10
            by_use = sorted(entries, key=lambda t: entries[t][2])
            for t in by_use[: len(entries) - keep]:
                del entries[t]
        used = {e[0] for e in entries.values()}
        for f in self.root.glob("chunk-*.npy"):
            if f.name not in used:
                # another process's newest chunk may not be in our index yet: keep young ones
                try:
                    young = time.time() - f.stat().st_mtime < 60
                except OSError:
                    continue
                if not young:
                    f.unlink(missing_ok=True)
                    self._chunks.pop(f.name, None)

    def _write(self) -> None:
        raw = {**self._header(), "texts": self._entries}
        text = json.dumps(raw, separators=(",", ":"))  # one C call, not a write per token
        try:
            with atomic_open(self.root / INDEX, "w") as fh:
                fh.write(text)
            (self.root / JOURNAL).unlink(missing_ok=True)
        except (SparsemmError, OSError) as exc:
            logger.warning("could not write the text embedding store: %s", exc)
            return
        self._journal_lines = 0
        self._used.clear()


class StoredTextEncoder:
    """A text encoder that answers from a :class:`TextEmbeddingStore` and builds the real
    encoder (``factory()``) only for the first text the store does not hold; texts it
    embeds go into the store. ``name`` and ``dim`` come from the collection's record, so
    reading them builds nothing; any other attribute (``word_vocabulary``, ...) is the real
    encoder's. Only default calls (unit rows) use the store."""

    modalities = ("text",)  # a query-text encoder (read without building the real one)

    def __init__(
        self,
        factory: Callable[[], Any],
        store: TextEmbeddingStore,
        name: str,
        dim: int,
    ) -> None:
        self._factory = factory
        self._base: Any = None
        self._lock = threading.Lock()
        self.store = store
        self.name = name
        self.dim = dim

    @property
    def base(self) -> Any:
        """The real encoder, built on first use."""
        with self._lock:
            if self._base is None:
                logger.debug("building the %s text encoder (a text not in the store)", self.name)
                self._base = self._factory()
            return self._base

    @property
    def loaded(self) -> bool:
        """Whether the real encoder has been built."""
        return self._base is not None

    def load_text_model(self) -> None:
        """Build the real encoder now, not at the first text the store does not hold (a
        server about to meet never-seen words)."""
        _ = self.base

    def __getattr__(self, name: str) -> Any:
        # "base" arrives here when building the encoder raised AttributeError: no recursion
        if name.startswith("_") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        texts = list(texts)
        if not normalize:
            return np.asarray(
                self.base.encode_text(texts, batch_size, normalize=False, progress=progress),
                dtype=np.float32,
            )
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        found = self.store.get(unique)
        missing = [t for t in unique if t not in found]
        if missing:
            emb = np.asarray(
                self.base.encode_text(missing, batch_size, progress=progress), dtype=np.float32
            )
            emb = normalize_rows(emb)
            self.store.put(missing, emb)
            found.update(zip(missing, emb, strict=True))
        else:
            self.store.touch()
        return np.stack([found[t] for t in texts])


def query_text_encoder(info: dict[str, Any], dim: int) -> Any:
    """The text encoder of a collection whose manifest names it ``info`` (``dim``-d texts),
    for query texts: texts embedded before (by any process) come from the user's
    :class:`TextEmbeddingStore`, and the encoder is built only for a text the store does
    not hold (:class:`StoredTextEncoder`)."""

    def build() -> Any:
        return collection_encoder(info, dim, "texts")

    store = TextEmbeddingStore.for_encoder({**info, "dim": dim})
    return build() if store is None else StoredTextEncoder(build, store, str(info["name"]), dim)
