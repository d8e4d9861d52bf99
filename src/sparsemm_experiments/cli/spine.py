"""``sparsemm spine``: train SPINE word vectors, inspect their dimensions (``spine eval``, which
evaluates them, comes from the ``sparsemm.spine`` entry points).

A run folder (``-o OUT``) holds::

    config.json, model.safetensors   the SPINE model (SPINE.from_pretrained(OUT))
    checkpoint/                      last training checkpoint (for --resume)
    train_log.json                   per-epoch losses
    input_vectors/                   the dense training vocabulary (raw GloVe rows)
    vectors/                         its SPINE codes (SparseWordVectors.load(OUT) finds them)
    spine_run.json                   the command-line settings of the run
    eval.json                        written by ``sparsemm spine eval``
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from sparsemm.cli.plugins import SPINE_GROUP, registrars
from sparsemm.errors import SparsemmError

DEFAULTS = {"epochs": 150, "batch_size": 512, "lr": 3e-3}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "spine",
        help="sparse interpretable word vectors (SPINE) for the SR sentence bias",
        description="Train SPINE (Subramanian et al. 2018) on GloVe word vectors, inspect the "
        "dimensions, and compare raw vs sparse vectors.",
    )
    sub = parser.add_subparsers(dest="spine_cmd", metavar="CMD", required=True)

    tr = sub.add_parser("train", help="train SPINE and save model + sparse word vectors")
    tr.add_argument("-o", "--out", required=True, type=Path, help="run folder to write")
    tr.add_argument(
        "--glove",
        default="packaged",
        help="'packaged' (GloVe 6B 50-d wheel), a GloVe .txt(.gz) file or a word2vec .bin file",
    )
    tr.add_argument(
        "--top-words", type=int, default=20000, help="most frequent GloVe words to train on"
    )
    tr.add_argument("--captions", type=Path, help="COCO-style JSON whose caption words are added")
    tr.add_argument(
        "--split", default="train", help="split of --captions to use ('all' for every image)"
    )
    tr.add_argument("--hidden", type=int, default=1000, help="SPINE code size")
    tr.add_argument("--noise", type=float, default=None, help="input noise std (config default)")
    tr.add_argument("--epochs", type=int, default=DEFAULTS["epochs"])
    tr.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    tr.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--checkpoint-every", type=int, default=10, help="epochs between checkpoints")
    tr.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (1 is fastest on a busy machine; keep it fixed across --resume)",
    )
    tr.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.set_defaults(func=cmd_train)

    ins = sub.add_parser("inspect", help="top words of a dimension, or top dimensions of a word")
    ins.add_argument("run", type=Path, help="run folder written by 'spine train'")
    what = ins.add_mutually_exclusive_group(required=True)
    what.add_argument("--dim", type=int, help="dimension to show the top words of")
    what.add_argument("--word", help="word to show the top dimensions of")
    ins.add_argument("-k", type=int, default=10, help="how many words / dimensions")
    ins.set_defaults(func=cmd_inspect)

    # `spine eval` (raw GloVe vs SPINE on WordSim-353 and word intrusion) is the research
    # package's, added through the sparsemm.spine entry points.
    for register_command in registrars(SPINE_GROUP):
        register_command(sub)


def cmd_train(args: argparse.Namespace) -> int:
    from sparsemm.data.sources import read_coco
    from sparsemm.io import write_json
    from sparsemm.models.spine import SpineConfig, build_sparse_vectors
    from sparsemm.train.spine import train_spine, training_vocabulary
    from sparsemm.words.vectors import save_word_vectors
    from sparsemm_experiments.glove import load_glove

    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise SparsemmError("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    captions: list[str] = []
    if args.captions:
        split = None if args.split == "all" else args.split
        captions = [c for item in read_coco(args.captions, split=split) for c in item["captions"]]
    glove = load_glove(args.glove)
    vocab = training_vocabulary(glove, captions, top_n=args.top_words)
    cfg_kwargs: dict[str, Any] = {"input_dim": glove.dim, "hidden_dim": args.hidden}
    if args.noise is not None:
        cfg_kwargs["noise_std"] = args.noise
    config = SpineConfig(**cfg_kwargs)
    out: Path = args.out
    model = train_spine(
        vocab,
        config,
        out,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        resume=args.resume,
        progress=not args.no_progress,
        checkpoint_every=args.checkpoint_every,
    )
    # written after training so a refused run (e.g. missing --resume) leaves OUT untouched
    save_word_vectors(vocab, out / "input_vectors")
    write_json(
        out / "spine_run.json",
        {
            "glove": str(args.glove),
            "top_words": args.top_words,
            "captions": str(args.captions) if args.captions else None,
            "split": args.split if args.captions else None,
            "n_words": len(vocab),
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "seed": args.seed,
            "threads": args.threads,
            "config": dataclasses.asdict(config),
        },
    )
    sparse = build_sparse_vectors(model, vocab)
    sparse.save(out / "vectors")
    from sparsemm_experiments.word_quality import sparsity_stats

    stats = sparsity_stats(sparse.matrix)
    print(
        f"trained SPINE on {len(vocab)} words -> {out}: zero share {stats['zero_share']:.3f}, "
        f"mean active dims {stats['mean_active_dims']:.1f} of {config.hidden_dim}"
    )
    return 0


def load_sparse(run: Path) -> Any:
    from sparsemm.words.spine import SparseWordVectors

    if not (run / "vectors").is_dir():
        raise SparsemmError(f"{run} has no vectors/; run 'sparsemm spine train -o {run}'")
    return SparseWordVectors.load(run / "vectors")


def cmd_inspect(args: argparse.Namespace) -> int:
    from sparsemm.words.evaluate import top_words
    from sparsemm_experiments.word_quality import word_dims

    sparse = load_sparse(args.run)
    if args.dim is not None:
        words = top_words(sparse, args.dim, args.k)
        active = int(sparse.matrix[:, [args.dim]].count_nonzero())
        print(f"dim {args.dim} ({active} active words): ", end="")
        print(", ".join(f"{w} {v:.2f}" for w, v in words) if words else "(dead dimension)")
        return 0
    word = args.word.lower() if args.word not in sparse else args.word
    dims = word_dims(sparse, word, args.k)
    print(f"{word}: {int(sparse.matrix[sparse.index[word]].count_nonzero())} active dims")
    for dim, value in dims:
        neighbours = ", ".join(w for w, _ in top_words(sparse, dim, 6))
        print(f"  dim {dim:>4} {value:.2f}  [{neighbours}]")
    return 0
