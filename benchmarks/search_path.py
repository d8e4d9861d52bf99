"""Count what one ``sparsemm search`` walks through, from the CLI to a printed hit.

Runs ``sparsemm search COLLECTION QUERY --no-server`` in this process (once to warm the
caches, then traced) and records, with a profiler hook, every call that a function of the
*orchestration* makes: the front end (``sparsemm.cli``, ``sparsemm.pipeline``), the request
(``sparsemm.query.request``), the searcher, its term checks, its collection handle,
explanations and hits (``query.searcher``, ``query.term_checks``, ``query.handle``,
``query.like``, ``query.index_engine``, ``query.hits``). What those call into the engine
(strategies, whose ranking of a store is their own, scorers, concepts, models, encoders, the
index) counts as one call each; the engine's own insides are not counted, as a reader
following a search top to bottom stops at the scorer's interface. Reported:

* calls: those calls, each counted once per caller and callee (a loop over hits is one);
* functions: the distinct functions those calls join (callers and callees), the unit of
  "touches at most N functions";
* modules: the distinct sparsemm modules they land in;
* climbs: calls, anywhere in the search, from a module into a higher layer (the layers of
  ``tests/test_layers.py``; calls within one package are not climbs);
* parse_query runs: how often the query text was parsed.

    python benchmarks/search_path.py runs/demo/collection "a dog but not a cat" [--list]

Run it at two commits (``git worktree add ../old COMMIT``, then ``PYTHONPATH=../old/src
python benchmarks/search_path.py ...``) to compare a restructuring before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

LAYERS = (
    {"errors"},
    {"io", "linalg", "lru", "runtime", "text"},
    {"concepts", "encoders", "words", "index", "baselines"},
    {"data"},
    {"models"},
    {"train"},
    {"query"},
    {"__init__"},
    {"eval", "viz", "web"},
    {"pipeline"},
    {"cli"},
)
ORCHESTRATION = (
    "sparsemm.cli.",
    "sparsemm.pipeline.",
    "sparsemm.query.request",
    "sparsemm.query.searcher",
    "sparsemm.query.term_checks",
    "sparsemm.query.handle",
    "sparsemm.query.like",
    "sparsemm.query.index_engine",
    "sparsemm.query.hits",
)


def layer_of(module: str) -> int:
    """Layer of a sparsemm module name (sparsemm.query.parse -> the query layer)."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, members in enumerate(LAYERS):
        if top in members:
            return i
    return len(LAYERS)


def _ours(module: str) -> bool:
    return module.startswith("sparsemm") and not module.startswith("sparsemm_experiments")


def trace(argv: list[str]) -> dict[str, Any]:
    from sparsemm.cli.main import build_parser

    args = build_parser().parse_args(argv)
    edges: set[tuple[str, str]] = set()
    climbs: set[tuple[str, str]] = set()
    parses = 0

    def hook(frame: Any, event: str, arg: Any) -> None:
        nonlocal parses
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        back = frame.f_back
        if not _ours(module) or back is None or frame.f_code.co_name.startswith("<"):
            return
        caller = back.f_globals.get("__name__", "")
        callee = f"{module}.{frame.f_code.co_qualname}"
        if callee == "sparsemm.query.parse.parse_query":
            parses += 1
        if not _ours(caller):
            return
        where = f"{caller}.{back.f_code.co_qualname}"
        if caller.split(".")[:2] != module.split(".")[:2] and layer_of(module) > layer_of(caller):
            climbs.add((where, callee))
        if caller.startswith(ORCHESTRATION) and where != callee:
            edges.add((where, callee))

    out = io.StringIO()
    sys.setprofile(hook)
    try:
        with contextlib.redirect_stdout(out):
            code = args.func(args)
    finally:
        sys.setprofile(None)
    return {
        "exit": code,
        "printed": out.getvalue().splitlines(),
        "calls": sorted(edges),
        "modules": sorted({c.rsplit(".", 1)[0] for _, c in edges if "." in c}),
        "climbs": sorted(climbs),
        "parses": parses,
    }


def functions(calls: list[tuple[str, str]]) -> set[str]:
    """The distinct functions a search touches on the counted path: every caller and
    callee of ``calls``, a comprehension or closure counted as the function it is in."""
    return {name.split(".<locals>")[0] for pair in calls for name in pair}


def _module(name: str) -> str:
    """sparsemm.query.searcher.Searcher.answer -> sparsemm.query.searcher."""
    import importlib

    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        with contextlib.suppress(ImportError):
            importlib.import_module(".".join(parts[:i]))
            return ".".join(parts[:i])
    return name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("collection", type=Path)
    ap.add_argument("query")
    ap.add_argument("--list", action="store_true", help="print every call counted")
    a = ap.parse_args()
    from sparsemm.cli.main import main as cli_main

    argv = ["search", str(a.collection), a.query, "--no-server"]
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(argv)  # loads what loads once per process (torch, the text encoder)
    res = trace(argv)
    modules = sorted({_module(c) for _, c in res["calls"]})
    if a.list:
        for caller, callee in res["calls"]:
            print(f"  {caller} -> {callee}")
        for m in modules:
            print(f"  module: {m}")
    first = next((ln for ln in res["printed"] if ln.lstrip()[:1].isdigit()), "(no hit)")
    print(f"first hit: {first.strip()}")
    print(
        f"calls {len(res['calls'])}  functions {len(functions(res['calls']))}  modules "
        f"{len(modules)}  climbs {len(res['climbs'])}  parse_query runs {res['parses']}"
    )
    for caller, callee in res["climbs"]:
        print(f"  climb: {caller} -> {callee}")
    return int(res["exit"] or 0)


if __name__ == "__main__":
    raise SystemExit(main())
