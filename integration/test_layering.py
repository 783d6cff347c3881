"""Which sub-package may import which, inside titan_train and titan_parallel: imports flow one way, so a
newcomer reads a room without the ones above it, and a dependency that would close a loop between rooms is
caught the day it is written (counting imports inside functions, as the cycle test does).

titan_train: cli -> run, simulate, generate -> config -> data (simulate drives the run, never the reverse).
titan_parallel: model (the apply order) -> one folder per parallelism -> mesh, params, options; the parallelisms
do not import each other, except where one's rule is about another: AC saves ring attention's outputs and auto
AC traces the loss head; SimpleFSDP refuses compiled whole-block checkpoints (ac's rule).
"""

import importlib
from pathlib import Path

import pytest

from test_import_cycles import import_graph

# Room -> the rooms it may import (besides itself). A top-level module is its own room.
ALLOWED = {
    "titan_train": {
        "__main__": {"cli"},
        "cli": {"run", "simulate", "generate", "config", "data"},
        "simulate": {"run", "config", "data"},
        "generate": {"config", "data"},
        "run": {"config", "data"},
        "config": {"data"},
        "data": set(),
    },
    "titan_parallel": {
        "__init__": {"model", "fsdp", "tp", "pp", "cp", "ep", "ac", "loss", "mesh", "params", "options"},
        "model": {"fsdp", "tp", "pp", "cp", "ep", "ac", "loss", "mesh", "params", "options"},
        "fsdp": {"ac", "mesh", "params", "options"},
        "tp": {"mesh", "params", "options"},
        "pp": {"mesh", "params", "options"},
        "cp": {"mesh", "params", "options"},
        "ep": {"mesh", "params", "options"},
        "ac": {"cp", "loss", "mesh", "params", "options"},
        "loss": {"mesh", "params", "options"},
        "mesh": {"options"},
        "params": set(),
        "options": set(),
    },
}
# Top-level modules beside __init__: the entry points only.
ENTRY_POINTS = {"titan_train": {"__init__", "__main__"}, "titan_parallel": {"__init__"}}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layering_violations(graph: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        here = room(module)
        if here == "__init__" and "__init__" not in allowed:
            continue  # the package's __init__ exports from anywhere
        for other in sorted(imported):
            there = room(other)
            if there not in (here, "__init__") and there not in allowed.get(here, set()):
                found.append(f"{module} imports {other} ({here} may import {sorted(allowed.get(here, ())) or 'none'})")
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_sub_packages_import_one_way(package):
    root = Path(importlib.import_module(package).__file__).parent
    graph = import_graph(root, package)
    rooms = {room(m) for m in graph}
    assert rooms - {"__init__"} == set(ALLOWED[package]) - {"__init__"}, "a room without a layering rule"
    assert not layering_violations(graph, ALLOWED[package]), "\n".join(layering_violations(graph, ALLOWED[package]))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_only_entry_points_at_the_top(package):
    root = Path(importlib.import_module(package).__file__).parent
    top = {p.stem for p in root.glob("*.py")}
    assert top <= ENTRY_POINTS[package], (
        f"top-level modules beyond the entry points: {sorted(top - ENTRY_POINTS[package])}"
    )


def test_an_upward_import_is_found(tmp_path):
    for name in ("run", "simulate"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "simulate" / "dry.py").write_text("from pkg.run.trainer import Trainer\n")
    (tmp_path / "run" / "trainer.py").write_text("def f():\n    from pkg.simulate import dry\n")
    graph = import_graph(tmp_path, "pkg")
    found = layering_violations(graph, {"run": set(), "simulate": {"run"}})
    assert found and all(f.startswith("pkg.run.trainer imports pkg.simulate") for f in found), found
