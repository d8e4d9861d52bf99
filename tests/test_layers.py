"""Imports point down the layers (docs/architecture.md): the bottom modules import nothing of
sparsemm but its error type, and the library layers (encoders, words, data, models, train,
index, query, baselines) never import the benchmark runs (``sparsemm.eval``), the CLI, the
web server or the visualisations, even inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import sparsemm

SRC = Path(sparsemm.__file__).resolve().parent
BOTTOM = ("errors", "linalg", "lru", "runtime")
LIBRARY = ("encoders", "words", "data", "models", "train", "index", "query", "baselines")
ABOVE = ("eval", "cli", "web", "viz")


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return [m for m in out if m == "sparsemm" or m.startswith("sparsemm.")]


def test_bottom_modules_import_only_the_error_type() -> None:
    for name in BOTTOM:
        bad = [m for m in _imports(SRC / f"{name}.py") if m != "sparsemm.errors"]
        assert not bad, f"sparsemm.{name} imports {bad}"


def test_library_layers_never_import_runs_cli_web_or_viz() -> None:
    bad = []
    for pkg in LIBRARY:
        for path in sorted((SRC / pkg).rglob("*.py")):
            for mod in _imports(path):
                if mod.split(".")[1] in ABOVE:
                    bad.append(f"{path.relative_to(SRC)} -> {mod}")
    assert not bad, "imports up the layers:\n" + "\n".join(bad)


def test_the_check_sees_function_level_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from sparsemm.eval.bench import x\n    import sparsemm.cli.main\n")
    assert _imports(f) == ["sparsemm.eval.bench", "sparsemm.cli.main"]
