"""No import cycles among a package's modules, counting imports inside functions: a cycle that works only
because one of its imports is lazy breaks at import time the day that import moves to the top. One check for
all six packages (here, where every package is installed), and a made-up package to show it finds one."""

import ast
import importlib
from pathlib import Path

import pytest

PACKAGES = ["titan_models", "titan_parallel", "titan_float8", "titan_checkpoint", "titan_debug", "titan_train"]


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    paths = {}
    for path in root.rglob("*.py"):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in paths.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, package_of=name if path.name == "__init__.py" else name.rpartition(".")[0])
                # `from a import b` runs a/__init__.py, then a.b when b is a module.
                imported.update([base, *(f"{base}.{alias.name}" for alias in node.names)])
        graph[name] = (imported & paths.keys()) - {name}
    return graph


def _absolute(node: ast.ImportFrom, package_of: str) -> str:
    if node.level == 0:
        return node.module
    parts = package_of.split(".")[: len(package_of.split(".")) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    found_from = {start: None}
    todo = [start]
    while todo:
        module = todo.pop()
        for imported in sorted(graph[module]):
            if imported == start:
                chain = [module]
                while found_from[chain[-1]] is not None:
                    chain.append(found_from[chain[-1]])
                return [*reversed(chain), start]
            if imported not in found_from:
                found_from[imported] = module
                todo.append(imported)
    return None


def cycles(graph: dict[str, set[str]]) -> list[str]:
    found = {frozenset(c): " -> ".join(c) for m in sorted(graph) if (c := _cycle_through(graph, m))}
    return sorted(found.values())


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    root = Path(importlib.import_module(package).__file__).parent
    graph = import_graph(root, package)
    assert len(graph) > 3, f"found only {sorted(graph)} under {root}"
    assert not cycles(graph), "import cycles (make each dependency one-way): " + "; ".join(cycles(graph))


def test_a_lazy_import_that_closes_a_cycle_is_found(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from pkg.b import helper\n")
    (tmp_path / "b.py").write_text("def helper():\n    from pkg import a\n")
    (found,) = cycles(import_graph(tmp_path, "pkg"))
    assert sorted(found.split(" -> ")[:2]) == ["pkg.a", "pkg.b"], found
