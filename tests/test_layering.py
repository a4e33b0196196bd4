"""The packages' imports point one way: probes sample, analyzers decide, the agent
orchestrates, the TUI shows (from report documents and its feed, through `text`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probes", "analyzers", "text", "tui", "agent")
# package -> the gpudiag packages it may import (imports inside functions count too)
ALLOWED = {
    "probes": set(),
    "analyzers": {"probes"},
    "text": set(),
    "tui": {"text"},
    "agent": {"probes", "analyzers", "text", "tui"},
}


def imported_packages(path: Path) -> set[str]:
    """The gpudiag packages one module imports, wherever in the module the import is."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "gpudiag" and len(parts) > 1:
                out.add(parts[1])
    return out


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the modules that import it."""
    graph: dict[str, dict[str, list[str]]] = {p: {} for p in PACKAGES}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for dep in imported_packages(path) - {pkg}:
                graph[pkg].setdefault(dep, []).append(str(path.relative_to(ROOT)))
    return graph


def has_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle among the packages, or None."""
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return [*path, n, m]
            if m not in state and (found := visit(m, [*path, n])):
                return found
        state[n] = 2
        return None

    for n in edges:
        if n not in state and (found := visit(n, [])):
            return found
    return None


def test_every_package_imports_only_what_its_layer_allows():
    graph = package_graph()
    wrong = {
        f"{pkg} -> {dep}": mods
        for pkg, deps in graph.items()
        for dep, mods in deps.items()
        if dep in PACKAGES and dep not in ALLOWED[pkg]
    }
    assert not wrong, wrong


def test_no_import_cycle_between_packages():
    graph = package_graph()
    edges = {p: {d for d in deps if d in PACKAGES} for p, deps in graph.items()}
    assert has_cycle(edges) is None


def test_the_cycle_finder_finds_one():
    assert has_cycle({"agent": {"tui"}, "tui": {"agent"}}) == ["agent", "tui", "agent"]
    assert has_cycle({"agent": {"tui"}, "tui": {"text"}, "text": set()}) is None


def module_graph() -> dict[str, set[str]]:
    """gpudiag module -> the gpudiag modules it imports (inside functions too)."""
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("gpudiag", *parts)).removesuffix(".__init__")
            mods[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            deps |= {t for t in targets if t in mods and t != name}
        graph[name] = deps
    return graph


def test_no_import_cycle_between_modules_including_function_level_imports():
    """One module, one idea, and imports that point one way: no cycle anywhere, a lazy import
    inside a function included (package __init__ re-exports aside)."""
    graph = {
        m: {d for d in deps if not m.startswith(d + ".")} for m, deps in module_graph().items()
    }
    assert has_cycle(graph) is None, has_cycle(graph)


def _private_names() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """Private names (one leading underscore) each module defines, and every access to one
    through another object than self/cls or a `from gpudiag... import _name`."""
    defs: dict[str, set[str]] = {}
    uses: list[tuple[str, int, str]] = []
    for pkg in ("agent", "analyzers", "probes", "tui", "text"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            mod = str(path.relative_to(ROOT))
            for n in ast.walk(ast.parse(path.read_text())):
                name = None
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = n.name
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                    name = n.attr
                elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    name = n.id
                if name and name.startswith("_") and not name.startswith("__"):
                    defs.setdefault(name, set()).add(mod)
                if (
                    isinstance(n, ast.Attribute)
                    and n.attr.startswith("_")
                    and not n.attr.startswith("__")
                    and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                ):
                    uses.append((mod, n.lineno, n.attr))
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("gpudiag"):
                    uses += [
                        (mod, n.lineno, a.name)
                        for a in n.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    ]
    return defs, uses


def test_no_module_touches_another_modules_private_state():
    """A private name (attribute, function, class) is used only in the module that defines
    it: a class split across modules becomes an owned object with a public face."""
    defs, uses = _private_names()
    stray = [
        f"{mod}:{line}: {name} (defined in {', '.join(sorted(defs[name]))})"
        for mod, line, name in uses
        if name in defs and mod not in defs[name]
    ]
    assert stray == []


# Inside each package the sub-packages (and top-level modules) stand on floors, lowest first:
# a unit imports only units on lower floors (and itself), never up or sideways. The package's
# own __init__ is its roof and may re-export from any floor.
FLOORS: dict[str, list[set[str]]] = {
    "probes": [
        {"base", "files", "numbers", "spawn", "net"},
        {"inject"},
        {"dist", "servers"},
        {"host"},
        {"gpu"},
        {"stacks"},
        {"box"},
        {"inprocess"},
        {"hooks", "integrations"},
    ],
    "analyzers": [
        {"model"},  # the words: results, catalogue, thresholds
        {"timeline"},
        {"measures"},
        {"stats"},
        {"cost"},
        {"distributed"},
        {"context"},  # the one context every finder reads
        {"findings"},
        {"engine"},  # the roof: analyze(), the registry, finalize
    ],
    "agent": [
        {"base"},  # errors and exit codes, config, safe I/O
        {"output"},
        {"fleet"},
        {"session"},
        {"commands"},
        {"cli"},  # the roof: main(argv), the parser, the command registry
    ],
    "text": [{"formatting", "redact", "trials"}, {"sink"}],
    "tui": [{"wrap"}, {"offloop"}, {"feeds"}, {"widgets"}, {"screens"}, {"app", "top"}],
}


def unit_of(module: str) -> tuple[str, str] | None:
    """(package, unit) of a gpudiag module; None for a package's own __init__ (its roof)."""
    parts = module.split(".")
    return (parts[1], parts[2]) if len(parts) > 2 else None


def floor_violations() -> list[str]:
    """Every import between two units of one package that runs up or sideways."""
    level = {
        (pkg, unit): i for pkg, floors in FLOORS.items() for i, f in enumerate(floors) for unit in f
    }
    wrong = []
    for mod, deps in module_graph().items():
        src = unit_of(mod)
        for dep in deps:
            dst = unit_of(dep)
            if src is None or dst is None or src[0] != dst[0] or src == dst:
                if src is not None and dst is None and dep.split(".")[1] == src[0]:
                    wrong.append(f"{mod} -> {dep} (a package's roof)")
                continue
            if level[dst] >= level[src]:
                wrong.append(f"{mod} -> {dep}")
    return sorted(set(wrong))


def test_every_unit_is_on_a_floor():
    units = {unit_of(m) for m in module_graph()} - {None}
    placed = {(pkg, u) for pkg, floors in FLOORS.items() for f in floors for u in f}
    assert units <= placed, sorted(units - placed)


def test_sub_packages_import_only_downward():
    assert floor_violations() == []


def test_the_floor_check_finds_an_upward_import(monkeypatch):
    real = module_graph()
    planted = {**real, "gpudiag.analyzers.model.results": {"gpudiag.analyzers.engine.analysis"}}
    monkeypatch.setitem(globals(), "module_graph", lambda: planted)
    assert floor_violations() == [
        "gpudiag.analyzers.model.results -> gpudiag.analyzers.engine.analysis"
    ]
