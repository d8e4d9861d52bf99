"""``sparsemm spine eval``: raw GloVe vs SPINE on a ``sparsemm spine train`` run folder:
WordSim-353 correlation, sparsity and the word-intrusion distance ratio, written to
``RUN/eval.json`` and printed as a table.

Registered into ``sparsemm spine`` by :func:`register_command` (the ``sparsemm.spine`` entry
points).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError
from sparsemm_experiments.cli.spine import load_sparse
from sparsemm_experiments.data.paths import default_data_dir

logger = logging.getLogger(__name__)


def register_command(commands: argparse._SubParsersAction) -> None:
    """Add ``eval`` to the sub-commands of ``sparsemm spine``."""
    ev = commands.add_parser("eval", help="raw GloVe vs SPINE: WordSim, sparsity, distance ratio")
    ev.add_argument("run", type=Path, help="run folder written by 'spine train'")
    ev.add_argument(
        "--wordsim",
        type=Path,
        default=None,
        help="WordSim-353 .tab file (default: <data>/wordsim/wordsim353.tab when present, "
        "data = $SPARSEMM_DATA or ../shared/data)",
    )
    ev.add_argument("--top-k", type=int, default=5, help="top words per dim for DistRatio")
    ev.add_argument("--seed", type=int, default=0, help="seed for drawing intruders")
    ev.set_defaults(func=cmd_eval)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def cmd_eval(args: argparse.Namespace) -> int:
    from sparsemm.io import write_json
    from sparsemm.words.vectors import load_word_vectors
    from sparsemm_experiments.eval.tables import md_table
    from sparsemm_experiments.word_quality import (
        distance_ratio,
        sparsity_stats,
        wordsim_spearman,
    )

    run: Path = args.run
    if args.wordsim is None:
        default = default_data_dir() / "wordsim" / "wordsim353.tab"
        args.wordsim = default if default.is_file() else None
    if not (run / "input_vectors").is_dir():
        raise SparsemmError(f"{run} has no input_vectors/; run 'sparsemm spine train -o {run}'")
    raw = load_word_vectors(run / "input_vectors")
    sparse = load_sparse(run)
    if sparse.words != raw.words:
        raise SparsemmError(f"{run}: vectors/ and input_vectors/ list different words")
    results: dict[str, dict[str, Any]] = {}
    for name, vectors, matrix in (
        ("raw", raw, raw.vectors),
        ("spine", sparse, sparse.matrix),
    ):
        row: dict[str, Any] = dict(sparsity_stats(matrix))
        row["dim"] = int(matrix.shape[1])
        if args.wordsim is not None:
            rho, n_pairs = wordsim_spearman(vectors, args.wordsim)
            row.update(wordsim_spearman=rho, wordsim_pairs=n_pairs)
        row.update(distance_ratio(matrix, raw.words, raw, top_k=args.top_k, seed=args.seed))
        results[name] = row
    report = {
        "run": str(run),
        "n_words": len(raw),
        "wordsim": str(args.wordsim) if args.wordsim else None,
        "distance_space": "input_vectors (raw GloVe), euclidean",
        "top_k": args.top_k,
        "seed": args.seed,
        "results": results,
    }
    write_json(run / "eval.json", report)
    r, s = results["raw"], results["spine"]
    rows: list[tuple[str, str, str]] = [("dimensions", str(r["dim"]), str(s["dim"]))]
    if args.wordsim is not None:
        rows.append(
            (
                "WordSim-353 Spearman (pairs)",
                f"{_fmt(r['wordsim_spearman'])} ({r['wordsim_pairs']})",
                f"{_fmt(s['wordsim_spearman'])} ({s['wordsim_pairs']})",
            )
        )
    rows += [
        ("zero share", _fmt(r["zero_share"]), _fmt(s["zero_share"])),
        ("mean active dims", _fmt(r["mean_active_dims"], 1), _fmt(s["mean_active_dims"], 1)),
        (
            "distance ratio (dims used / skipped)",
            f"{_fmt(r['dist_ratio'])} ({r['n_dims_used']}/{r['n_dims_skipped']})",
            f"{_fmt(s['dist_ratio'])} ({s['n_dims_used']}/{s['n_dims_skipped']})",
        ),
    ]
    print("\n".join(md_table([f"metric ({len(raw)} words)", "raw GloVe", "SPINE"], rows)))
    logger.debug("eval report: %s", json.dumps(report))
    return 0
