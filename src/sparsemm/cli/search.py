"""``sparsemm search``: "A but not B" queries over an indexed collection, with explanations."""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sparsemm.cli.index import add_backend_args
from sparsemm.query.request import DEFAULT_STRATEGY, build_request, evidence_text, percent

if TYPE_CHECKING:
    from sparsemm.query.hits import Answer, Hit
    from sparsemm.query.searcher import Searcher


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search",
        help='search an indexed collection: "sports but not basketball", "pizza -person"',
        description="Parses the query into include/exclude terms and ranks the collection "
        "with an exclusion strategy. --explain prints, per result, the concept dimensions "
        "that matched and the excluded concepts that were checked.",
    )
    p.add_argument(
        "collection",
        type=Path,
        nargs="?",
        help="the photo folder `sparsemm up` ran on (or its -o folder), or a collection folder",
    )
    p.add_argument(
        "query",
        nargs="?",
        help='e.g. "dog without cat", "kitchen, no person, no oven", '
        '"a man making pizza, but there is no chair in sight"',
    )
    p.add_argument(
        "--list-strategies",
        action="store_true",
        help="list the ranking strategies with a line on each, and exit",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="TERM",
        help="an extra term to leave out (repeatable)",
    )
    p.add_argument(
        "--like",
        metavar="IMAGE_OR_ID",
        default=None,
        help="more like this: rank by the code of an image file (embedded with the "
        "collection's image encoder, SR models) or of a collection item (its id); the query "
        'then only says what to leave out, e.g. --like photo.jpg "but not person"',
    )
    p.add_argument("-k", type=int, default=10, help="number of results (default 10)")
    p.add_argument("--offset", type=int, default=0, help="skip this many results (paging)")
    p.add_argument(
        "--strategy",
        default=None,
        help=f"exclusion strategy (default: the model's; {DEFAULT_STRATEGY} for SR, the photo "
        "concept model and CLIP, served through the index or Qdrant; code_arith for VDR; "
        "filter with --engine index)",
    )
    p.add_argument(
        "--engine",
        choices=("strategy", "index"),
        default="strategy",
        help="'index': the inverted index's hard filter (strategy filter only); the default "
        "'strategy' already serves the default scorer through the index",
    )
    p.add_argument(
        "--min-score",
        default=None,
        metavar="P",
        help="keep only results whose match probability is at least P (0-1, or a "
        "percentage such as 60%%), and say how many items in all reach it (the default "
        "scorer's scores are probabilities)",
    )
    p.add_argument("--explain", action="store_true", help="show why each result came back")
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: the parsed query, the strategy and the hits (id, "
        "rank, score, image path, caption, labels, explanation)",
    )
    out.add_argument(
        "-f",
        "--paths",
        action="store_true",
        help="print only the hits' image paths (the id when an item has no image), one a "
        "line, for piping",
    )
    p.add_argument(
        "-z",
        "--null",
        action="store_true",
        help="with -f: end each path with a NUL byte instead of a newline (for xargs -0; a "
        "file name may hold a newline)",
    )
    p.add_argument(
        "--no-server",
        action="store_true",
        help="search in this process even when `sparsemm serve` is running for the "
        "collection (by default a plain search is sent to it: no start-up cost)",
    )
    add_backend_args(p)
    p.set_defaults(func=run, positionals=fill_positionals)


# what build_request's messages call the options it checks
FLAGS = {"k": "-k", "offset": "--offset", "min_score": "--min-score"}


def check_args(args: argparse.Namespace) -> None:
    """What only the command line can get wrong, refused before anything is loaded: -z
    without -f, a collection folder that is not there, a query with no word in it (the
    rest is build_request's)."""
    from sparsemm.errors import SparsemmError

    if args.null and not args.paths:
        raise SparsemmError("-z ends the paths of -f with NUL bytes; give it with -f")
    if args.collection is not None and not Path(args.collection).exists():
        raise SparsemmError(f"{args.collection} does not exist")
    text = " ".join([args.query or "", *args.exclude])
    # visible characters (an empty or zero-width query is the parser's "empty query")
    shown = [
        c for c in text if c.isprintable() and not c.isspace() and unicodedata.category(c) != "Cf"
    ]
    if shown and not any(ch.isalnum() for ch in shown):
        raise SparsemmError(
            f"the query {text.strip()!r} holds no word: search for something, e.g. "
            '"dog but not cat"'
        )


def fill_positionals(args: argparse.Namespace, extra: list[str]) -> bool:
    """Put strings argparse left over (positionals after an option, as in
    ``search COL --like ID "but not X"``) into the empty collection / query, in order;
    False when something else is left (an unknown option, a third positional)."""
    rest = list(extra)
    if args.collection is None and rest and not rest[0].startswith("-"):
        args.collection = Path(rest.pop(0))
    if args.query is None and rest and not rest[0].startswith("-"):
        args.query = rest.pop(0)
    return not rest


def list_strategies() -> str:
    from sparsemm.query.strategies import STRATEGIES

    width = max(len(n) for n in STRATEGIES)
    lines = [f"{name:<{width}}  {spec.description}" for name, spec in STRATEGIES.items()]
    return "\n".join(lines)


def image_path(searcher: Searcher, row: int) -> str | None:
    """The absolute image path of item ``row`` (None when it has no image), where the photo
    is now when its folder moved since `up` (Collection.image_file)."""
    path = searcher.collection.image_file(row)
    return None if path is None else str(path)


def unknown_note(words: list[str]) -> str:
    """The one-line note for words the searcher has never seen (Searcher.unknown_words)."""
    listed = ", ".join(repr(w) for w in words)
    return (
        f"note: {listed} {'is' if len(words) == 1 else 'are'} in no vocabulary of this "
        "collection (its captions, its model's concepts, the text encoder's words); "
        "searched by subword pieces, so check the spelling"
    )


def forward(args: argparse.Namespace) -> dict | None:
    """The running server's answer to this search (None: search here): a text query or a
    like-item through /api/search, a like-picture through /api/search/image."""
    from sparsemm.errors import SparsemmError
    from sparsemm.pipeline.running import (
        NotOnServer,
        find_server,
        forward_image,
        forward_search,
        within_server_limits,
    )

    if not within_server_limits(args.k, args.offset, list(args.exclude)):
        return None
    url = find_server(args.collection) if args.collection is not None else None
    if not url:
        return None
    query, exclude = args.query or "", list(args.exclude)
    if args.like is not None and Path(args.like).is_file():
        return forward_image(
            url, args.like, query, exclude, args.k, args.offset, args.strategy,
            min_score=args.min_score,
        )  # fmt: skip
    try:
        return forward_search(
            url, query, exclude, args.k, args.offset, args.strategy,
            min_score=args.min_score, like=args.like,
        )  # fmt: skip
    except NotOnServer:  # worded as the local search words it (Searcher.row_of)
        from sparsemm.query.handle import no_item

        raise SparsemmError(no_item(args.like, args.collection)) from None


def like_header(like: str) -> str:
    from sparsemm.data.sources import text_name

    return f"like {text_name(str(like))}"


def also_line(paths: Sequence[str]) -> str:
    """The line under a hit naming its other paths (copies with the same bytes, links)."""
    return f"       also: {', '.join(paths)}"


def run(args: argparse.Namespace) -> int:
    """Parse, refuse bad input early, send a plain search to a running server when there is
    one, else answer it here (Searcher.answer) and print it."""
    from sparsemm.errors import SparsemmError

    if args.list_strategies:  # before the searcher's imports (torch): this answers at once
        print(list_strategies())
        return 0
    check_args(args)
    if args.collection is None or (args.query is None and args.like is None and not args.exclude):
        raise SparsemmError(
            'give a collection and a query, e.g. sparsemm search COLLECTION "dog but not cat"'
        )
    request = build_request(
        args.query or "",
        exclude=args.exclude,
        k=args.k,
        offset=args.offset,
        strategy=args.strategy,
        like=args.like,
        min_score=args.min_score,
        engine=args.engine,
        names=FLAGS,
    )
    args.min_score = request.min_score  # as a probability (the server is sent that)
    # a search of the local store by the served scorers (any output, --min-score, --like):
    # the one a running `sparsemm serve` answers the same way (sparsemm.pipeline.running)
    if not (args.no_server or args.backend != "local" or args.engine != "strategy"):
        forwarded = forward(args)
        if forwarded:
            from sparsemm.pipeline.running import item_images
            from sparsemm.query.hits import Answer

            answer = Answer.from_json(forwarded)
            if request.min_score is None:  # the server counts for its page; a CLI search not
                answer.threshold = answer.matches = None
            images: dict[str, str | None] = {}
            if args.json or args.paths:
                images = item_images(args.collection, {h.id for h in answer.hits})
            render(answer, args, lambda h: images.get(h.id))
            return 0
    if args.like is not None and args.backend != "local":
        raise SparsemmError("--like searches the local index (no --backend)")
    from sparsemm.index.backends import open_store
    from sparsemm.query.searcher import Searcher

    store = None  # the store --backend names, closed with the searcher
    if args.backend != "local":
        from sparsemm.cli.index import collection_name

        store = open_store(
            args.backend, url=args.url, collection=collection_name(args), api_key=args.api_key
        )
    searcher = Searcher(args.collection, store=store)
    try:
        answer = searcher.answer(request)
        render(answer, args, lambda h: image_path(searcher, h.row))
    finally:
        searcher.close()
    return 0


def render(answer: Answer, args: argparse.Namespace, image: Callable[[Hit], str | None]) -> None:
    """Print an answer, searched here or by a running server: JSON, image paths, or the
    text lines (notes on stderr). ``image``: a hit's image path, when it has one."""
    hits = answer.hits
    if args.json:
        out = answer.to_json()
        for h, d in zip(hits, out["hits"], strict=True):
            d["image"] = image(h)
        if args.like is not None:
            out = {"like": args.like, **out}
        print(json_text(out))
        return
    if answer.unknown_words:  # on stderr, so piped paths stay clean
        print(unknown_note(answer.unknown_words), file=sys.stderr)
    for note in answer.notes:
        print(f"note: {note}", file=sys.stderr)
    offset = getattr(args, "offset", 0) or 0
    if not hits and answer.total is not None and offset and offset >= answer.total:
        print(f"note: --offset {offset} is past the last of {answer.total} items", file=sys.stderr)
    if args.paths:
        end = "\0" if args.null else "\n"
        for h in hits:
            path = image(h)
            if path is None or Path(path).exists():  # a gone photo: the note above says so
                print(path or h.id, end=end)
        return
    query = answer.query
    include = like_header(args.like) if args.like is not None else ", ".join(query.include)
    excl = f"  but not: {', '.join(query.exclude)}" if query.exclude else ""
    print(f"query: {include or '(anything)'}{excl}   [{answer.strategy}]")
    print_hits([h.to_json() for h in hits], args.explain, answer.probabilistic)
    if answer.min_score is not None and answer.matches is not None:
        assert answer.threshold is not None
        print(
            f"{answer.matches} of {answer.total} items match at {percent(answer.threshold)} or more"
        )


def json_text(value: object) -> str:
    """``value`` as indented JSON, with each list of numbers on one line (a hit's dimension
    lists ran to hundreds of lines, one number each); the same JSON as ``json.dumps``."""
    import uuid

    lists: dict[str, str] = {}
    mark = uuid.uuid4().hex  # no text of the answer can hold it

    def fold(v: object) -> object:
        if isinstance(v, dict):
            return {k: fold(x) for k, x in v.items()}
        if isinstance(v, list):
            if v and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
                key = f"{mark}{len(lists)}"
                lists[key] = json.dumps(v)
                return key
            return [fold(x) for x in v]
        return v

    text = json.dumps(fold(value), indent=1)
    for key, flat in lists.items():
        text = text.replace(f'"{key}"', flat, 1)
    return text


def _why(way: str) -> str:
    """What a term's scoring source says about it, for --explain."""
    return {
        "code similarity": " (no detector for it: code similarity stands in)",
        "zero-shot": " (the encoder's image-text similarity, calibrated)",
    }.get(way, "")


def print_hits(hits: list[dict], explain: bool, probabilistic: bool = False) -> None:
    """The text output's result lines (and with ``explain`` the why of each), from hits as
    dicts (:meth:`Hit.to_dict`, or a server's answer: both print the same)."""
    for h in hits:
        score = percent(h["score"]) if probabilistic else f"{h['score']:.3f}"
        print(f"{h['rank']:>3}. {h['id']}  {score}  {h['caption']}".rstrip())
        if h.get("also"):
            print(also_line(h["also"]))
        if explain:
            for c in h["matched"]:
                print(
                    f"       matched dim {c['dim']} (+{c['weight']:.3f}): "
                    f"{', '.join(c['words'][:5])}"
                )
            for e in h["excluded"]:
                print(
                    f"       checked '{e['term']}': dims {e['dims'][:6]} "
                    f"({', '.join(e['words'][:4])}) item mass {e['item_mass']:.3f}"
                )
            evidence = h.get("evidence") or []
            if evidence:
                ev = ", ".join(
                    evidence_text(e["term"], e["side"], e["kind"], e["value"])
                    + f" [dims {', '.join(map(str, e['dims'])) or '-'}]"
                    for e in evidence
                )
                print(f"       evidence: {ev}")
            for e in evidence:  # what in the photo carries each term (its dims' words)
                if e.get("words") and e["value"] >= 0.01:
                    print(f"       '{e['term']}' from: {', '.join(dict.fromkeys(e['words']))}")
            for e in evidence:
                if e["read_as"] and e["read_as"] != [e["term"]]:
                    print(f"       '{e['term']}' read as: {', '.join(e['read_as'])}")
            if h.get("scored_by"):
                how = ", ".join(f"'{t}' by {way}" + _why(way) for t, way in h["scored_by"].items())
                print(f"       scored: {how}")
    if not hits:
        print("no results")
