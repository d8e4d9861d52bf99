"""``sparsemm up``: a folder of photos to a search page in one command.

Steps (each reuses the project's own machinery): read the folder (and an optional captions
file) -> embed new or changed images with EfficientNet-Lite0 (captions with MiniLM) into
``OUT/collection`` -> the ImageNet concept model in ``OUT/model`` (built once, no training,
no captions needed; or ``--model`` for a trained SR/VDR/concept model) -> index -> serve
(``sparsemm serve``). A re-run embeds only new or changed photos and adds them to the
index; photos gone from the folder are removed from the collection, and it says so.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from sparsemm.cli.serve import DEFAULT_HOST, DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT
from sparsemm.errors import SparsemmError

log = logging.getLogger(__name__)

OUT_NAME = ".sparsemm"  # default output: a hidden folder inside the photo folder
COLLECTION = "collection"
MODEL = "model"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="one command from a folder of photos to a search page (encode, model, index, "
        "serve); re-runs add only new or changed photos",
        description="Embeds the photos under PHOTOS with the offline EfficientNet-Lite0 "
        "(captions, if given, with MiniLM), codes them over the 1000 named ImageNet classes "
        "(no captions or training needed), indexes them and serves the search page. "
        "Output goes to PHOTOS/.sparsemm unless -o says otherwise; a re-run embeds only new "
        "or changed photos and adds them to the index.",
    )
    p.add_argument("photos", type=Path, help="folder of images (searched recursively)")
    p.add_argument(
        "--captions",
        type=Path,
        default=None,
        help="optional JSONL/CSV with id (or image) and caption(s) per photo; shown on the "
        "page and used by the hybrid scorer's word detectors",
    )
    p.add_argument(
        "-o", "--out", type=Path, default=None, help=f"output folder (default PHOTOS/{OUT_NAME})"
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="index with this saved model instead of the ImageNet concept model (it must "
        "have been trained on EfficientNet + MiniLM embeddings)",
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--no-serve",
        action="store_true",
        help="stop after indexing (serve later with `sparsemm serve OUT/collection`)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


# The collection's image encoder (sparsemm.encoders.efficientnet with the packaged weights)
EFFICIENTNET_INFO = {"name": "efficientnet", "dim": 1280, "model": "efficientnet-lite0"}


def minilm_info() -> dict[str, Any]:
    """The manifest entry of the offline text encoder, without loading it (10 s)."""
    from sparsemm.encoders.minilm import DEFAULT_DIM

    return {"name": "minilm", "dim": DEFAULT_DIM, "model": "all-MiniLM-L6-v2"}


def _lazy(name: str) -> Any:
    built: list[Any] = []

    def get() -> Any:
        if not built:
            from sparsemm.encoders.base import get_encoder

            built.append(get_encoder(name))
        return built[0]

    return get


def ensure_model(out: Path, model: Path | None, progress: bool) -> Path:
    """The model folder to index with: ``model`` if given, else ``OUT/model`` (the ImageNet
    concept model, copied there from the user cache, built on first use)."""
    from sparsemm.models.base import CONFIG_FILE
    from sparsemm.query.code_models import load_code_model

    if model is not None:
        from sparsemm.models.base import check_encoders

        # a clear error now, not after encoding: the model must read these encoders
        manifest = {"encoder": EFFICIENTNET_INFO, "text_encoder": minilm_info()}
        check_encoders(load_code_model(model).training_info, manifest, model, out / COLLECTION)
        return model
    target = out / MODEL
    if target.is_dir() and any(target.iterdir()) and not (target / CONFIG_FILE).is_file():
        raise SparsemmError(f"{target} exists and is not a sparsemm model; choose another -o")
    if (target / CONFIG_FILE).is_file():
        try:
            load_code_model(target)
            return target
        except SparsemmError as exc:
            log.warning("the model in %s is unusable (%s); writing it again", target, exc)
    from sparsemm.models.concepts import cached_imagenet_concepts, default_cache_dir

    if not (default_cache_dir() / CONFIG_FILE).is_file():
        _say(
            "building the ImageNet concept model: embedding 2,860 class names and glosses "
            f"(once; kept in {default_cache_dir()})"
        )
    cached_imagenet_concepts(progress=progress).save_pretrained(target)
    return target


def index_collection(col_dir: Path, model_dir: Path, report: Any) -> tuple[Any, str]:
    """Add the new items to the existing index when that is exact, else (re)build it.
    Returns (index, what was done)."""
    from sparsemm.data.collection import open_collection
    from sparsemm.index import InvertedIndex
    from sparsemm.linalg import normalize_rows
    from sparsemm.query.code_models import load_code_model
    from sparsemm.query.searcher import INDEX_DIR, build_index

    col = open_collection(col_dir)
    root = col.root / INDEX_DIR
    reason = "new collection"
    if (root / "manifest.json").is_file():
        index = InvertedIndex.open(root)
        meta = index.meta or {}
        ids, n_old = col.ids, len(index)
        same_model = meta.get("model") == str(model_dir.resolve())
        prefix = list(index.ids) == ids[:n_old]
        if same_model and prefix and n_old == len(ids):
            return index, "index up to date"
        model = load_code_model(model_dir, int(meta.get("top_k") or 0) or None)
        # Only the concept model codes a subset of items on its own, with fixed labels (class
        # names); an SR index's data-derived labels would go stale, and VDR caches features
        # of the whole collection.
        if same_model and prefix and model.kind == "imagenet_concepts":
            sub = _SubCollection(col, n_old)
            codes = normalize_rows(model.encode_items(sub))  # type: ignore[arg-type]
            index.add(codes, ids[n_old:])
            return index, f"added {len(ids) - n_old} items to the index"
        reason = (
            "the model changed"
            if not same_model
            else "photos changed or were removed"
            if not prefix
            else f"a {model.kind} index is rebuilt whole"
        )
    elif report is not None and (report.changed or report.removed):
        reason = "photos changed or were removed"
    elif report is not None and not report.created:
        reason = "no index yet"
    index = build_index(col_dir, model_dir)
    return index, f"built the index ({reason})"


class _SubCollection:
    """The items of a collection from row ``start`` on, for coding only the new ones."""

    def __init__(self, col: Any, start: int) -> None:
        self._col = col
        self._start = start
        self.root = col.root
        self.manifest = col.manifest
        self.items = col.items[start:]
        self.encoder_name = col.encoder_name

    def image_embeddings(self, mmap: bool = False) -> Any:
        return self._col.image_embeddings(mmap)[self._start :]


def _say(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    from sparsemm.data.sync import read_photos, sync_folder
    from sparsemm.encoders.base import get_encoder

    t0 = time.perf_counter()
    progress = not args.no_progress
    photos = Path(args.photos).expanduser()
    if args.captions is not None and not Path(args.captions).is_file():
        raise SparsemmError(f"captions file not found: {args.captions}")
    if not 1 <= args.port <= 65535:
        raise SparsemmError(f"--port must be in 1..65535, got {args.port}")
    items = read_photos(photos, args.captions)
    out = Path(args.out) if args.out is not None else photos / OUT_NAME
    if out.exists() and not out.is_dir():
        raise SparsemmError(f"{out} exists and is not a folder; choose another -o")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise SparsemmError(
            f"cannot write the output folder {out} ({exc.strerror or exc}); pass -o OUT to "
            "put it somewhere writable"
        ) from exc
    col_dir = out / COLLECTION
    _say(f"{len(items)} photos in {photos} -> {out}")

    model_dir = ensure_model(out, args.model, progress)
    encoder = get_encoder("efficientnet")
    report = sync_folder(
        items,
        col_dir,
        encoder,
        _lazy("minilm"),
        minilm_info(),
        source=photos,
        batch_size=args.batch_size,
        progress=progress,
    )
    if report.norms:
        from sparsemm.models.concepts import record_norms

        record_norms(report.collection.root, report.norms)
    _say(
        f"collection: {len(report.collection.items)} photos ({len(report.added)} new, "
        f"{len(report.changed)} changed, {report.unchanged} unchanged)"
    )
    if report.removed:
        shown = ", ".join(report.removed[:5]) + (" ..." if len(report.removed) > 5 else "")
        _say(f"removed {len(report.removed)} photo(s) no longer in the folder: {shown}")
    if report.skipped:
        first = report.skipped[0]
        _say(
            f"warning: skipped {len(report.skipped)} unreadable image(s), e.g. {first['id']}: "
            f"{first['error']} (listed in {col_dir}/skipped.jsonl)"
        )
    index, what = index_collection(col_dir, model_dir, report)
    _say(f"{what}: {len(index)} items, {index.nnz / max(len(index), 1):.1f} concepts each")
    _say(f"ready in {time.perf_counter() - t0:.1f} s")
    if args.no_serve:
        _say(f"serve it with: sparsemm serve {col_dir}")
        return 0
    return _serve(col_dir, args)


def check_port_free(host: str, port: int) -> None:
    """SparsemmError when ``host:port`` cannot be bound (e.g. an earlier ``up`` still
    serves there), before the text encoder is loaded rather than after."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise SparsemmError(
                f"cannot listen on {host}:{port} ({exc.strerror or exc}); stop the server "
                "already there (an earlier sparsemm up/serve?) or pass --port"
            ) from exc


def _serve(col_dir: Path, args: argparse.Namespace) -> int:
    from sparsemm.cli import serve

    check_port_free(args.host, args.port)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    ns = argparse.Namespace(
        collection=col_dir,
        host=args.host,
        port=args.port,
        allow_host=[],
        max_connections=DEFAULT_MAX_CONNECTIONS,
        cors_origin=[],
    )
    _say(
        f"search page: http://{shown}:{args.port}/ (answers once the text encoder is loaded, "
        "about 10 s; Ctrl+C to stop)"
    )
    sys.stdout.flush()
    return serve.run(ns)
