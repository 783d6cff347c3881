"""Model code must not import torch.distributed at module level: it runs where distributed is absent
(some builds) and must not pull process-group state into import. Lazy imports inside functions are fine."""

import ast
from pathlib import Path

import titan_models

SOURCES = sorted(Path(titan_models.__file__).parent.rglob("*.py"))


def _module_level_imports(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue  # annotations only
        for child in ast.walk(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                yield child.module


def test_no_module_level_torch_distributed_import():
    assert SOURCES
    offenders = [
        f"{path.name}: {name}"
        for path in SOURCES
        for name in _module_level_imports(ast.parse(path.read_text()))
        if name.startswith("torch.distributed")
    ]
    assert offenders == []
