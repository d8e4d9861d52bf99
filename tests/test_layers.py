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
LIBRARY = (
    "concepts",
    "encoders",
    "words",
    "data",
    "models",
    "train",
    "index",
    "query",
    "baselines",
)
ABOVE = ("eval", "cli", "web", "viz")


def _imports(path: Path, package: str = "sparsemm") -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return [m for m in out if m == package or m.startswith(f"{package}.")]


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


def test_the_library_never_imports_the_experiments() -> None:
    """sparsemm_experiments (the research run drivers) sits on top of the library: nothing
    in sparsemm imports it, by an import statement or by name through importlib (its verbs
    come in through entry points, sparsemm.cli.plugins)."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        by_name = [
            node.args[0].value
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.startswith("sparsemm_experiments")
        ]
        if _imports(path, "sparsemm_experiments") or by_name:
            bad.append(str(path.relative_to(SRC)))
    assert not bad, "the library imports sparsemm_experiments:\n" + "\n".join(bad)


def test_the_experiments_verbs_are_registered_through_entry_points() -> None:
    from sparsemm.cli.main import build_parser
    from sparsemm.cli.plugins import BENCH_GROUP, VERB_GROUP, registrars

    assert registrars(VERB_GROUP) and len(registrars(BENCH_GROUP)) == 3
    parser = build_parser()
    assert parser.parse_args(["demo", "--quick"]).verb == "demo"
    assert parser.parse_args(["bench", "paper", "--quick", "-o", "x"]).func.__module__ == (
        "sparsemm_experiments.cli.bench_paper"
    )


def _runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """sparsemm modules ``path`` imports when it runs (any depth; ``if TYPE_CHECKING:``
    blocks left out), each resolved to a module of ``modules``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            typing_only |= {id(n) for child in node.body for n in ast.walk(child)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in modules}


def test_no_import_circles() -> None:
    """No two sparsemm modules import each other, directly or through others, even inside a
    function (a package importing its own submodules to re-export them is not a circle)."""
    files = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    graph = {
        name: {
            dep
            for dep in _runtime_imports(path, set(files))
            if dep != name and not name.startswith(f"{dep}.") and not dep.startswith(f"{name}.")
        }
        for name, path in files.items()
    }
    # depth-first search for a back edge
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*trail[trail.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_run_presets_are_data_files() -> None:
    """The experiments' settings (the full reproductions and their --quick presets) are JSON
    files of the package, read as the run configs hold them (lists as tuples)."""
    from sparsemm_experiments.presets import load_preset

    for name in ("paper", "vdr", "lexlip", "paper_quick", "vdr_quick", "lexlip_quick"):
        preset = load_preset(name)
        assert preset and not any(isinstance(v, list) for v in preset.values())
    assert load_preset("vdr_quick")["ks"] == (32, 512)
    from sparsemm_experiments.paper_bench import PaperBenchConfig

    assert PaperBenchConfig().dims == load_preset("paper")["dims"] == (500, 1000, 1500, 2000)
