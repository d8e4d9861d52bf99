"""The ``sparsemm`` command. One module per verb; each exposes ``register(subparsers)``.

A verb sets ``func`` on its parser; ``func(args) -> int`` returns the exit status.
SparsemmError is printed on one line without a traceback (exit 2), and so is an OSError
the verb did not turn into one (a file vanished, an I/O error): the user can act on both.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from sparsemm import __version__
from sparsemm.cli.plugins import VERB_GROUP, registrars
from sparsemm.errors import SparsemmError

# Verb modules under sparsemm.cli, in the order a photo user meets them (``up`` first); the
# verbs of other packages (``encode``, ``spine``, ``train``, ``collages``, ``demo``,
# ``bench``, ``export``, from sparsemm_experiments) come after them (sparsemm.cli.plugins).
VERBS = (
    "up",
    "search",
    "serve",
    "index",
)


# Verbs whose output is meant for people and pipes: library log lines only with -v.
QUIET_VERBS = frozenset({"search", "up"})
# Verbs that write nothing but their output: the command ends them without the interpreter's
# teardown (``entry``), which with torch loaded took about 1 s of a 3-4 s cold search.
READ_ONLY_VERBS = frozenset({"search"})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparsemm",
        description="Interpretable sparse multimodal retrieval. Start with "
        "`sparsemm up PHOTOS`: one command from a folder of photos to a search page.",
    )
    parser.add_argument("--version", action="version", version=f"sparsemm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        module = importlib.import_module(f"sparsemm.cli.{verb}")
        module.register(sub)
    for register in registrars(VERB_GROUP):
        register(sub)
    _verbose_after_verbs(parser)
    return parser


VERBOSE_HELP = "debug logging"


def _verbose_after_verbs(parser: argparse.ArgumentParser) -> None:
    """Accept ``-v/--verbose`` after every verb and sub-command too (``sparsemm search COL
    "a dog" -v``), the plugin verbs included, as well as before the verb.

    The sub-parsers' option defaults to SUPPRESS: a sub-parser copies its defaults over the
    top-level namespace, so a plain ``False`` there would undo ``sparsemm -v search``.
    """
    seen: set[int] = set()
    todo = [parser]
    while todo:
        current = todo.pop()
        for action in current._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            for child in action.choices.values():
                if id(child) in seen:  # a verb's aliases share its parser
                    continue
                seen.add(id(child))
                taken = child._option_string_actions
                flags = [f for f in ("-v", "--verbose") if f not in taken]
                if flags:
                    child.add_argument(
                        *flags,
                        dest="verbose",
                        action="store_true",
                        default=argparse.SUPPRESS,
                        help=VERBOSE_HELP,
                    )
                todo.append(child)


def _pass_file_name_bytes() -> None:
    """Print a file name that is not valid UTF-8 (``caf\\xe9.png``) with its own bytes, as
    ``ls`` and ``find`` do, instead of failing on it (Python holds such a name with lone
    surrogates, which a strict UTF-8 stream refuses)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower() in (
            "utf-8",
            "utf8",
        ):
            reconfigure(errors="surrogateescape")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line (``argv``, default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    # argparse fills optional positionals only from the first run of them, so
    # `search COL --like ID "but not X"` would leave the query unrecognised: a verb with a
    # `positionals` hook takes such leftovers, in order, into its empty positionals.
    args, extra = parser.parse_known_args(argv)
    fill = getattr(args, "positionals", None)
    if extra and (fill is None or not fill(args, extra)):
        dash = args.verb == "search" and any(e[:1] == "-" and e[:2] != "--" for e in extra)
        hint = (
            " (options first, then '--' before a query that starts with '-': "
            "search -k 5 PHOTOS -- -dog)"
        )
        parser.error(f"unrecognized arguments: {' '.join(extra)}{hint if dash else ''}")
    # Long jobs report their stages at INFO; a search prints its answer only (-v: all).
    quiet = args.verb in QUIET_VERBS
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    _pass_file_name_bytes()
    try:
        return int(args.func(args) or 0)
    except SparsemmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # after SparsemmError: a WriteError is both
        logging.getLogger(__name__).debug("OSError in %s", args.verb, exc_info=True)
        print(f"error: {_os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _os_error_line(exc: OSError) -> str:
    """One line for an OSError: its message, the file(s) it names and what to do."""
    what = " ".join((exc.strerror or str(exc) or type(exc).__name__).split())
    files = [str(f) for f in (exc.filename, exc.filename2) if f is not None]
    where = f": {' -> '.join(files)}" if files else ""
    return f"{what}{where}; check the path and the disk, then run again (-v shows details)"


def entry() -> None:
    """The ``sparsemm`` command: :func:`main`, then exit.

    After a read-only verb (a search) the process ends at once with ``os._exit`` once its
    output is flushed: nothing is left to write, and the normal teardown (module and torch
    finalisers) took longer than the search. Other verbs exit normally.
    """
    argv = sys.argv[1:]
    code = main(argv)
    if read_only(argv):
        code = _flush_streams(code)
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def read_only(argv: Sequence[str]) -> bool:
    """True when the command line's verb is one of READ_ONLY_VERBS (its first non-option)."""
    verb = next((a for a in argv if not a.startswith("-")), None)
    return verb in READ_ONLY_VERBS


def _flush_streams(code: int) -> int:
    """Flush stdout and stderr; a reader that went away (``| head``) is not an error, other
    write failures make a non-zero status."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            pass
        except (OSError, ValueError):
            code = code or 1
    return code


if __name__ == "__main__":  # pragma: no cover
    entry()
