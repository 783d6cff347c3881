"""No import cycles among this package's modules, counting imports inside functions. A cycle that works
only because one of its imports is lazy breaks at import time the day that import moves to the top."""

import ast
from pathlib import Path

import titan_parallel as package

ROOT = Path(package.__file__).parent


def _import_graph() -> dict[str, set[str]]:
    paths = {}
    for path in ROOT.rglob("*.py"):
        parts = [package.__name__, *path.relative_to(ROOT).with_suffix("").parts]
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


def test_no_import_cycles():
    graph = _import_graph()
    assert len(graph) > 5, f"found only {sorted(graph)} under {ROOT}"
    cycles = {frozenset(c): " -> ".join(c) for m in sorted(graph) if (c := _cycle_through(graph, m))}
    assert not cycles, "import cycles (make each dependency one-way): " + "; ".join(sorted(cycles.values()))
