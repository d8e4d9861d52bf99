"""Imports point down the layers (docs/architecture.md). ``LAYERS`` lists sparsemm's top-level
modules and packages, lowest first: a module may import its own package and anything in a
lower layer, never a package beside it or above it, counting every kind of import (at module
level, inside a function, inside ``if TYPE_CHECKING:``); no two packages import each other;
no module-level import comes back to a module being imported, inside a package too (in
sparsemm and in sparsemm_experiments); the library layers never import the measuring layer,
the CLI or the web server; and nothing in sparsemm imports sparsemm_experiments, whose
verbs, benchmarks, train models and model adapters come in through the entry points
pyproject.toml declares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sparsemm

SRC = Path(sparsemm.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = "sparsemm_experiments"  # the research code, on top of the library
ROOT = "sparsemm"  # the package itself (__init__.py): the lazily loaded public API, __version__

# Lowest first. A layer's members do not import each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors"}),
    frozenset({"io", "linalg", "lru", "runtime", "text"}),  # import only errors
    frozenset({"concepts", "encoders", "words", "index", "baselines"}),  # only the bottom
    frozenset({"data"}),  # sources, collections, encoding: needs the encoders
    frozenset({"models"}),  # needs data (collections), baselines (SpLiCE), words, concepts
    frozenset({"train"}),
    frozenset({"query"}),
    frozenset({ROOT}),  # the public API re-exports the library
    frozenset({"web"}),  # the web server: reads the library
    frozenset({"pipeline"}),  # up, index, serve: what the CLI verbs run
    frozenset({"cli"}),
)
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
BOTTOM = tuple(sorted(LAYERS[0] | LAYERS[1]))
LIBRARY = tuple(sorted(set().union(*LAYERS[2 : LAYER_OF[ROOT]])))  # between bottom and ROOT
ABOVE = tuple(sorted(set().union(*LAYERS[LAYER_OF[ROOT] + 1 :])))

# (importing module, imported top-level name) pairs let through, each with its reason. An
# entry no import needs any more fails test_every_allowed_upward_import_is_still_used.
# (module, package it may import although the package sits above it): why. Empty: every
# import points down.
ALLOWED_UP: dict[tuple[str, str], str] = {}


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


def experiments_imports(path: Path) -> list[int]:
    """Lines of ``path`` that import sparsemm_experiments: an import statement at any depth
    (module level, in a function, in ``if TYPE_CHECKING:``) or a call whose first argument
    names it (``importlib.import_module("sparsemm_experiments...")``, ``__import__``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        if any(n == EXPERIMENTS or n.startswith(f"{EXPERIMENTS}.") for n in names):
            lines.append(node.lineno)
    return lines


def test_the_library_never_imports_the_experiments() -> None:
    """sparsemm_experiments (the research code) sits on top of the library: nothing in
    sparsemm imports it, at module level, inside a function or by name through importlib
    (its verbs, benchmarks, train models and model adapters come in through entry points:
    sparsemm.cli.plugins, sparsemm.query.code_models.model_types)."""
    bad = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        for line in experiments_imports(path)
    ]
    assert not bad, "the library imports sparsemm_experiments:\n" + "\n".join(bad)


def test_the_experiments_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text(
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "import sparsemm_experiments.eval.bench\n"
        "if TYPE_CHECKING:\n"
        "    from sparsemm_experiments.models.vdr import VDRModel\n"
        "def g():\n"
        "    from sparsemm_experiments import export\n"
        "    importlib.import_module('sparsemm_experiments.cli.bench')\n"
        "    __import__('sparsemm_experiments')\n"
        "    import sparsemm_experimental, sparsemm.eval\n"  # other names: not counted
    )
    assert experiments_imports(f) == [3, 5, 7, 8, 9]


def pyproject_entry_points() -> dict[str, dict[str, str]]:
    """The entry points pyproject.toml declares, by group (what ``pip install`` records)."""
    import tomllib

    with (REPO / "pyproject.toml").open("rb") as f:
        groups = tomllib.load(f)["project"]["entry-points"]
    return {g: dict(eps) for g, eps in groups.items() if g.startswith("sparsemm.")}


def test_the_experiments_register_through_the_declared_entry_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every entry point pyproject.toml declares loads, and with them (as an install records
    them) the command has the experiments' verbs, benchmarks and train models, and
    load_code_model finds the VDR adapter. The declarations are read from pyproject.toml and
    loaded here, so the check holds before ``pip install -e .`` records new ones."""
    from importlib.metadata import EntryPoint

    import sparsemm.cli.plugins as plugins
    import sparsemm.query.code_models as code_models
    import sparsemm.query.strategies.registry as strategies
    from sparsemm.cli.main import VERBS, build_parser

    declared = pyproject_entry_points()
    assert set(declared) == {
        plugins.VERB_GROUP,
        plugins.BENCH_GROUP,
        plugins.TRAIN_GROUP,
        plugins.SPINE_GROUP,
        code_models.MODEL_GROUP,
        strategies.STRATEGY_GROUP,
    }
    eps = [EntryPoint(n, v, g) for g, group in declared.items() for n, v in group.items()]
    for ep in eps:
        assert ep.value.startswith(f"{EXPERIMENTS}."), ep
        loaded = ep.load()
        # a strategy entry point names a module, which registers its strategies on import
        assert callable(loaded) or ep.group == strategies.STRATEGY_GROUP, ep

    def declared_entry_points(group: str) -> list[EntryPoint]:
        return [ep for ep in eps if ep.group == group]

    monkeypatch.setattr(plugins, "entry_points", declared_entry_points)
    monkeypatch.setattr(strategies, "entry_points", declared_entry_points)
    monkeypatch.setattr("importlib.metadata.entry_points", declared_entry_points)
    assert set(declared[plugins.VERB_GROUP]).isdisjoint(VERBS)
    parser = build_parser()
    runs = {
        ("demo", "--quick"): "sparsemm_experiments.cli.demo",
        ("bench", "paper", "--quick", "-o", "x"): "sparsemm_experiments.cli.bench_paper",
        ("bench", "vdr", "--quick", "-o", "x"): "sparsemm_experiments.cli.bench_vdr",
        ("bench", "lexlip", "--quick", "-o", "x"): "sparsemm_experiments.cli.bench_lexlip",
        ("bench", "exclusion", "-o", "x"): "sparsemm_experiments.cli.bench",
        ("bench", "negation", "-o", "x"): "sparsemm_experiments.cli.bench",
        ("export", "m", "c", "-o", "x"): "sparsemm_experiments.cli.export",
        ("collages", "-o", "x"): "sparsemm_experiments.cli.collages",
        ("train", "vdr", "c", "-o", "x"): "sparsemm_experiments.cli.train_vdr",
        ("train", "lexlip", "c", "-o", "x"): "sparsemm_experiments.cli.train_lexlip",
        ("train", "align", "c", "-o", "x"): "sparsemm_experiments.cli.train_align",
        ("train", "sr", "c", "-o", "x"): "sparsemm_experiments.cli.train",
        ("train", "detectors", "m", "c"): "sparsemm_experiments.cli.train",
        ("spine", "eval", "r"): "sparsemm_experiments.cli.spine_eval",
        ("spine", "inspect", "r", "--dim", "0"): "sparsemm_experiments.cli.spine",
        ("spine", "train", "-o", "x"): "sparsemm_experiments.cli.spine",
        ("encode", "s", "-o", "x"): "sparsemm_experiments.cli.encode",
    }
    for argv, module in runs.items():
        assert parser.parse_args(list(argv)).func.__module__ == module, argv
    types = code_models.model_types()
    assert types["vdr"].__module__ == "sparsemm_experiments.code_models"
    assert {"sr", "imagenet_concepts", "clip_concepts"} <= set(types)
    assert "vdr" not in code_models.MODEL_TYPES
    strategies.load_entry_points()
    assert strategies.get_spec("cbe").cls.__module__ == "sparsemm_experiments.baselines.cbe"


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``from ... import`` names (relative imports resolved against
    ``module``, a package when ``is_package``)."""
    if not node.level:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    parts = package.split(".")
    up = parts[: len(parts) - node.level + 1]
    return ".".join([*up, node.module] if node.module else up)


def _runtime_imports(path: Path, modules: set[str], module: str = "") -> set[str]:
    """Modules of ``modules`` that ``path`` (module ``module``) imports when it runs (any
    depth, relative imports resolved; ``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            typing_only |= {id(n) for child in node.body for n in ast.walk(child)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            base = _absolute(node, module, path.name == "__init__.py")
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in modules}


def test_no_import_circles() -> None:
    """No two modules of sparsemm (or of sparsemm_experiments) import each other, directly
    or through others, even inside a function (a package importing its own submodules to
    re-export them is not a circle; ALLOWED_UP's imports are left out)."""
    for root in (ROOT, EXPERIMENTS):
        files = _files(root)
        graph = {
            name: {
                dep
                for dep in _runtime_imports(path, set(files), name)
                if dep != name
                and not name.startswith(f"{dep}.")
                and not dep.startswith(f"{name}.")
                and (name, _top_level(dep)) not in ALLOWED_UP
            }
            for name, path in files.items()
        }
        found = cycles(graph)
        assert not found, f"import circles in {root}:\n" + "\n".join(found)


def module_level_imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """Modules of ``modules`` that importing ``path`` (module ``module``) runs: import
    statements at module level (under ``if``/``try`` too, not under ``if TYPE_CHECKING:``),
    relative ones resolved. ``from pkg import name`` counts as ``pkg.name`` when that is a
    module, else as ``pkg`` (the name comes from the package's ``__init__``)."""
    out: set[str] = set()

    def walk(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.dump(node.test):
                    walk(node.body)
                    walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for handler in node.handlers:
                    walk(handler.body)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, path.name == "__init__.py")
                for a in node.names:
                    full = f"{base}.{a.name}"
                    out.add(full if full in modules else base)

    walk(ast.parse(path.read_text(encoding="utf-8")).body)
    return (out & modules) - {module}


def module_level_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    return {name: module_level_imports(path, name, set(files)) for name, path in files.items()}


def test_no_module_level_import_circles() -> None:
    """Importing any module of sparsemm (or of sparsemm_experiments) never comes back to a
    module still being imported: no circle of module-level imports, counting those inside
    one package (a submodule taking a name from its package's ``__init__`` while that
    ``__init__`` imports the submodule is such a circle)."""
    for root in (ROOT, EXPERIMENTS):
        found = cycles(module_level_graph(_files(root)))
        assert not found, f"module-level import circles in {root}:\n" + "\n".join(found)


def test_the_module_level_circle_check_finds_circles(tmp_path: Path) -> None:
    pkg = tmp_path / "sparsemm" / "query"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\nHELPER = 1\n")
    (pkg / "a.py").write_text("from sparsemm.query import HELPER\ndef f(): pass\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import c\nif TYPE_CHECKING:\n    import x\n"
    )
    (pkg / "c.py").write_text(
        "def g():\n    from .b import h\n"
        "try:\n    from .b import k\nexcept ImportError:\n    pass\n"
    )
    (pkg / "d.py").write_text("from .a import f\ndef g():\n    from . import d2\n")
    (pkg / "d2.py").write_text("from .d import g\n")
    files = {
        f"sparsemm.query{'' if p.stem == '__init__' else '.' + p.stem}": p
        for p in sorted(pkg.glob("*.py"))
    }
    graph = module_level_graph(files)
    assert graph["sparsemm.query.a"] == {"sparsemm.query"}
    assert graph["sparsemm.query.d"] == {"sparsemm.query.a"}  # the function-level one: not
    assert cycles(graph) == [
        "sparsemm.query -> sparsemm.query.a -> sparsemm.query",
        "sparsemm.query.b -> sparsemm.query.c -> sparsemm.query.b",
    ]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level(module: str) -> str | None:
    """The top-level sparsemm module or package ``module`` (dotted) belongs to; ROOT for
    the package itself or a name defined in its __init__ (``from sparsemm import
    __version__``); None outside sparsemm."""
    parts = module.split(".")
    if parts[0] != ROOT:
        return None
    if len(parts) == 1:
        return ROOT
    name = parts[1]
    return name if (SRC / name).is_dir() or (SRC / f"{name}.py").is_file() else ROOT


def sparsemm_imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, top-level name) of every sparsemm import in the file ``path`` of module
    ``module`` (dotted): import statements at any depth (in functions, in ``if
    TYPE_CHECKING:`` blocks), relative imports resolved, and ``importlib.import_module`` /
    ``__import__`` of a literal name."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # from sparsemm import words -> sparsemm.words; from sparsemm import x -> ROOT
            names = [f"{base}.{a.name}" if base == ROOT else base for a in node.names]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if (
                called in ("import_module", "__import__")
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
            ):
                names = [arg.value]
        for name in names:
            top = _top_level(name)
            if top is not None:
                out.append((node.lineno, top))
    return out


def _files(root: str = ROOT) -> dict[str, Path]:
    """Module name (dotted) -> file, for every module of the package ``root``."""
    return {_module_name(path): path for path in sorted((SRC.parent / root).rglob("*.py"))}


def upward_imports(files: dict[str, Path]) -> list[str]:
    """Every import of ``files`` (module -> path) that goes to a package beside or above
    the importing module's own, but those in ALLOWED_UP."""
    bad = []
    for module, path in files.items():
        own = _top_level(module)
        assert own is not None
        for line, top in sparsemm_imports(path, module):
            if top == own or (module, top) in ALLOWED_UP:
                continue
            if LAYER_OF.get(top, len(LAYERS)) >= LAYER_OF.get(own, -1):
                bad.append(f"{module}:{line}: {own} imports {top}")
    return sorted(bad, key=lambda b: (b.split(":")[0], int(b.split(":")[1])))


def test_every_module_is_in_a_layer() -> None:
    """LAYERS names every top-level module and package of sparsemm, each once."""
    tops = {_top_level(m) for m in _files()}
    placed = set().union(*LAYERS)
    assert tops == placed, f"not in LAYERS: {tops - placed}; in LAYERS but gone: {placed - tops}"
    assert sum(len(layer) for layer in LAYERS) == len(placed), "a name is in two layers"


def test_every_import_points_down() -> None:
    """Every sparsemm import, at module level, inside a function and inside ``if
    TYPE_CHECKING:``, goes to the importing module's own package or to a lower layer."""
    bad = upward_imports(_files())
    assert not bad, "imports beside or up the layers (LAYERS):\n" + "\n".join(bad)


def test_every_allowed_upward_import_is_still_used() -> None:
    """An ALLOWED_UP entry goes once the import it lets through is gone."""
    files = _files()
    for module, top in ALLOWED_UP:
        found = [t for _, t in sparsemm_imports(files[module], module)]
        assert top in found, f"{module} no longer imports {top}: remove it from ALLOWED_UP"


def test_the_layer_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    f = tmp_path / "fake.py"
    f.write_text(
        "from typing import TYPE_CHECKING\n"
        "import importlib\n"
        "from sparsemm.io import write_json\n"  # down: fine
        "from sparsemm.words.vectors import WordVectors\n"  # its own package: fine
        "from . import bias\n"  # its own package, relatively: fine
        "if TYPE_CHECKING:\n"
        "    from sparsemm.models.base import PretrainedMixin\n"
        "def g():\n"
        "    import sparsemm.train.loop\n"
        "    from ..query import parse\n"
        "    from sparsemm import __version__, web\n"
        "    importlib.import_module('sparsemm.index.inverted')\n"
    )
    module = "sparsemm.words.fake"
    assert sorted(sparsemm_imports(f, module)) == [
        (3, "io"),
        (4, "words"),
        (5, "words"),
        (7, "models"),
        (9, "train"),
        (10, "query"),
        (11, ROOT),
        (11, "web"),
        (12, "index"),  # beside words, in the same layer: not allowed either
    ]
    assert [b.split(": ", 1)[1] for b in upward_imports({module: f})] == [
        f"words imports {t}" for t in ("models", "train", "query", ROOT, "web", "index")
    ]


def package_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Top-level name -> the other top-level names its modules import (every kind of
    import, TYPE_CHECKING included), but those in ALLOWED_UP."""
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        own = _top_level(module)
        assert own is not None
        deps = {t for _, t in sparsemm_imports(path, module) if (module, t) not in ALLOWED_UP}
        graph.setdefault(own, set()).update(deps - {own})
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """One line per back edge a depth-first search of ``graph`` meets: each a cycle."""
    state: dict[str, int] = {}
    found = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                found.append(" -> ".join([*trail[trail.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_no_package_circles() -> None:
    """No two top-level sparsemm packages (or modules) import each other, directly or
    through others, counting function-level and TYPE_CHECKING imports."""
    found = cycles(package_graph(_files()))
    assert not found, "package circles:\n" + "\n".join(found)


def test_the_circle_check_finds_circles(tmp_path: Path) -> None:
    assert cycles({"words": {"train"}, "train": {"words", "models"}}) == ["train -> words -> train"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]
    assert cycles({"a": {"b"}, "b": set()}) == []
    f = tmp_path / "bias.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sparsemm.train\n")
    g = tmp_path / "sr.py"
    g.write_text("from sparsemm.words import bias\n")
    files = {"sparsemm.words.bias": f, "sparsemm.train.sr": g}
    assert cycles(package_graph(files)) == ["train -> words -> train"]


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
