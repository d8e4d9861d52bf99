"""``-v/--verbose`` is accepted after the verb (and a sub-command) as well as before it."""

from __future__ import annotations

import argparse
import logging

import pytest

from sparsemm.cli.main import build_parser, main


def _leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every command that has no sub-commands, plugin verbs included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _leaf_commands(child, (*path, name))


def _minimal_argv(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """The command with a placeholder for each required positional and option (and the
    first option of a required either-or group)."""
    argv = list(path)
    either = [g._group_actions[0] for g in parser._mutually_exclusive_groups if g.required]
    for action in parser._actions:
        value = str(next(iter(action.choices))) if action.choices else "1"
        if not action.option_strings and action.nargs not in ("?", "*"):
            argv.append(value)
        elif action.option_strings and (action.required or action in either):
            argv += [action.option_strings[0], value]
    return argv


def _commands() -> list[tuple[str, ...]]:
    """Every leaf command, with the entry points pyproject.toml declares (as an up-to-date
    install has them; the parametrisation is computed before any fixture runs)."""
    from declared import declared_group

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sparsemm.cli.plugins.entry_points", declared_group)
        return sorted(path for path, _ in _leaf_commands(build_parser()))


COMMANDS = _commands()


def test_the_plugin_verbs_are_among_the_commands_checked() -> None:
    # the verbs and sub-commands that sparsemm_experiments adds through entry points
    assert {("bench", "negation"), ("demo",), ("export",), ("train", "align")} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("flag", ["-v", "--verbose"])
def test_verbose_after_the_verb(path: tuple[str, ...], flag: str) -> None:
    leaves = dict(_leaf_commands(build_parser()))
    argv = _minimal_argv(path, leaves[path])
    plain, extra = build_parser().parse_known_args(argv)
    assert extra == [] and plain.verbose is False
    after, extra = build_parser().parse_known_args([*argv, flag])
    assert extra == [], f"sparsemm {' '.join(argv)} {flag} left {extra}"
    assert after.verbose is True


def test_verbose_before_the_verb_is_kept() -> None:
    args = build_parser().parse_args(["-v", "search", "col", "a dog"])
    assert args.verbose is True
    args = build_parser().parse_args(["-v", "bench", "negation", "-o", "out"])
    assert args.verbose is True


def test_search_with_verbose_after_the_query_logs_at_debug(monkeypatch, tmp_path) -> None:
    levels: list[int] = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: levels.append(kw["level"]))
    # a missing collection: the command is understood and fails on the folder, not on -v
    status = main(["search", str(tmp_path / "missing"), "a dog", "-v", "--no-server"])
    assert status == 2
    assert levels == [logging.DEBUG]
