"""titan-train and the tools use titan_debug through its public surface only (`from titan_debug import name`, the
name in titan_debug.__all__), never a module inside it: the predictors the dry run and the planner live on are
public API, and a deep import would tie titan-train to a file layout that titan-debug may change in a patch."""

import ast
import importlib
from pathlib import Path

import titan_debug

ROOT = Path(__file__).resolve().parents[1]


def deep_or_unlisted_imports(root: Path, public: set[str]) -> list[str]:
    """Each import of titan_debug under `root` that reaches inside the package or names what it does not export."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [f"{where}: import {a.name}" for a in node.names if a.name.startswith("titan_debug.")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("titan_debug."):
                    found.append(f"{where}: from {node.module} import ...")
                elif node.module == "titan_debug":
                    found += [
                        f"{where}: {a.name} is not in titan_debug.__all__" for a in node.names if a.name not in public
                    ]
    return found


def test_titan_train_and_the_tools_import_titan_debug_through_its_surface():
    titan_train = Path(importlib.import_module("titan_train").__file__).parent
    found = [
        f for root in (titan_train, ROOT / "tools") for f in deep_or_unlisted_imports(root, set(titan_debug.__all__))
    ]
    assert not found, "import these from titan_debug (and list them in its __all__):\n" + "\n".join(found)


def test_a_deep_import_and_an_unlisted_name_are_found(tmp_path):
    (tmp_path / "a.py").write_text("from titan_debug.step_time import predict\n")
    (tmp_path / "b.py").write_text("def f():\n    from titan_debug import _private\n")
    (tmp_path / "c.py").write_text("from titan_debug import OpTrace\nimport titan_debug\n")
    found = deep_or_unlisted_imports(tmp_path, set(titan_debug.__all__))
    assert [f.split(":")[0] for f in found] == [f"{tmp_path.name}/a.py", f"{tmp_path.name}/b.py"], found
