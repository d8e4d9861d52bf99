"""Atomic file writes and safe array loading shared by every stage.

Every artefact is written to a temporary name in the same folder and then renamed over the
target (``os.replace`` is atomic on POSIX), so a crash mid-write leaves the old file intact.
Whole folders are written under a temporary name and swapped in with :func:`replace_dir`;
:func:`find_dir` finds the folder even after a crash in the middle of that swap.
Only pickle-free formats are read: ``np.load(..., allow_pickle=False)``, JSON, safetensors.

Errors a user can fix are reported as :class:`~sparsemm.errors.SparsemmError`: a full disk,
a file-size limit, a read-only or forbidden folder (:class:`WriteError`, also an ``OSError``),
and unreadable or damaged files. :func:`exclusive_lock` keeps a second writer off an output
folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import tokenize
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import scipy.sparse as sp

from sparsemm.errors import SparsemmError

logger = logging.getLogger(__name__)

# errno values of write failures a user can fix (space, quota, size limit, permissions).
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_USER_WRITE_ERRORS = _DISK_FULL | {errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS}


class WriteError(SparsemmError, OSError):
    """A write failed for a reason the user can fix (disk full, permissions, size limit).

    Both a SparsemmError (the CLI prints it on one line) and an OSError (``errno`` is set),
    so code that catches either keeps working.
    """

    def __str__(self) -> str:  # the message, not OSError's "[Errno N] ..." form
        return str(self.args[0]) if self.args else ""


def write_error(exc: OSError, path: str | Path) -> OSError:
    """``exc`` as a :class:`WriteError` naming ``path`` and saying what to do, when its errno
    is one a user can fix (ENOSPC, EDQUOT, EFBIG, EACCES, EPERM, EROFS); else ``exc`` itself.
    A WriteError is re-targeted, e.g. from a temp file to the folder the user asked for."""
    if exc.errno not in _USER_WRITE_ERRORS:
        return exc
    if exc.errno in _DISK_FULL:
        what = "no space left on the device (or the disk quota is used up)"
        fix = "free some space or write to another disk, then run again"
    elif exc.errno == errno.EFBIG:
        what = "file too large for the file system or the file-size limit (ulimit -f)"
        fix = "raise the limit or write to another file system"
    else:
        what = "permission denied" if exc.errno != errno.EROFS else "read-only file system"
        fix = "choose an output folder you can write to"
    err = WriteError(f"cannot write {path}: {what}; {fix}")
    err.errno = exc.errno
    err.strerror = exc.strerror
    return err


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temp file beside ``path``; on clean exit fsync and rename it over ``path``.

    On any failure the temp file is removed and ``path`` is left as it was; a full disk or a
    permission problem raises :class:`WriteError`.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_error(exc, path) from exc
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise write_error(exc, path) from exc
        raise


def resolve_path(path: str | Path) -> Path:
    """``path.resolve()``; the absolute, unresolved path when it runs into a symlink loop
    (RuntimeError up to Python 3.12, OSError ELOOP after), so the file is reported as
    unreadable where it is read instead of stopping a whole run here."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(path))


def decode_utf8(data: bytes, path: str | Path, bom: bool = False) -> str:
    """``data`` (the bytes of text file ``path``) decoded as UTF-8 (``bom``: a leading BOM
    is dropped); SparsemmError naming the file, the line and the likely encoding otherwise."""
    try:
        return data.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            guess, enc = "it looks like UTF-16", "UTF-16"
        else:
            guess = f"byte 0x{data[exc.start]:02x} is not UTF-8; Latin-1 or Windows-1252?"
            enc = "LATIN1"
        raise SparsemmError(
            f"{path}:{line}: the file is not UTF-8 text ({guess}); save it as UTF-8, e.g. "
            f"`iconv -f {enc} -t UTF-8 {Path(path).name} > fixed{Path(path).suffix}`"
        ) from exc


def read_text_utf8(path: str | Path, bom: bool = False) -> str:
    """A UTF-8 text file's contents (see :func:`decode_utf8`)."""
    return decode_utf8(Path(path).read_bytes(), path, bom)


def check_output_dir(path: str | Path) -> Path:
    """Create output folder ``path`` (and its parents) and check it is writable, before a
    long job runs, so a wrong ``-o`` fails at once instead of at the first save."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise SparsemmError(f"{out} exists and is not a folder; choose another output folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test."):
            pass
    except NotADirectoryError as exc:
        raise SparsemmError(
            f"cannot create {out}: a part of the path is a file; choose another output folder"
        ) from exc
    except OSError as exc:
        raise write_error(exc, out) from exc
    return out


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks (the checksum of every artefact
    manifest: collections, index segments, model weights, detectors)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# Files whose checksum this process verified: (path, inode, size, mtime_ns, sha256), so a
# reopen or a second reader does not hash them again (a changed file has a new key).
VERIFIED: set[tuple[str, int, int, int, str]] = set()
VERIFIED_LOCK = threading.Lock()
_WARNED_UNCHECKED: set[str] = set()


def file_key(path: str | Path, digest: str) -> tuple[str, int, int, int, str]:
    """The :data:`VERIFIED` key of ``path``'s current version with checksum ``digest``."""
    st = os.stat(path)
    return (str(path), st.st_ino, st.st_size, st.st_mtime_ns, digest)


def record_digests(folder: str | Path, names: list[str]) -> dict[str, str]:
    """{name: SHA-256} of files just written in ``folder`` (for their manifest), marked as
    verified in this process."""
    out = {n: sha256_file(Path(folder) / n) for n in names}
    with VERIFIED_LOCK:
        VERIFIED.update(file_key(Path(folder) / n, d) for n, d in out.items())
    return out


def check_digests(folder: str | Path, digests: Any, names: list[str], remedy: str) -> None:
    """Refuse, naming the file, any of ``names`` in ``folder`` whose SHA-256 differs from
    ``digests`` (a manifest's ``sha256`` object); once per file version per process.
    ``digests`` None (written before checksums) warns once and checks nothing."""
    folder = Path(folder)
    if digests is None:
        if str(folder) not in _WARNED_UNCHECKED:
            _WARNED_UNCHECKED.add(str(folder))
            logger.warning(
                "%s has no checksums (written by an older sparsemm); only its shapes and "
                "values are checked. %s to add them",
                folder,
                remedy,
            )
        return
    if not isinstance(digests, dict) or not all(isinstance(digests.get(n), str) for n in names):
        raise SparsemmError(f"{folder}: the manifest's checksums are malformed; {remedy}")
    for name in names:
        key = file_key(folder / name, str(digests[name]))
        with VERIFIED_LOCK:
            if key in VERIFIED:
                continue
        if sha256_file(folder / name) != digests[name]:
            raise SparsemmError(
                f"{folder / name} does not match its checksum in the manifest (damaged or "
                f"modified); {remedy}"
            )
        with VERIFIED_LOCK:
            VERIFIED.add(key)


def check_finite(values: np.ndarray, path: str | Path, remedy: str) -> None:
    """Refuse NaN or inf in ``values`` (read from ``path``), naming the file."""
    bad = int(np.size(values) - np.count_nonzero(np.isfinite(values)))
    if bad:
        raise SparsemmError(f"{path} holds {bad} NaN or inf values (damaged); {remedy}")


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_open(path, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=False)
        fh.write("\n")


def json_sha256(obj: Any) -> str:
    """SHA-256 of ``obj`` in a canonical JSON form (sorted keys, ASCII, no spaces): what a
    manifest records to vouch for its own metadata."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def loads(text: str | bytes, where: str | Path) -> Any:
    """``json.loads`` with one-line errors naming ``where``: malformed JSON, nesting too deep
    to read (RecursionError), a number too long to convert."""
    try:
        return json.loads(text)
    except RecursionError:
        raise SparsemmError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an over-long integer
        raise SparsemmError(f"{where}: not valid JSON ({str(exc)[:120]})") from None


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except ValueError as exc:  # UnicodeDecodeError for binary junk
        raise SparsemmError(f"{path} is not valid JSON ({exc}); re-create it") from exc
    try:
        return loads(text, path)
    except SparsemmError as exc:
        raise SparsemmError(f"{exc}; re-create it") from None


# Bytes per write call when saving arrays (bounded temporary memory, no copies).
_WRITE_CHUNK = 16 * 2**20


def save_npy(path: str | Path, arr: np.ndarray) -> None:
    """Write ``arr`` as a ``.npy`` file atomically (format 1.0, C order, no pickle).

    The data goes through Python-level writes rather than ``ndarray.tofile``, whose short
    writes lose the errno: a full disk is reported as such (:class:`WriteError`).
    """
    arr = np.ascontiguousarray(arr)
    if arr.dtype.hasobject:
        raise SparsemmError(f"cannot save an object array to {path}; artefacts hold numbers")
    fmt = np.lib.format
    with atomic_open(path, "wb") as fh:
        fmt.write_array_header_1_0(fh, fmt.header_data_from_array_1_0(arr))
        data = arr.reshape(-1).view(np.uint8)  # the raw bytes, no copy
        for start in range(0, len(data), _WRITE_CHUNK):
            fh.write(data[start : start + _WRITE_CHUNK])


def load_npy(path: str | Path, mmap: bool = False) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise SparsemmError(f"file not found: {path}") from None
    except (ValueError, EOFError, OSError, SyntaxError, tokenize.TokenError) as exc:
        # truncated, not .npy, object arrays; a damaged header fails numpy's header parser
        raise SparsemmError(
            f"{path} is not a plain .npy array or is damaged ({exc}); re-create it"
        ) from exc


def save_csr(path: str | Path, mat: sp.csr_matrix) -> None:
    with atomic_open(path, "wb") as fh:
        sp.save_npz(fh, sp.csr_matrix(mat), compressed=False)


def load_csr(path: str | Path) -> sp.csr_matrix:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    try:
        return sp.csr_matrix(sp.load_npz(path))  # load_npz reads with allow_pickle=False
    except (ValueError, EOFError, KeyError, OSError, zipfile.BadZipFile) as exc:
        raise SparsemmError(
            f"{path} is not a sparse-matrix .npz or is damaged ({exc}); re-create it"
        ) from exc


def json_line(obj: Any) -> str:
    """``obj`` as one line of JSON, readable as UTF-8: non-ASCII text as it is, except that
    a string holding an undecodable byte of a file name (a lone surrogate, as
    ``os.fsdecode`` gives for ``caf\\xe9.png``) is written as an escape, which reads back
    to the same name."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True)
    return text


def write_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with atomic_open(path, "w") as fh:
        for row in rows:
            fh.write(json_line(row))
            fh.write("\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise SparsemmError(f"file not found: {path}")
    rows = []
    try:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    rows.append(loads(line, f"{path}:{lineno}"))
    except UnicodeDecodeError as exc:
        raise SparsemmError(f"{path} is not UTF-8 text ({exc}); re-create it") from exc
    return rows


def fsync_dir(path: str | Path) -> None:
    """Flush a folder's entries (renames, new files) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def old_dir(target: str | Path) -> Path:
    """Where :func:`replace_dir` parks the previous ``target`` while it swaps a new one in."""
    target = Path(target)
    return target.with_name(f".{target.name}.old")


def find_dir(target: str | Path) -> Path:
    """``target``, or its parked previous version when a crash hit :func:`replace_dir`
    between moving the old folder aside and moving the new one in; else ``target``."""
    target = Path(target)
    if not os.path.lexists(target) and old_dir(target).is_dir():
        return old_dir(target)
    return target


def replace_dir(new: str | Path, target: str | Path) -> None:
    """Move the folder ``new`` to ``target``, replacing the folder there (if any).

    Steps: (1) an existing ``target`` is renamed to ``.<name>.old`` beside it, (2) ``new``
    is renamed to ``target``, (3) the old folder is deleted. A crash after (1) leaves the
    previous version at ``.<name>.old``, where :func:`find_dir` finds it and the next
    ``replace_dir`` takes it as the version to replace; a crash at any other point leaves
    ``target`` holding the old or the new folder. Both paths must be on one file system
    (``new`` is normally a temp folder beside ``target``). Raises SparsemmError when
    ``target`` exists and is not a folder; if step (2) fails the old folder is put back.
    """
    new, target = Path(new), Path(target)
    if os.path.lexists(target) and not target.is_dir():
        raise SparsemmError(f"{target} exists and is not a folder; choose another output path")
    old = old_dir(target)
    parked = False
    if target.is_dir():
        if os.path.lexists(old):
            # ``target`` is intact, so a folder still parked here is a leftover of a crash.
            _remove(old)
        try:
            os.replace(target, old)
        except OSError as exc:
            raise write_error(exc, target) from exc
        parked = True
    # else: nothing at ``target``; a folder at ``old`` (if any) is the version being replaced
    try:
        os.replace(new, target)
    except BaseException as exc:
        if parked:
            with contextlib.suppress(OSError):
                os.replace(old, target)
        if isinstance(exc, OSError):
            raise write_error(exc, target) from exc
        raise
    with contextlib.suppress(OSError):
        fsync_dir(target.parent)
    if os.path.lexists(old):
        _remove(old)


def _remove(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as exc:  # the new folder is in place; a leftover only costs disk space
        logger.warning("could not remove %s (%s); delete it by hand", path, exc)


# -------------------------------------------------------------------------------- writer lock

# (lock path, thread id) -> nesting depth of exclusive_lock held by this process.
_HELD: dict[tuple[str, int], int] = {}


def lock_path(target: str | Path) -> Path:
    """The lock file guarding writes to ``target``: ``.<name>.lock`` beside it."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


@contextlib.contextmanager
def exclusive_lock(
    path: str | Path, what: str, busy: Callable[[str], str] | None = None
) -> Iterator[None]:
    """Hold the lock file ``path`` (``fcntl.flock``, exclusive, non-blocking) or raise
    SparsemmError at once, naming ``what`` (e.g. "collection runs/x") and the holder's pid;
    ``busy``: the message instead, from the holder (" (pid N)", or "").

    Re-entrant within one thread. The kernel drops the lock when its process dies (kill -9
    included), so a crash never leaves a stale lock; the file is deleted on release, and a
    process that locked a file just deleted by the holder sees that the path no longer
    names its file and locks the new one, so two writers never both hold it.
    """
    path = Path(os.path.abspath(path))
    key = (str(path), threading.get_ident())
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(exc, path) from exc
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise write_error(exc, path) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _lock_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise SparsemmError(
                    busy(holder)
                    if busy is not None
                    else f"{what} is being written by another process{holder} (lock file "
                    f"{path}); wait for it to finish, then retry"
                ) from exc
            raise
        try:
            st = os.stat(path)
            mine = os.fstat(fd)
            same = (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder deleted this file as we locked it: retry
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = 1
    try:
        yield
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one included)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def lock_holder(path: str | Path) -> int | None:
    """The pid of the live process holding the lock file ``path`` (:func:`exclusive_lock`),
    or None: no file, or the pid it names has ended (killed: the kernel released its lock).
    Reads only, so a writer taking the lock at that moment is never refused for it."""
    try:
        pid = _pid_in(Path(path).read_bytes()[:32])
    except OSError:
        return None
    return pid if pid is not None and pid_alive(pid) else None


def _lock_holder(fd: int) -> str:
    """' (pid N)' from an open lock file's content, or '' when it holds none."""
    try:
        pid = _pid_in(os.pread(fd, 32, 0))
    except OSError:
        return ""
    return f" (pid {pid})" if pid is not None else ""


def _pid_in(content: bytes) -> int | None:
    """The pid a lock file holds (its holder writes it), or None."""
    text = content.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
