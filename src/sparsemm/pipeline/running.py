"""Running servers: ``sparsemm serve`` announces itself, ``sparsemm search`` forwards to it.

A cold ``sparsemm search`` spends seconds importing torch and sentence-transformers and
loading the model and text encoder. A ``sparsemm serve`` of the same collection has all of
that loaded, so when one is up the search sends the query to its JSON API instead and only
prints the answer (standard library only: no numpy, no torch).

While it runs, the server keeps a small record file per collection,
``<runtime dir>/servers/<hash of the collection's absolute path>.json`` =
``{"url", "pid", "collection"}``, removed when it stops. The runtime dir is
``$SPARSEMM_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/sparsemm``, else
``~/.cache/sparsemm``. A record whose process is gone, a server that does not answer
within ten seconds, or a server error makes the search run locally as before; a query
the server refuses as bad input (HTTP 400) is reported like a local error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mimetypes
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparsemm.data.collection import collection_root, moved_photos, photo_file
from sparsemm.errors import SparsemmError
from sparsemm.io import read_json
from sparsemm.query.request import MAX_K, MAX_OFFSET, MAX_TERMS

log = logging.getLogger(__name__)

# A warm server answers in milliseconds, its first query may take seconds (JIT, detector
# fits); a local cold search takes longer still. Past this, search locally.
FORWARD_TIMEOUT_S = 10.0
UPLOAD_LIMIT = 8 * 2**20  # the server's upload limit (sparsemm.web.images.MAX_UPLOAD_BYTES)


class NotOnServer(SparsemmError):
    """The server has no such item (HTTP 404): the caller words it as a local search would."""


def within_server_limits(k: int, offset: int, exclude: list[str]) -> bool:
    """Whether the server accepts a search of this size (the CLI itself allows more)."""
    return 1 <= k <= MAX_K and 0 <= offset <= MAX_OFFSET and (len(exclude) <= MAX_TERMS)


def runtime_dir() -> Path:
    """Where running servers leave their records."""
    if os.environ.get("SPARSEMM_RUNTIME_DIR"):
        return Path(os.environ["SPARSEMM_RUNTIME_DIR"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "sparsemm"
    return Path.home() / ".cache" / "sparsemm"


def record_path(collection: str | Path) -> Path:
    """The record file of a server of ``collection`` (by the resolved absolute path of the
    collection folder it names: a photo folder and its collection share one record)."""
    key = str(collection_root(Path(collection).expanduser()).resolve())
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return runtime_dir() / "servers" / f"{digest}.json"


def server_url(host: str, port: int) -> str:
    """The URL a local client reaches a server bound to ``host``:``port`` at."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}"


@contextlib.contextmanager
def announce(collection: str | Path, host: str, port: int) -> Iterator[Path | None]:
    """Keep a record of this server for ``collection`` while the block runs.

    Best effort: a runtime dir that cannot be written only means searches are not
    forwarded (yields None then). The record is removed at the end if it is still ours.
    """
    path = record_path(collection)
    record = {
        "url": server_url(host, port),
        "pid": os.getpid(),
        "collection": str(Path(collection).expanduser().resolve()),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".server-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)
    except OSError as exc:
        log.info("not announcing the server for sparsemm search (%s)", exc)
        yield None
        return
    try:
        yield path
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
                path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def find_server(collection: str | Path) -> str | None:
    """The URL of a running server of ``collection``, or None."""
    path = record_path(collection)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        url, pid = str(record["url"]), int(record["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _alive(pid):
        with contextlib.suppress(OSError):
            path.unlink()  # a server killed without cleaning up
        return None
    return url


def forward_search(
    url: str,
    query: str,
    exclude: list[str],
    k: int,
    offset: int,
    strategy: str | None,
    timeout: float = FORWARD_TIMEOUT_S,
    *,
    min_score: float | None = None,
    like: str | None = None,
) -> dict[str, Any] | None:
    """The server's ``/api/search`` answer (SearchOut as a dict), or None to search locally.
    ``like``: an item id ("more like this" item).

    Raises SparsemmError with the server's message when it refuses the query as bad input.
    """
    params = _params(query, exclude, k, offset, strategy, min_score)
    if like is not None:
        params.append(("like", like))
    request = urllib.request.Request(
        f"{url}/api/search?{urllib.parse.urlencode(params)}",
        headers={"Accept": "application/json"},
    )
    return _answer(url, request, timeout)


def forward_image(
    url: str,
    image: str | Path,
    query: str,
    exclude: list[str],
    k: int,
    offset: int,
    strategy: str | None,
    timeout: float = FORWARD_TIMEOUT_S,
    *,
    min_score: float | None = None,
) -> dict[str, Any] | None:
    """The server's ``/api/search/image`` answer for "more like" the picture file ``image``
    (sent as the request body: the server embeds it with the encoders it has loaded), or
    None to search locally (a file over the server's upload limit, no answer)."""
    path = Path(image)
    try:
        if path.stat().st_size > UPLOAD_LIMIT:
            return None
        data = path.read_bytes()
    except OSError:
        return None  # the local search names the problem
    params = _params(query, exclude, k, offset, strategy, min_score)
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    request = urllib.request.Request(
        f"{url}/api/search/image?{urllib.parse.urlencode(params)}",
        data=data,
        method="POST",
        headers={"Accept": "application/json", "Content-Type": kind},
    )
    return _answer(url, request, timeout)


def _params(
    query: str,
    exclude: list[str],
    k: int,
    offset: int,
    strategy: str | None,
    min_score: float | None,
) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = [("q", query), ("k", str(k)), ("offset", str(offset))]
    params += [("exclude", term) for term in exclude]
    if strategy:
        params.append(("strategy", strategy))
    if min_score is not None:
        params.append(("min_score", repr(float(min_score))))
    return params


def _answer(url: str, request: urllib.request.Request, timeout: float) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            answer: dict[str, Any] = json.loads(resp.read().decode("utf-8"))
            return answer
    except urllib.error.HTTPError as exc:
        if exc.code in (400, 404):  # the query's own fault (404: no such item to be like)
            with contextlib.suppress(ValueError, OSError):
                message = json.loads(exc.read().decode("utf-8")).get("error")
                if message:
                    raise (NotOnServer if exc.code == 404 else SparsemmError)(
                        str(message)
                    ) from None
        log.debug("server %s answered %s; searching locally", url, exc.code)
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        log.debug("server %s did not answer (%s); searching locally", url, exc)
    return None


def item_images(collection: str | Path, ids: set[str]) -> dict[str, str | None]:
    """The absolute image path of each of the items ``ids`` (None: no image), read from the
    collection's ``items.jsonl`` as ``sparsemm search`` prints them (-f, --json): where the
    photo is now when its folder moved since `up`, or a copy of it when it was deleted
    (sparsemm.data.collection.photo_file)."""
    root = collection_root(collection)
    try:
        manifest = read_json(root / "manifest.json")
        moved = moved_photos(root, manifest)
    except (SparsemmError, OSError):
        manifest, moved = None, None
    out: dict[str, str | None] = {}
    with open(root / "items.jsonl", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            if not line.strip():
                continue
            item = json.loads(line)
            item_id = str(item.get("id"))
            if item_id not in ids:
                continue
            path = photo_file(item, root, manifest, moved)
            out[item_id] = None if path is None else str(path)
            if len(out) == len(ids):
                break
    return out
