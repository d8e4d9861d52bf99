"""The library stays walkable: no module over 800 lines and no function over 100, outside
the numba kernels (``index/kernels.py``, whose scoring loops are kept whole so they compile
to one loop each). Counted by line, docstrings and comments included."""

from __future__ import annotations

import ast
from pathlib import Path

import sparsemm

SRC = Path(sparsemm.__file__).resolve().parent
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100
KERNELS = {"index/kernels.py"}


def too_long(root: Path) -> tuple[list[str], list[str]]:
    """(modules, functions) of the tree under ``root`` over the limits, as readable lines."""
    modules, functions = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in KERNELS:
            continue
        text = path.read_text(encoding="utf-8")
        if (n := text.count("\n")) > MAX_MODULE_LINES:
            modules.append(f"{rel}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return modules, functions


def test_no_module_or_function_is_too_long() -> None:
    modules, functions = too_long(SRC)
    assert not modules, f"modules over {MAX_MODULE_LINES} lines: {modules}"
    assert not functions, f"functions over {MAX_FUNCTION_LINES} lines: {functions}"


def test_the_size_check_finds_long_modules_and_functions(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    (tmp_path / "long_function.py").write_text(f"def f():\n{body}\n", encoding="utf-8")
    (tmp_path / "long_module.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1), encoding="utf-8")
    modules, functions = too_long(tmp_path)
    assert modules == [f"long_module.py: {MAX_MODULE_LINES + 1} lines"]
    assert functions == [f"long_function.py:1 f: {MAX_FUNCTION_LINES + 2} lines"]


def test_the_searcher_stays_short() -> None:
    """``query/searcher.py`` answers queries and delegates the rest (term checks, the
    collection handle, hits, the served path): at most 300 lines."""
    lines = (SRC / "query" / "searcher.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"query/searcher.py has {lines} lines"
