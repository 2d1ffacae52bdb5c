"""No import cycle inside runstate/: the module graph, built from the source with ast, is acyclic.

Two graphs are checked. The module-level graph holds the imports that run when a module is imported
(those under `if TYPE_CHECKING:` never run and are left out). The full graph adds the imports inside
functions and methods, which run on first call: a cycle there does not fail at import time, but it
still ties two modules together, so layering each module above the ones it uses keeps both acyclic.

An edge goes to the module imported (`from runstate.a import b` imports `runstate.a.b` when that is a
module, else `runstate.a`); the package `__init__` files Python also runs on the way down are not edges,
or every package importing its own submodules would count as a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "runstate"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, *, functions: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of `tree` that run: outside TYPE_CHECKING blocks, and outside function bodies
    unless `functions`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]), functions=functions)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not functions:
            continue
        else:
            yield from _imports(node, functions=functions)


def _targets(
    node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]
) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if node.level:  # a relative import: resolve it against the importer's package
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = set()
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        if submodule in modules:
            found.add(submodule)
        elif source in modules:
            found.add(source)
    return found


def import_graph(*, functions: bool) -> dict[str, set[str]]:
    """Each runstate module and the runstate modules it imports."""
    modules = all_modules()
    names = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _imports(tree, functions=functions):
            edges |= _targets(node, name, is_package, names)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep import chain cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_known_imports() -> None:
    # The check is only as good as its graph: a known module-level import and a known function-level one.
    assert "runstate.backends" in import_graph(functions=False)["runstate.config"]
    assert "runstate.config" in import_graph(functions=True)["runstate.wiring"]
    assert "runstate.eventstore.config" in import_graph(functions=True)["runstate.wiring"]
    assert "runstate.eventstore.config" not in import_graph(functions=False)["runstate.wiring"]


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_cycle_among_module_level_imports() -> None:
    assert cycles(import_graph(functions=False)) == []


@pytest.mark.parametrize("functions", [True], ids=["with-function-level-imports"])
def test_no_cycle_with_function_level_imports(functions: bool) -> None:
    assert cycles(import_graph(functions=functions)) == []
