"""``sparsemm export``: write LexLIP lexicon codes for term-based engines.

Examples::

    sparsemm export runs/lexlip/coco/model runs/demo/collection -o runs/export-coco
    sparsemm export MODEL COLLECTION -o OUT --format rank_features --index my-items

Formats (see :mod:`sparsemm_experiments.export`): ``anserini`` writes
``OUT/anserini/docs/docs.jsonl`` (JsonVectorCollection; index it with ``IndexCollection
-collection JsonVectorCollection -input OUT/anserini/docs -impact -pretokenized``) and, with
``--queries``, ``OUT/anserini/queries.tsv``; ``rank_features`` writes ``OUT/es/mapping.json``
(create the index with it), ``OUT/es/bulk.ndjson`` (POST to ``_bulk``) and, with
``--queries``, ``OUT/es/queries.jsonl`` (search bodies). ``OUT/export.json`` records what was
written.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)

FORMATS = ("anserini", "rank_features", "both")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``export`` verb to the ``sparsemm`` parser."""
    p = sub.add_parser(
        "export",
        help="write LexLIP lexicon codes as Anserini / Elasticsearch-OpenSearch documents",
        description="Encode a collection's items with a LexLIP model and write them as "
        "(term, weight) documents: an Anserini JsonVectorCollection (integer impacts "
        "round(w x scale)) and/or Elasticsearch/OpenSearch rank_features bulk files.",
    )
    p.add_argument("model", type=Path, help="LexLIP model folder (sparsemm train lexlip)")
    p.add_argument("collection", type=Path, help="collection folder (sparsemm encode)")
    p.add_argument("-o", "--out", type=Path, required=True, help="output folder")
    p.add_argument("--format", choices=FORMATS, default="both")
    p.add_argument("--split", default=None, help="only items of this split (default: all)")
    p.add_argument(
        "--scale", type=float, default=100.0, help="Anserini impact = round(weight x scale)"
    )
    p.add_argument("--index", default="sparsemm-lexlip", help="Elasticsearch index name")
    p.add_argument("--field", default="lexicon", help="rank_features field name")
    p.add_argument(
        "--queries",
        type=Path,
        default=None,
        help="text file, one query per line: also export their lexicon codes",
    )
    p.add_argument("--cache", type=Path, help="folder for cached EfficientNet features")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from sparsemm.data.collection import open_collection
    from sparsemm.errors import SparsemmError
    from sparsemm.io import read_text_utf8
    from sparsemm.runtime import torch_threads
    from sparsemm_experiments import export as ex
    from sparsemm_experiments.models.lexlip import LexLIPModel
    from sparsemm_experiments.train.lexlip import item_patches

    # the query file first: a bad one fails before the model and features are loaded
    queries: list[str] = []
    if args.queries is not None:
        if not args.queries.is_file():
            raise SparsemmError(f"query file not found: {args.queries}")
        text = read_text_utf8(args.queries, bom=True)
        queries = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not queries:
            raise SparsemmError(f"{args.queries} holds no query")
    model = LexLIPModel.from_pretrained(args.model)
    col = open_collection(args.collection)
    rows = (
        np.flatnonzero(col.split_mask(args.split))
        if args.split is not None
        else np.arange(len(col.items))
    )
    with torch_threads(1):
        patches, mask = item_patches(
            col,
            model.config.image_input,
            args.cache or args.out / "features",
            progress=not args.no_progress,
        )
        codes, _ = model.encode_items(patches[rows], mask[rows])
        qcodes = model.encode_text(queries)[0] if queries else None
    ids = [col.ids[r] for r in rows]
    terms = model.terms
    qids = [f"q{i}" for i in range(len(queries))]
    stats = []
    if args.format in ("anserini", "both"):
        stats.append(
            ex.write_anserini_collection(
                args.out / "anserini" / "docs" / "docs.jsonl", ids, codes, terms, args.scale
            )
        )
        if qcodes is not None:
            stats.append(
                ex.write_anserini_queries(
                    args.out / "anserini" / "queries.tsv", qids, qcodes, terms, args.scale
                )
            )
    if args.format in ("rank_features", "both"):
        from sparsemm.io import write_json

        write_json(args.out / "es" / "mapping.json", ex.rank_features_mapping(args.field))
        stats.append(
            ex.write_rank_features(
                args.out / "es" / "bulk.ndjson", ids, codes, terms, args.index, args.field
            )
        )
        if qcodes is not None:
            stats.append(
                ex.write_rank_features_queries(
                    args.out / "es" / "queries.jsonl", qids, qcodes, terms, args.field
                )
            )
    ex.write_manifest(
        args.out / "export.json",
        {
            "model": str(args.model),
            "collection": str(args.collection),
            "split": args.split,
            "items": len(ids),
            "queries": len(queries),
            "terms": len(terms),
            "anserini_scale": args.scale,
            "es_index": args.index,
            "es_field": args.field,
        },
        stats,
    )
    for st in stats:
        print(f"{st.path}: {st.documents} rows, {st.postings} postings ({st.bytes} bytes)")
    return 0
