"""An index folder's manifest and housekeeping: the format and version, reading and
validating ``manifest.json`` with its segments (retrying past a concurrent merge), the
metadata checksum, whether a folder may be (re)placed by a new index, and removing what no
manifest names. The folder layout and the write protocol are described in
:mod:`sparsemm.index.inverted`."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.index.segments import LOCK_FILE, MANIFEST, Segment, load_segment
from sparsemm.io import json_sha256, read_json

logger = logging.getLogger(__name__)

FORMAT = "sparsemm.index"
VERSION = 3  # 3: one-byte impacts in the posting lists (segments.ARRAYS_V3); 2: block-local
# uint16 posting rows (segments.ARRAYS_V2); both, and 1, are read
_SEG_RE = re.compile(r"^seg-\d{6}-[0-9a-f]+$")


def read_index(
    root: Path, attempts: int = 5, in_memory: bool = False
) -> tuple[dict[str, Any], list[Segment]]:
    """Read manifest + segments; retry if a concurrent merge removed a segment meanwhile."""
    if not (root / MANIFEST).is_file():
        raise SparsemmError(
            f"{root} is not a sparsemm index (no {MANIFEST}); build one with `sparsemm index`"
        )
    last_missing: Path | None = None
    for _ in range(attempts):
        manifest = read_json(root / MANIFEST)
        _check_manifest(root, manifest)
        try:
            segments, start = [], 0
            for meta in manifest["segments"]:
                seg = load_segment(root, meta, start, int(manifest["dim"]), in_memory)
                segments.append(seg)
                start += seg.count
        except FileNotFoundError as exc:
            missing = exc.filename or (exc.args[0] if exc.args else None)
            last_missing = Path(str(missing)) if missing is not None else None
            if read_json(root / MANIFEST) != manifest:
                continue  # a writer committed meanwhile: read the new manifest
            break
        if start != int(manifest["count"]):
            raise SparsemmError(f"index {root}: segment counts disagree with the manifest")
        return manifest, segments
    raise SparsemmError(f"index {root} is incomplete: {last_missing} is missing; rebuild the index")


def _check_manifest(root: Path, manifest: Any) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SparsemmError(f"{root}/{MANIFEST} is not a {FORMAT} manifest")
    version, dim = manifest.get("version"), manifest.get("dim")
    if isinstance(version, bool) or not isinstance(version, int):
        raise SparsemmError(
            f"{root}/{MANIFEST} has no valid format version ({version!r}); rebuild the index"
        )
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise SparsemmError(f"{root}/{MANIFEST} has no valid dim ({dim!r}); rebuild the index")
    if version > VERSION:
        raise SparsemmError(
            f"{root} was written by a newer sparsemm (index format v{manifest.get('version')}, "
            f"this one reads v{VERSION}); upgrade sparsemm"
        )
    if not isinstance(manifest.get("segments"), list) or int(manifest.get("dim", 0)) < 1:
        raise SparsemmError(f"{root}/{MANIFEST} is malformed; rebuild the index")
    count = manifest.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise SparsemmError(
            f"{root}/{MANIFEST} has no valid item count ({str(count)[:40]}); rebuild the index"
        )
    for seg in manifest["segments"]:
        counts = [seg.get(k) for k in ("count", "nnz")] if isinstance(seg, dict) else [None]
        if (
            not isinstance(seg, dict)
            or not isinstance(seg.get("name"), str)
            or not seg["name"]
            or "/" in seg["name"]
            or seg["name"] in (".", "..")
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts)
        ):
            raise SparsemmError(
                f"{root}/{MANIFEST} lists a malformed segment ({str(seg)[:80]}); rebuild the index"
            )
    meta = manifest.get("meta", {})
    if not isinstance(meta, dict):
        raise SparsemmError(f"{root}/{MANIFEST}: 'meta' is not an object; rebuild the index")
    recorded = manifest.get("meta_sha256")
    if recorded is None:
        if meta:
            logger.warning(
                "index %s records no checksum of its metadata (written by an older sparsemm): "
                "the model, top_k and labels it names are not verified; `sparsemm index` "
                "writes it again",
                root,
            )
    elif recorded != meta_digest(meta):
        raise SparsemmError(
            f"{root}/{MANIFEST}: its metadata (model, top_k, labels) does not match its "
            "checksum (edited or damaged); rebuild the index with `sparsemm index`"
        )


def meta_digest(meta: Any) -> str:
    """SHA-256 of an index's metadata in a canonical JSON form (the manifest records it)."""
    return json_sha256(meta)


def check_dim(dim: Any) -> None:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise SparsemmError(f"index dimension must be a positive integer, got {dim!r}")


def check_replaceable(root: Path, overwrite: bool) -> int:
    """Check that the index at ``root`` may be replaced; return its next segment number."""
    if not overwrite:
        raise SparsemmError(
            f"an index already exists at {root}; open it, or pass overwrite=True "
            "(--overwrite) to replace it"
        )
    old = read_json(root / MANIFEST)
    if not isinstance(old, dict) or old.get("format") != FORMAT:
        raise SparsemmError(f"{root} holds something other than an index; not replacing it")
    seq = old.get("next_segment", 1)
    return seq if type(seq) is int and seq >= 1 else 1


def _is_leftover(p: Path) -> bool:
    """The lock file, a segment folder or a manifest temp file: what an index writer makes."""
    if p.name == LOCK_FILE:
        return p.is_file()
    if _SEG_RE.match(p.name):
        return p.is_dir()
    return p.is_file() and p.name.startswith(f".{MANIFEST}.") and p.name.endswith(".tmp")


def only_leftovers(root: Path) -> bool:
    """True if ``root`` holds nothing but what a build interrupted before its commit left."""
    return all(_is_leftover(p) for p in root.iterdir())


def remove_unreferenced(root: Path, keep: set[str]) -> None:
    """Delete segment folders and temp files no manifest names (left by crashes/merges)."""
    for p in root.iterdir():
        if p.is_dir() and _SEG_RE.match(p.name) and p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_file() and p.name.startswith(f".{MANIFEST}.") and p.name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                p.unlink()
