"""``sparsemm encode``: embed a data source into a collection folder.

Examples::

    sparsemm encode ../shared/data/coco/val2017.json -o runs/coco-minilm
    sparsemm encode captions.jsonl -o runs/mine --encoder clip --model ./clip-vit-b32
    sparsemm encode photos/ -o runs/photos --encoder blip
"""

from __future__ import annotations

import argparse
from typing import Any

from sparsemm.data.sources import FORMATS
from sparsemm.errors import SparsemmError

# sparsemm.data.encode.BAD_IMAGE_POLICIES, written out so that building the parser does not
# import the encoders (torch); tests/cli/test_cli_cold_start.py checks that they agree.
BAD_IMAGE_POLICIES = ("skip", "fail")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def register(subparsers: Any) -> None:
    """Add the ``encode`` verb to the ``sparsemm`` parser."""
    p = subparsers.add_parser(
        "encode",
        help="embed captions/images into a collection folder",
        description="Embed a data source (COCO json, captions JSONL/CSV, or an image folder) "
        "into a collection folder. Items without images (or with a text-only encoder) get a "
        "caption view: the normalised mean of their caption embeddings. Re-running with the "
        "same source and settings reuses the existing collection.",
    )
    p.add_argument("source", help="COCO json, .jsonl/.csv captions file, or image folder")
    p.add_argument("-o", "--out", required=True, help="output collection folder")
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="source format (default: from the extension; a folder means images)",
    )
    p.add_argument(
        "--encoder",
        default="minilm",
        help="registered encoder: minilm (default, offline), clip, blip, efficientnet "
        "(images, offline), precomputed",
    )
    p.add_argument(
        "--text-encoder",
        help="a second encoder for the captions when --encoder embeds images only "
        "(e.g. --encoder efficientnet --text-encoder minilm)",
    )
    p.add_argument(
        "--model",
        help="model name or local folder for the encoder (precomputed: the .npy table, "
        "one row per item id, ids in X.ids.txt beside it)",
    )
    p.add_argument("--split", help="keep only items of this split (e.g. train, test)")
    p.add_argument("--limit", type=_positive_int, help="keep only the first N items")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="encoder batch size")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument("--force", action="store_true", help="re-encode even if OUT is up to date")
    p.add_argument(
        "--on-bad-image",
        choices=BAD_IMAGE_POLICIES,
        default="skip",
        help="an image that cannot be read (missing, truncated, corrupt, unsupported, too "
        "large): 'skip' leaves its item out and lists it in OUT/skipped.jsonl (default); "
        "'fail' stops at the first one",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Encode ``args.source`` into ``args.out`` and print a one-line summary."""
    from sparsemm.data.collection import SKIPPED
    from sparsemm.data.encode import encode_source

    if not args.encoder:
        raise SparsemmError("--encoder must not be empty")
    col = encode_source(
        args.source,
        args.out,
        format=args.format,
        encoder=args.encoder,
        model=args.model,
        split=args.split,
        limit=args.limit,
        batch_size=args.batch_size,
        progress=not args.no_progress,
        force=args.force,
        text_encoder=args.text_encoder,
        on_bad_image=args.on_bad_image,
    )
    skipped = col.skipped()
    if skipped:
        first = skipped[0]
        print(
            f"skipped {len(skipped)} item(s) whose image could not be read, listed in "
            f"{col.root / SKIPPED}; e.g. {first.get('image')}: {first.get('error')}"
        )
    print(
        f"{len(col.items)} items, {len(col.texts)} texts, dim {col.dim}, "
        f"{col.manifest.get('image_kind', 'no')} image embeddings -> {col.root}"
    )
    return 0
