"""The package's layering: no import cycles, the core never imports a built-in plugin, and no
built-in plugin imports another (what they share lives in the core, open to third parties too).

Imports are read from the source with ``ast``: deferred (function-level) ones and those under
``if TYPE_CHECKING:`` included. A cycle hidden inside a function or behind a type annotation is
still a cycle: the modules cannot be understood, or moved, one without the other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "attrib_bench"
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, package: str | None = None) -> set[str]:
    """Every module (and ``module.name``) the file imports at run time.

    Relative imports are resolved against ``package``, the file's package, when it is given.
    """
    names: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_Import(self, node: ast.Import) -> None:
            names.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            module = node.module
            if node.level:
                if package is None:
                    return
                base = package.rsplit(".", node.level - 1)[0]
                module = f"{base}.{module}" if module else base
            if module:
                names.add(module)
                names.update(f"{module}.{alias.name}" for alias in node.names)

    Visitor().visit(ast.parse(path.read_text()))
    return names


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {other for other in imported_names(path) if other in files and other != name}
        for name, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 20  # the walk saw the package
    assert cycles(graph) == []


def test_the_core_never_imports_a_builtin_plugin():
    offenders = {
        module_name(path): sorted(n for n in imported_names(path) if n.startswith("attrib_bench_"))
        for path in PACKAGE.rglob("*.py")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_no_builtin_plugin_imports_another():
    """Built-ins are plugins like any third party's: shared math comes from ``attrib_bench``.

    The pytest fixture module is no method plugin, so importing it is not counted.
    """
    offenders = {
        path.stem: sorted(
            name
            for name in imported_names(path, package="attrib_bench_plugins")
            if name.startswith("attrib_bench_plugins.") and name.split(".")[1] != "pytest_plugin"
        )
        for path in PLUGINS.glob("*.py")
    }
    assert len(offenders) > 10  # the walk saw the plugins
    assert {name: found for name, found in offenders.items() if found} == {}


def test_importing_the_package_imports_no_plugin_and_no_torch():
    probe = (
        "import sys, attrib_bench; "
        "print(sorted(m for m in sys.modules if m.startswith('attrib_bench_plugins') "
        "or m in ('torch', 'transformers')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


#: The subpackages in the order data flows, each importing only those before it: the public
#: types plugins read (the trace, the loaded model, its adapter) and the plugin machinery, the
#: shared math, data, model loading and capture, results (with the gate's comparison), the
#: runner (with its state and the result it builds), rendering, segment attribution, the
#: conformance kits and pytest helpers, the analyses; then the Python API, the CLI's checks made
#: before the heavy imports (preflight), and the CLI on top.
LAYERS = (
    "core",
    "toolkit",
    "data",
    "model",
    "results",
    "runner",
    "reports",
    "segments",
    "testing",
    "analyses",
    "api",
    "preflight",
    "cli",
    "__main__",
)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Module -> the modules of a later layer it imports (the package root is exempt: it only
    re-exports, lazily)."""
    rank = {name: index for index, name in enumerate(LAYERS)}
    return {
        module: found
        for module, imported in graph.items()
        if layer_of(module) != "__init__"
        and (
            found := sorted(
                other
                for other in imported
                if layer_of(other) != "__init__" and rank[layer_of(other)] > rank[layer_of(module)]
            )
        )
    }


def test_the_layer_checker_finds_an_upward_import():
    graph = {
        "attrib_bench.core.x": {"attrib_bench.runner.engine"},
        "attrib_bench.runner.engine": set(),
    }
    assert upward_imports(graph) == {"attrib_bench.core.x": ["attrib_bench.runner.engine"]}


def test_every_module_sits_in_a_layer_and_imports_only_those_below():
    graph = import_graph()
    assert {layer_of(module) for module in graph} - {"__init__"} == set(LAYERS)
    assert upward_imports(graph) == {}
