"""Cold-start wall time of the ``sparsemm`` command: a fresh process per run.

Times ``sparsemm --help``, ``sparsemm search --list-strategies``, a real
``sparsemm search COLLECTION QUERY --no-server`` (import, open the index, load the model
and the text encoder, rank, print) and, when a ``sparsemm serve`` of the collection is
running, the same search forwarded to it; each ``--runs`` times in new processes. Prints
the median, min and max in seconds. The figures include Python start-up; the machine's load average
is printed with them because it moves them a lot. Nothing is asserted.

    python benchmarks/cli_cold_start.py runs/collages-demo/collection --runs 5
    python benchmarks/cli_cold_start.py runs/collages-demo/collection --importtime

``--importtime`` also prints the ten slowest imports of one search (python -X importtime).

Query texts embedded before come from the user's text-embedding store
(:mod:`sparsemm.encoders.text_store`). ``--text-store seen`` (the default) runs the search
once untimed into a temporary store first, so every timed run finds its texts there (no
text encoder loaded); ``--text-store unseen`` gives each run a new empty store (MiniLM is
loaded and run, as for a never-seen word). Versions without the store ignore the setting.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_QUERY = "a sneaker but not a bag"


def sparsemm_command() -> list[str]:
    """The installed ``sparsemm`` script beside this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("sparsemm")
    if script.is_file():
        return [str(script)]
    found = shutil.which("sparsemm")
    return [found] if found else [sys.executable, "-m", "sparsemm.cli.main"]


def time_runs(cmd: list[str], runs: int, store: str = "seen") -> list[float]:
    """Wall seconds of ``runs`` fresh processes of ``cmd`` (a failing run stops the script),
    with the query texts in the text store (``seen``) or not (``unseen``)."""
    out = []
    shared = tempfile.mkdtemp(prefix="sparsemm-text-store-")
    env = {**os.environ, "SPARSEMM_TEXT_STORE": shared}
    if store == "seen":
        subprocess.run(cmd, capture_output=True, text=True, env=env)
    for _ in range(runs):
        if store == "unseen":
            env["SPARSEMM_TEXT_STORE"] = tempfile.mkdtemp(prefix="sparsemm-text-store-")
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        out.append(time.perf_counter() - t0)
        if res.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-400:]}")
    return out


def slowest_imports(cmd: list[str], n: int = 10) -> list[tuple[float, str]]:
    """(cumulative seconds, module) of the ``n`` slowest top-level imports of ``cmd``."""
    py = [sys.executable, "-X", "importtime", "-m", "sparsemm.cli.main", *cmd[1:]]
    res = subprocess.run(py, capture_output=True, text=True)
    rows = []
    for line in res.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3 or "cumulative" in line:
            continue
        rows.append((int(parts[1]) / 1e6, parts[2].strip()))
    return sorted(rows, reverse=True)[:n]


def server_running(collection: Path) -> bool:
    """Whether a `sparsemm serve` of ``collection`` has announced itself (sparsemm >= the
    forwarding change; older versions have no such module)."""
    try:
        from sparsemm.pipeline.running import find_server
    except ImportError:
        return False
    return find_server(collection) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("collection", type=Path, help="an indexed collection")
    ap.add_argument("--query", default=DEFAULT_QUERY)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--importtime", action="store_true", help="also list the slowest imports")
    ap.add_argument(
        "--text-store",
        choices=("seen", "unseen"),
        default="seen",
        help="the query's texts are in the text-embedding store already, or not",
    )
    ap.add_argument("--search-only", action="store_true", help="time only the search")
    args = ap.parse_args()
    if not (args.collection / "index" / "manifest.json").is_file():
        sys.exit(f"{args.collection} has no index; run `sparsemm demo` (or sparsemm index) first")

    base = sparsemm_command()
    cases = {
        "sparsemm --help": [*base, "--help"],
        "sparsemm search --list-strategies": [*base, "search", "--list-strategies"],
        f'sparsemm search COLLECTION "{args.query}" --no-server': [
            *base,
            "search",
            str(args.collection),
            args.query,
            "--no-server",
        ],
    }
    if server_running(args.collection):
        cases[f'sparsemm search COLLECTION "{args.query}" (to the server)'] = [
            *base,
            "search",
            str(args.collection),
            args.query,
        ]
    else:
        print(f"(no sparsemm serve of {args.collection} is running: forwarding not measured)")
    search_name = f'sparsemm search COLLECTION "{args.query}" --no-server'
    if args.search_only:
        cases = {search_name: cases[search_name]}
    print(f"{args.runs} cold runs each, query texts {args.text_store}; ", end="")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"{'command':<60} {'median':>7} {'min':>7} {'max':>7}")
    for name, cmd in cases.items():
        t = time_runs(cmd, args.runs, args.text_store)
        print(f"{name:<60} {statistics.median(t):>6.2f}s {min(t):>6.2f}s {max(t):>6.2f}s")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.importtime:
        print("slowest imports of one search (cumulative s, nested ones included):")
        for seconds, name in slowest_imports(cases[search_name]):
            print(f"  {seconds:6.2f}  {name}")


if __name__ == "__main__":
    main()
