"""``sparsemm up``: a folder of photos to a search page in one command
(:func:`sparsemm.pipeline.up.up`, then :func:`sparsemm.pipeline.serve.serve`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sparsemm.data.collection import UP_DIR_NAME
from sparsemm.pipeline.serve import DEFAULT_HOST, DEFAULT_PORT
from sparsemm.pipeline.up import ENCODERS, MIN_TRAIN_PHOTOS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="one command from a folder of photos to a search page (encode, model, index, "
        "serve); re-runs add only new or changed photos",
        description="Embeds the photos under PHOTOS with the offline EfficientNet-Lite0 "
        "(captions, if given, with MiniLM), codes them over the 1000 named ImageNet classes "
        "and the faces it finds (no captions or training needed; query words are read "
        "through WordNet) or, when at least "
        f"{MIN_TRAIN_PHOTOS} photos have captions, with an SR model trained on them, "
        "indexes them and serves the search page. "
        "Output goes to PHOTOS/.sparsemm unless -o says otherwise; a re-run embeds only new "
        "or changed photos and adds them to the index.",
    )
    p.add_argument("photos", type=Path, help="folder of images (searched recursively)")
    p.add_argument(
        "--captions",
        type=Path,
        default=None,
        help="optional JSONL/CSV with id (or image) and caption(s) per photo; shown on the "
        f"page, and an SR model is trained on them when {MIN_TRAIN_PHOTOS} or more photos "
        "have one",
    )
    p.add_argument(
        "-o", "--out", type=Path, default=None, help=f"output folder (default PHOTOS/{UP_DIR_NAME})"
    )
    p.add_argument(
        "--model",
        type=Path,
        default=None,
        help="index with this saved model instead of the ImageNet concept model (it must "
        "have been trained on EfficientNet + MiniLM embeddings)",
    )
    train = p.add_mutually_exclusive_group()
    train.add_argument(
        "--train",
        action="store_true",
        help=f"train an SR model on the captions even with fewer than {MIN_TRAIN_PHOTOS} "
        "captioned photos (again, if one was trained before)",
    )
    train.add_argument(
        "--no-train",
        action="store_true",
        help="never train: keep the ImageNet concept model whatever the captions",
    )
    p.add_argument(
        "--encoder",
        choices=ENCODERS,
        default="efficientnet",
        help="image encoder: efficientnet (offline, the default: ImageNet classes and faces) "
        "or clip / siglip (Hugging Face weights, downloaded to its cache on first use): "
        "SpLiCE concept codes and zero-shot probabilities, no training",
    )
    p.add_argument(
        "--encoder-model",
        default=None,
        help="hub name or local folder of the clip / siglip weights (default "
        "openai/clip-vit-base-patch32, google/siglip-base-patch16-224)",
    )
    p.add_argument(
        "--vocabulary",
        type=Path,
        default=None,
        help="clip / siglip: a concept file (one concept a line, least to most frequent, "
        "e.g. SpLiCE's laion.txt) added to the ImageNet and COCO concepts",
    )
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--no-serve",
        action="store_true",
        help="stop after indexing (serve later with `sparsemm serve PHOTOS`)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _say(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    from sparsemm.pipeline.serve import check_address, check_port_free, serve
    from sparsemm.pipeline.up import example_query, up

    check_address(args.host, args.port)
    report = up(
        args.photos,
        captions=args.captions,
        out=args.out,
        model=args.model,
        train=args.train,
        no_train=args.no_train,
        encoder=args.encoder,
        encoder_model=args.encoder_model,
        vocabulary=args.vocabulary,
        batch_size=args.batch_size,
        progress=not args.no_progress,
        say=_say,
    )
    _say(f"ready in {report.seconds:.1f} s")
    col_dir = report.collection_dir
    if args.no_serve:
        # the folder the user named: search and serve find the collection inside it
        named = shlex.quote(str(args.out if args.out is not None else args.photos))
        _say(
            f'search it with: sparsemm search {named} "{example_query(col_dir)}"; '
            f"serve it with: sparsemm serve {named}"
        )
        return 0
    check_port_free(args.host, args.port)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    _say(
        f"search page: http://{shown}:{args.port}/ (answers once the text encoder is loaded, "
        "about 10 s; Ctrl+C to stop)"
    )
    sys.stdout.flush()
    serve(col_dir, args.host, args.port)
    return 0
